"""LXC's own bridge is repaired when lxc-net is stale, on this machine's real lxc-net.

lxc-net says it is up by ``/run/lxc/network_up``; when its dnsmasq is gone (a crash, or a
``/run`` kept over a restart of the machine, as on the CI machines), ``lxcbr0`` still exists but
hands out no address and answers no DNS: a container on it boots without a network. The
deploy's ``lxc.bridge`` operation, run through the pyinfra CLI, restarts it; a pid file left
naming another process must not get that process killed by lxc-net's stop.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pve_sglang.facts.lxc_host import LXC_NET_RUN, LxcNetState

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
PID_FILE = Path(LXC_NET_RUN) / "dnsmasq.pid"


def bridge_operation() -> bool:
    """Run the deploy's bridge operation on this machine; whether it changed anything."""
    done = subprocess.run([str(PYINFRA), "-y", "--json", "@local",
                           "pve_sglang.operations.lxc.bridge", "bridge=lxcbr0"], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [result] = json.loads(done.stdout)["results"]["operations"]
    return result["success"] == ["@local"]


def state() -> str:
    fact = LxcNetState()
    done = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True)
    return fact.process(done.stdout.splitlines())


def dns_answers() -> bool:
    try:
        socket.create_connection(("10.0.3.1", 53), 5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def lxc_net(machine_alone):
    if not Path("/usr/libexec/lxc/lxc-net").exists() or not shutil.which("dnsmasq"):
        pytest.skip("needs the lxc package's lxc-net and dnsmasq")
    bridge_operation()
    assert state() == "serving"
    yield
    if state() != "serving":  # leave the machine's lxc-net serving whatever the test did
        bridge_operation()


def kill_dnsmasq() -> None:
    pid = int(PID_FILE.read_text())
    os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return
        time.sleep(0.1)


def test_stale_lxc_net_is_restarted_and_serves_dhcp_and_dns(lxc_net):
    assert not bridge_operation()  # serving: nothing to do
    kill_dnsmasq()
    assert state() == "stale" and not dns_answers()
    assert bridge_operation()
    assert state() == "serving" and dns_answers()
    assert not bridge_operation()


def test_a_pid_file_naming_another_process_kills_nothing(lxc_net):
    """lxc-net's stop sends SIGKILL to the pid in its pid file: once dnsmasq is gone that pid
    can belong to anything, here a process standing in for one that took the number."""
    kill_dnsmasq()
    other = subprocess.Popen(["sleep", "300"])
    try:
        PID_FILE.write_text(f"{other.pid}\n")
        assert state() == "stale"
        assert bridge_operation()
        assert other.poll() is None, "the restart killed the process the stale pid file named"
        assert state() == "serving" and dns_answers()
    finally:
        other.kill()
        other.wait()


def test_lxc_net_state_is_read_from_its_state_file_and_dnsmasq(tmp_path):
    """The fact's answers on a machine where lxc-net never ran."""
    command = LxcNetState().command().replace(LXC_NET_RUN, str(tmp_path))
    run = lambda: LxcNetState().process(subprocess.run(  # noqa: E731
        ["sh", "-c", command], capture_output=True, text=True).stdout.splitlines())
    assert run() == "down"
    (tmp_path / "network_up").touch()
    assert run() == "stale"
    (tmp_path / "dnsmasq.pid").write_text(f"{os.getpid()}\n")  # a python, not a dnsmasq
    assert run() == "stale"
