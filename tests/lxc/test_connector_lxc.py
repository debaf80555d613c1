"""
The @lxc connector against real LXC containers (devtools/lxc_env.py), through pyinfra's API the way
the CLI drives it: Inventory, State, connect_all, add_op, run_ops.
"""

from __future__ import annotations

import hashlib
import io
import os

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import InventoryError, PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.operations import files, server, systemd

from pve_sglang.connectors.container import ContainerNotRunningError
from pve_sglang.connectors.lxc import LxcConnector


def make_state(*hosts: tuple[str, dict]) -> State:
    """A connected pyinfra state for ``(inventory name, host data)`` pairs."""
    inventory = Inventory((list(hosts), {}))
    state = State(inventory, Config())
    connect_all(state)
    return state


def container_state(container, **data) -> State:
    return make_state((container.inventory_name, {**container.host_data(), **data}))


def only_host(state: State):
    (host,) = state.inventory.get_active_hosts()
    return host


def run(host, command: str, **arguments):
    return host.run_shell_command(StringCommand(command), **arguments)


# Names and outer connector (no container needed)


def test_lxc_make_names_data():
    assert list(LxcConnector.make_names_data("web")) == [
        ("@lxc/web", {"lxc_name": "web"}, ["@lxc"]),
    ]
    assert list(LxcConnector.make_names_data("gpu1/web")) == [
        ("@lxc/gpu1/web", {"ssh_hostname": "gpu1", "lxc_name": "web"}, ["@lxc"]),
    ]
    for bad in ("", "a/b/c", "/web", "gpu1/"):
        with pytest.raises(InventoryError):
            list(LxcConnector.make_names_data(bad))


def test_lxc_outer_connector_choice():
    inventory = Inventory(
        (
            [
                "@lxc/here",
                "@lxc/localhost/here2",
                ("@lxc/far/there", {"ssh_user": "root"}),
                ("@lxc/there2", {"ssh_hostname": "far2", "lxc_local": True}),
            ],
            {},
        ),
    )
    State(inventory, Config())
    kinds = {h.name: type(h.connector.outer) for h in inventory}
    assert kinds == {
        "@lxc/here": LocalConnector,
        "@lxc/localhost/here2": LocalConnector,
        "@lxc/far/there": SSHConnector,
        "@lxc/there2": LocalConnector,
    }
    assert all(isinstance(h.connector, LxcConnector) for h in inventory)


# Commands


def test_lxc_commands(lxc_container):
    state = container_state(lxc_container)
    host = only_host(state)
    assert host.connector.container_ready() is True

    ok, out = run(host, "echo out; echo err >&2; hostname")
    assert ok
    assert out.stdout_lines == ["out", lxc_container.name]
    assert out.stderr_lines == ["err"]

    ok, out = run(host, "exit 3")
    assert not ok
    ok, out = run(host, "exit 3", _success_exit_codes=[0, 3])
    assert ok

    ok, out = run(host, 'echo "$FOO|$BAR"', _env={"FOO": "it's a value", "BAR": "x y"})
    assert out.stdout == "it's a value|x y"

    ok, out = run(host, "pwd", _chdir="/usr/share")
    assert out.stdout == "/usr/share"

    # Fixed start directory, clean environment with a sane PATH and HOME
    ok, out = run(host, 'pwd; echo "$PATH"; echo "$HOME"; env | grep -c . ')
    assert out.stdout_lines[:3] == [
        "/",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "/root",
    ]
    assert "PYTEST_CURRENT_TEST" not in run(host, "env")[1].stdout

    # Auth arguments apply inside the container
    ok, out = run(host, "id -un", _sudo=True, _sudo_user="nobody")
    assert (ok, out.stdout) == (True, "nobody")
    ok, out = run(host, "id -un", _su_user="nobody", _su_shell="/bin/sh")
    assert (ok, out.stdout) == (True, "nobody")

    # Control arguments go to the outer run
    ok, out = run(host, "cat", _stdin=["line 1", "line 2"])
    assert out.stdout_lines == ["line 1", "line 2"]

    # It really is the container: systemd is PID 1 there
    ok, out = run(host, "cat /proc/1/comm; systemctl is-system-running")
    assert out.stdout_lines[0] == "systemd"
    assert out.stdout_lines[1] in ("running", "degraded")
    disconnect_all(state)


