"""The suite's containers cannot reach this machine's containers, whatever runs here.

LXC's command socket of a container is an abstract UNIX socket named after its LXC path and
name (``@/var/lib/lxc/pve-sglang-demo/command``); abstract sockets belong to a network
namespace. A test container in this machine's network namespace would reach, with any LXC tool
inside it, this machine's container of the name it looks for: ``make deploy`` inside one (as
tests/lxc/test_fresh_machine.py runs it) read a running ``pve-sglang-demo`` of this machine as its
own. Each test container has a network namespace of its own (devtools/lxc_env.py).

Shown beside running namesakes of the deploy's containers (``deploy_namesakes``): their command
sockets are in this machine's list (``/proc/net/unix``), and inside a test container of each
network kind they are in no list and a connection to them is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import lxc_env

# Connects to the abstract socket named by argv[1]; prints what came of it (and sends nothing).
PROBE = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\\0" + sys.argv[1])
    print("connected")
except OSError as error:
    print(type(error).__name__)
"""


def command_socket(lxc_path: Path, name: str) -> str:
    return f"{lxc_path}/{name}/command"


def abstract_sockets(proc_net_unix: str) -> set[str]:
    """The abstract socket names (without the ``@``) of a ``/proc/net/unix`` text."""
    names = set()
    for line in proc_net_unix.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and fields[7].startswith("@"):
            names.add(fields[7][1:])
    return names


@pytest.mark.parametrize("network", lxc_env.NETWORKS)
def test_a_test_container_cannot_reach_the_deploys_namesakes(lxc_container_factory,
                                                             deploy_namesakes, network):
    if not deploy_namesakes:
        pytest.skip("the deploy's container here does not run (left as it is): nothing to test "
                    "beside")
    here = abstract_sockets(Path("/proc/net/unix").read_text())
    (box,) = lxc_container_factory(network=network)
    inside = abstract_sockets(box.attach(["cat", "/proc/net/unix"]).stdout)
    for lxc_path, name in deploy_namesakes:
        sock = command_socket(lxc_path, name)
        assert sock in here, f"the namesake {name} runs, yet its socket is not listed here"
        assert sock not in inside, f"{network}: {sock} is seen inside {box.name}"
        reached = box.attach(["python3", "-c", PROBE, sock]).stdout.strip()
        assert reached == "ConnectionRefusedError", f"{network}: {sock}: {reached}"
