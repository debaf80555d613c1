"""
The @pct connector, end to end with the local outer connector (``pct_local: True``).

There is no Proxmox VE here: ``tests/bin/pct`` is a stand-in that implements ``pct exec VMID
--keep-env 0 -- ...``, ``pct push``, ``pct pull`` and ``pct status`` on top of lxc-attach against
the real LXC test containers (VMID -> container name through ``PCT_STANDIN_CONTAINERS``). The
tests are named ``..._via_lxc_standin_...`` to say so.

The SSH outer connector (the production path: Proxmox over SSH) is tested with a container
playing the Proxmox host: on LXC's NAT bridge at an address of its own, its sshd listens there,
and the stand-in runs there with VMID 105 meaning that system itself.

Its names, outer connector and command shapes, which need no container:
tests/unit/test_connector_pct_shapes.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import time
from pathlib import Path

import paramiko

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.operations import files, server

from pve_sglang.connectors.container import ContainerNotRunningError

STANDIN_BIN = Path(__file__).parents[1] / "bin"
#: A dpkg-query that says pve-container 6.1.10 (Proxmox VE 9.2's, tests/fixtures/pve/9.2) is
#: installed and asks the real one about anything else: the connector reads the version to
#: choose its ``pct exec`` form (the other releases: tests/unit/test_connector_pct_releases.py).
DPKG_QUERY_9_2 = (
    "#!/bin/sh\ncase \"$*\" in *pve-container*) echo 'installed 6.1.10' ;; "
    "*) exec /usr/bin/dpkg-query \"$@\" ;; esac\n"
)


def make_state(*hosts: tuple[str, dict]) -> State:
    inventory = Inventory((list(hosts), {}))
    state = State(inventory, Config())
    connect_all(state)
    return state


def only_host(state: State):
    (host,) = state.inventory.get_active_hosts()
    return host


def run(host, command: str, **arguments):
    return host.run_shell_command(StringCommand(command), **arguments)


@pytest.fixture
def pct_standin(lxc_container, lxc_env, monkeypatch, tmp_path):
    """Put the stand-in ``pct`` first on PATH; VMID 105 is the session container."""
    mapping = {105: lxc_container.name}

    def map_vmid(vmid: int, container) -> None:
        mapping[vmid] = container.name
        monkeypatch.setenv(
            "PCT_STANDIN_CONTAINERS", " ".join(f"{k}={v}" for k, v in mapping.items())
        )

    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "dpkg-query").write_text(DPKG_QUERY_9_2)
    (fake / "dpkg-query").chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(fake), str(STANDIN_BIN), os.environ["PATH"]]))
    monkeypatch.setenv("PCT_STANDIN_LXC_PATH", str(lxc_env.lxc_path))
    monkeypatch.setenv("PCT_STANDIN_LOG", str(tmp_path / "pct.log"))
    map_vmid(105, lxc_container)
    map_vmid.log = tmp_path / "pct.log"  # type: ignore[attr-defined]
    return map_vmid


# End to end through the stand-in


def test_pct_connector_via_lxc_standin_commands(pct_standin, lxc_container):
    state = make_state(("@pct/localhost/105", {"pct_local": True}))
    host = only_host(state)
    assert host.connector.container_ready() is True

    ok, out = run(host, "echo out; echo err >&2; hostname")
    assert ok
    assert out.stdout_lines == ["out", lxc_container.name]
    assert out.stderr_lines == ["err"]

    assert run(host, "exit 4")[0] is False
    assert run(host, "exit 4", _success_exit_codes=[4])[0] is True
    assert run(host, 'echo "$A"', _env={"A": "1 2 '3'"})[1].stdout == "1 2 '3'"
    assert run(host, "pwd", _chdir="/etc")[1].stdout == "/etc"
    assert run(host, "id -un", _sudo=True, _sudo_user="nobody")[1].stdout == "nobody"
    assert run(host, "cat", _stdin="piped")[1].stdout == "piped"
    # --keep-env 0: the host's environment does not leak in
    assert "PCT_STANDIN" not in run(host, "env")[1].stdout

    calls = pct_standin.log.read_text().splitlines()
    assert calls[0] == "pct status 105"
    assert calls[1].startswith("pct exec 105 --keep-env 0 -- sh -c ")
    disconnect_all(state)


def test_pct_connector_via_lxc_standin_files(pct_standin, tmp_path):
    state = make_state(("@pct/localhost/105", {"pct_local": True}))
    host = only_host(state)

    payload = os.urandom(300 * 1024) + bytes(range(256)) + b"\n\n\x00"
    assert host.put_file(io.BytesIO(payload), "/root/pct blob.bin") is True
    ok, out = run(host, "sha256sum '/root/pct blob.bin' | cut -d' ' -f1")
    assert out.stdout == hashlib.sha256(payload).hexdigest()

    target = tmp_path / "back.bin"
    assert host.get_file("/root/pct blob.bin", str(target)) is True
    assert target.read_bytes() == payload

    calls = pct_standin.log.read_text().splitlines()
    push = next(c for c in calls if c.startswith("pct exec 105 --keep-env 0 -- sh -c umask 077;"))
    pull = next(c for c in calls if c.startswith("pct pull 105 "))
    assert push.endswith(f" sh /root/pct blob.bin {len(payload)}")
    assert pull.startswith("pct pull 105 /root/pct blob.bin ")
    # The host-side temp directories are gone, and no temporary file is left beside the file
    assert not any(Path(p).exists() or Path(p).parent.exists() for p in [pull.split()[-1]])
    assert run(host, "ls -A /root | grep -c upload- || true")[1].stdout == "0"

    # Operations: shell, put, file mode
    source = tmp_path / "motd"
    source.write_text("managed by pyinfra through pct\n")
    add_op(state, server.shell, name="shell", commands=["mkdir -p /srv/pct"])
    put = add_op(state, files.put, name="put", src=str(source), dest="/srv/pct/motd")
    mode = add_op(state, files.file, name="mode", path="/srv/pct/motd", mode="600")
    run_ops(state)
    assert put[host].did_change() and mode[host].did_change()
    ok, out = run(host, "stat -c '%a %U' /srv/pct/motd; cat /srv/pct/motd")
    assert out.stdout_lines == ["600 root", "managed by pyinfra through pct"]
    disconnect_all(state)

    # Second run: converged
    state = make_state(("@pct/localhost/105", {"pct_local": True}))
    host = only_host(state)
    put = add_op(state, files.put, name="put", src=str(source), dest="/srv/pct/motd")
    mode = add_op(state, files.file, name="mode", path="/srv/pct/motd", mode="600")
    run_ops(state)
    assert not put[host].did_change() and not mode[host].did_change()
    disconnect_all(state)


def test_pct_connector_via_lxc_standin_stopped_and_missing(pct_standin, lxc_container_factory):
    (stopped,) = lxc_container_factory(1, start=False)
    pct_standin(106, stopped)

    state = make_state(("@pct/localhost/106", {"pct_local": True}))
    host = only_host(state)
    assert host.connector.container_ready() is False
    with pytest.raises(ContainerNotRunningError, match=r"Proxmox container 106 .*state: stopped"):
        run(host, "true")
    disconnect_all(state)

    state = make_state(("@pct/localhost/199", {"pct_local": True}))
    host = only_host(state)
    assert host.connector.container_ready() is False
    with pytest.raises(ContainerNotRunningError, match=r"Proxmox container 199 .*state: missing"):
        host.get_file("/etc/hostname", io.BytesIO())
    disconnect_all(state)


# Over SSH: a container plays the Proxmox host


def _wait_for_port(address: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex((address, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {address}:{port}")


@pytest.fixture
def ssh_pve_host(lxc_container_factory, tmp_path):
    """
    A container on LXC's bridge with sshd on its address (root, key only) and the pct
    stand-in installed, VMID 105 = the container itself. Returns (container, host data for
    pyinfra's SSH); pyinfra's host name is the container's address.
    """
    (container,) = lxc_container_factory(1, network="bridge")
    address, port = str(container.address.ip), 22
    key = paramiko.RSAKey.generate(2048)
    key_path = tmp_path / "id_rsa"
    key.write_private_key_file(str(key_path))

    container.attach(
        "install -d -m 700 /root/.ssh && cat > /root/.ssh/authorized_keys",
        input=f"{key.get_name()} {key.get_base64()}\n",
    )
    container.attach(
        "cat > /etc/ssh/sshd_config.d/00-test.conf",
        input=(
            f"Port {port}\nListenAddress {address}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        ),
    )
    container.attach("install -m 755 /dev/stdin /usr/local/bin/pct", input=(STANDIN_BIN / "pct").read_bytes())
    container.attach("install -m 755 /dev/stdin /usr/local/bin/dpkg-query", input=DPKG_QUERY_9_2)
    container.attach(
        "cat > /etc/pct-standin.conf",
        input='PCT_STANDIN_CONTAINERS="105=."\nPCT_STANDIN_LOG=/root/pct.log\n',
    )
    container.attach("systemctl start ssh.service")
    _wait_for_port(address, port)

    data = {
        "ssh_port": port,
        "ssh_user": "root",
        "ssh_key": str(key_path),
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
        "ssh_strict_host_key_checking": "no",
        "ssh_known_hosts_file": str(tmp_path / "known_hosts"),
    }
    yield container, data
    container.attach("systemctl stop ssh.service", check=False)


def test_pct_connector_over_ssh_via_lxc_standin(ssh_pve_host, tmp_path):
    container, data = ssh_pve_host
    state = make_state((f"@pct/{container.address.ip}/105", data))
    host = only_host(state)
    assert isinstance(host.connector.outer, SSHConnector)
    assert host.connector.container_ready() is True

    ok, out = run(host, 'hostname; echo "$X"', _env={"X": "over ssh"})
    assert out.stdout_lines == [container.name, "over ssh"]
    assert run(host, "exit 9", _success_exit_codes=[9])[0] is True

    payload = os.urandom(200 * 1024) + bytes(range(256))
    assert host.put_file(io.BytesIO(payload), "/root/ssh blob.bin") is True
    target = tmp_path / "back.bin"
    assert host.get_file("/root/ssh blob.bin", str(target)) is True
    assert target.read_bytes() == payload
    assert container.attach("sha256sum '/root/ssh blob.bin'").stdout.split()[0] == (
        hashlib.sha256(payload).hexdigest()
    )

    source = tmp_path / "conf"
    source.write_text("over ssh\n")
    put = add_op(state, files.put, name="put", src=str(source), dest="/etc/over-ssh.conf", mode="600")
    run_ops(state)
    assert put[host].did_change()
    assert container.attach("stat -c %a /etc/over-ssh.conf").stdout == "600\n"
    disconnect_all(state)

    calls = container.attach("cat /root/pct.log").stdout.splitlines()
    assert any(c.startswith("pct exec 105 --keep-env 0 -- sh -c ") for c in calls)
    assert any(c.startswith("pct exec 105 --keep-env 0 -- sh -c umask 077;") and
               " sh /root/ssh blob.bin " in c for c in calls)
    assert any(c.startswith("pct pull 105 /root/ssh blob.bin /tmp/pyinfra-container-") for c in calls)
    # The host-side temporary directories are gone
    leftover = container.attach("ls -d /tmp/pyinfra-container-* 2>/dev/null || true").stdout
    assert leftover == ""