# Files


def test_lxc_upload_download_binary(lxc_container, tmp_path):
    state = container_state(lxc_container)
    host = only_host(state)

    payload = bytes(range(256)) * 64 + os.urandom(512 * 1024) + b"\r\n\x00no newline at end"
    remote = "/root/dir with space/blob.bin"
    assert run(host, "mkdir -p '/root/dir with space'")[0]

    assert host.put_file(io.BytesIO(payload), remote) is True
    ok, out = run(host, f"sha256sum '{remote}' | cut -d' ' -f1; stat -c '%a %U %G' '{remote}'")
    assert out.stdout_lines == [hashlib.sha256(payload).hexdigest(), "644 root root"]

    # From a local file path too, and back into a local path and an IO object
    local = tmp_path / "src.bin"
    local.write_bytes(payload[::-1])
    assert host.put_file(str(local), remote) is True

    downloaded = tmp_path / "down.bin"
    assert host.get_file(remote, str(downloaded)) is True
    assert downloaded.read_bytes() == payload[::-1]

    buffer = io.BytesIO()
    assert host.get_file("/etc/hostname", buffer) is True
    assert buffer.getvalue() == f"{lxc_container.name}\n".encode()

    with pytest.raises(OSError, match="/root/missing"):
        host.get_file("/root/missing", io.BytesIO())
    disconnect_all(state)


def test_lxc_push_cut_short_never_leaves_a_partial_destination(lxc_container, tmp_path):
    """The push of a file is killed (SIGKILL of the host command and what runs in the
    container) with half the bytes in, and its stream ends early: the destination keeps its
    old content, mode and owner each time; the next push replaces it whole, keeping them."""
    import signal
    import subprocess
    import time

    state = container_state(lxc_container)
    host = only_host(state)
    dest = "/root/atomic/secret.env"
    old = b"OLD=1\n"
    lxc_container.attach(f"mkdir -p /root/atomic && printf 'OLD=1\\n' > {dest} && "
                         f"chown nobody:nogroup {dest} && chmod 640 {dest}")
    new = os.urandom(256 * 1024)

    def dest_state() -> list[str]:
        return lxc_container.attach(f"stat -c '%a %U' {dest}; sha1sum < {dest} | cut -c1-40; "
                                    "ls -A /root/atomic").stdout.splitlines()

    before = dest_state()
    assert before == ["640 nobody", hashlib.sha1(old).hexdigest(), "secret.env"]
    # The host side: a FIFO that gets half of the bytes, then is held open (killed) or closed.
    for cut in ("killed", "stream ends early"):
        fifo = tmp_path / f"fifo-{cut.split()[0]}"
        os.mkfifo(fifo)
        command = host.connector.make_push_command(str(fifo), dest).get_raw_value()
        # The size the push must get: the whole file's (`wc -c <` the FIFO would read it).
        command = command.replace(f'"$(wc -c < {fifo} )"', str(len(new)))
        push = subprocess.Popen(["sh", "-c", command], start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with open(fifo, "wb") as writer:
            writer.write(new[: len(new) // 2])
            writer.flush()
            deadline = time.monotonic() + 30
            while True:
                listing = lxc_container.attach("ls -A /root/atomic").stdout.split()
                temps = [name for name in listing if name.startswith(".secret.env.upload-")]
                size = lxc_container.attach(f"cat /root/atomic/{temps[0]} | wc -c").stdout
                if temps and int(size) == len(new) // 2:
                    break
                assert time.monotonic() < deadline, listing
                time.sleep(0.05)
            # Half is in, beside it: the destination is the old file, whole.
            assert dest_state()[:2] == before[:2]
            mode = lxc_container.attach(f"stat -c %a /root/atomic/{temps[0]}").stdout.strip()
            assert mode == "600"  # the new content is never readable by others
            if cut == "killed":
                os.killpg(push.pid, signal.SIGKILL)
                for pid in lxc_container.attach(
                        "pgrep -f 'root/atomic/secret[.]env' || true").stdout.split():
                    lxc_container.attach(f"kill -9 {pid} || true")
        rc = push.wait(timeout=30)
        assert rc != 0
        after = dest_state()
        assert after[:2] == before[:2], (cut, after)
        if cut == "stream ends early":
            assert after[2:] == ["secret.env"]  # the push removed its temporary file
            assert "131072 of 262144 bytes came" in push.stderr.read().decode()

    # A whole push: the new content, the old mode and owner, and no temporary file left
    # (the one the killed push left is removed).
    assert host.put_file(io.BytesIO(new), dest) is True
    assert dest_state() == ["640 nobody", hashlib.sha1(new).hexdigest(), "secret.env"]
    disconnect_all(state)


def test_lxc_operations_shell_put_file_mode(lxc_container, tmp_path):
    state = container_state(lxc_container)
    host = only_host(state)

    source = tmp_path / "tool.sh"
    source.write_bytes(b"#!/bin/sh\necho tool ran\n")

    results = add_op(state, server.shell, name="shell", commands=["echo hello > /root/hello"])
    put = add_op(state, files.put, name="put", src=str(source), dest="/usr/local/bin/tool")
    mode = add_op(state, files.file, name="mode", path="/usr/local/bin/tool", mode="750")
    run_ops(state)

    assert results[host].did_succeed()
    assert put[host].did_change() and mode[host].did_change()
    assert lxc_container.attach("cat /root/hello").stdout == "hello\n"
    assert lxc_container.attach("stat -c %a /usr/local/bin/tool").stdout == "750\n"
    assert lxc_container.attach("tool").stdout == "tool ran\n"
    disconnect_all(state)


UNIT = """\
[Unit]
Description=pve-sglang connector test service

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""


def add_small_deploy(state: State) -> dict:
    """A small deploy: directory, files, mode, a systemd unit enabled and running."""
    ops = {}
    ops["dir"] = add_op(state, files.directory, name="dir", path="/opt/app/conf", mode="755")
    ops["conf"] = add_op(
        state,
        files.put,
        name="conf",
        src=io.StringIO("key = value\n"),
        dest="/opt/app/conf/app.conf",
        mode="640",
    )
    ops["line"] = add_op(
        state, files.line, name="line", path="/etc/issue", line="^pvs-test$", replace="pvs-test"
    )
    ops["unit"] = add_op(
        state,
        files.put,
        name="unit",
        src=io.StringIO(UNIT),
        dest="/etc/systemd/system/pvs-test.service",
    )
    unit_changed = ops["unit"][only_host(state)].did_change
    ops["reload"] = add_op(state, systemd.daemon_reload, name="reload", _if=unit_changed)
    ops["service"] = add_op(
        state,
        systemd.service,
        name="service",
        service="pvs-test.service",
        running=True,
        enabled=True,
    )
    return ops


def test_lxc_small_deploy_is_idempotent(lxc_container_factory):
    (container,) = lxc_container_factory(1)

    state = container_state(container)
    host = only_host(state)
    ops = add_small_deploy(state)
    run_ops(state)
    changed = {name: op[host].did_change() for name, op in ops.items()}
    assert all(op[host].did_succeed() for op in ops.values())
    assert changed == {name: True for name in ops}, changed
    assert container.attach("systemctl is-active pvs-test").stdout == "active\n"
    assert container.attach("cat /opt/app/conf/app.conf").stdout == "key = value\n"
    assert container.attach("stat -c %a /opt/app/conf/app.conf").stdout == "640\n"
    assert "pvs-test" in container.attach("cat /etc/issue").stdout.splitlines()
    disconnect_all(state)

    state = container_state(container)
    host = only_host(state)
    ops = add_small_deploy(state)
    run_ops(state)
    changed = {name: op[host].did_change() for name, op in ops.items()}
    assert all(op[host].did_succeed() for op in ops.values())
    assert not any(changed.values()), changed
    disconnect_all(state)


# Lazy connect and stopped containers


def test_lxc_stopped_container_not_ready_and_clear_error(lxc_container_factory):
    (container,) = lxc_container_factory(1, start=False)

    state = container_state(container)  # connecting does not touch the container
    host = only_host(state)
    assert state.activated_hosts == {host}
    assert host.connector.container_ready() is False
    assert host.connector.container_state() == "stopped"

    with pytest.raises(ContainerNotRunningError, match=container.name) as error:
        run(host, "true")
    assert "not running" in str(error.value)
    with pytest.raises(ContainerNotRunningError, match=container.name):
        host.put_file(io.BytesIO(b"x"), "/root/x")

    # An operation on it fails the host (an OSError, which pyinfra reports per host)
    failing = container_state(container)
    failing_host = only_host(failing)
    add_op(failing, server.shell, name="on stopped", commands=["true"])
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        run_ops(failing)
    assert failing.failed_hosts == {failing_host}
    disconnect_all(failing)

    # Once it runs, the same connector works: readiness is asked again until True
    container.start()
    assert host.connector.container_ready() is True
    assert run(host, "echo up")[1].stdout == "up"

    # A container that stops later is told apart from a failing command
    container.stop()
    with pytest.raises(ContainerNotRunningError, match="state: stopped"):
        run(host, "true")
    disconnect_all(state)


def test_lxc_missing_container(lxc_env):
    state = make_state(("@lxc/pvs-does-not-exist", {"lxc_path": str(lxc_env.lxc_path)}))
    host = only_host(state)
    assert host.connector.container_ready() is False
    with pytest.raises(ContainerNotRunningError, match="pvs-does-not-exist.*state: missing"):
        run(host, "true")
    disconnect_all(state)


def test_lxc_unprivileged_container_files_belong_to_container_root(lxc_container_factory, tmp_path):
    (container,) = lxc_container_factory(1, unprivileged=True)
    state = container_state(container)
    host = only_host(state)

    ok, out = run(host, "id -u; cat /proc/self/uid_map")
    assert out.stdout_lines[0] == "0"
    assert out.stdout_lines[1].split() == ["0", "100000", "65536"]

    payload = os.urandom(64 * 1024) + b"\x00\xff"
    assert host.put_file(io.BytesIO(payload), "/root/unpriv.bin") is True
    ok, out = run(host, "stat -c '%u %g %a' /root/unpriv.bin")
    assert out.stdout == "0 0 644"
    # On the host the file is owned by the mapped id, in the overlay's upper layer
    assert (container.dir / "delta/root/unpriv.bin").stat().st_uid == 100000

    target = tmp_path / "unpriv.bin"
    assert host.get_file("/root/unpriv.bin", str(target)) is True
    assert target.read_bytes() == payload

    put = add_op(state, files.put, name="put", src=io.StringIO("x\n"), dest="/etc/unpriv.conf",
                 mode="600")
    run_ops(state)
    assert put[host].did_change()
    assert container.attach("stat -c '%u %a' /etc/unpriv.conf").stdout == "0 600\n"
    disconnect_all(state)


def test_lxc_env_reset_restores_pristine_rootfs(lxc_container_factory):
    (container,) = lxc_container_factory(1)
    container.attach("echo dirty > /root/marker && rm /etc/issue")
    container.reset()
    assert container.attach("test -e /root/marker", check=False).returncode == 1
    assert container.attach("test -s /etc/issue", check=False).returncode == 0
    assert container.attach("systemctl is-system-running", check=False).stdout.strip() in (
        "running",
        "degraded",
    )
