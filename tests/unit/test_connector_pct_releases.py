"""
The @pct connector on every Proxmox VE release, against the stand-in ``tests/bin/pct`` playing
that release's ``pct exec``: it accepts exactly the options that release's
``src/PVE/CLI/pct.pm`` declares (``tests/fixtures/pve/RELEASE/pct_exec_options.txt``: none
before pve-container 5.0.9, ``--keep-env`` from it) and refuses any other as pct's option
parser does. The host's pve-container version comes from a ``dpkg-query`` that prints the
release's ``PveContainerVersion`` answer (reconstructed in the recorded format, see
tests/fixtures/pve/README.md), so the tests are named ``..._recorded_format``.

No container is needed: VMID 105 maps to "." (the stand-in runs the command on this machine,
with lxc-attach's environment rules: ``--clear-env`` keeps PATH only, otherwise the caller's
environment goes in, as pct before 5.0.9 lets it).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.connect import connect_all, disconnect_all

from fixtures.factutil import fixture, text
from pve_sglang.connectors.container import CONTAINER_PATH
from pve_sglang.pve_releases import RELEASES, has_keep_env

STANDIN_BIN = Path(__file__).parents[1] / "bin"
RELEASE_NAMES = [r.name for r in RELEASES]


def exec_options(release: str) -> str:
    return " ".join(text("pve", release, "pct_exec_options.txt").split())


@pytest.fixture
def pve_host(tmp_path, monkeypatch):
    """This machine as a Proxmox host of a release: ``play(release)`` puts a ``dpkg-query``
    answering that release's pve-container version and the stand-in ``pct`` with that
    release's ``pct exec`` options first on PATH. Returns the pct call log."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "pct.log"
    queries = tmp_path / "dpkg-query.log"

    def play(release: str, version_answer: str | None = None) -> Path:
        answer = fake / "answer.txt"
        answer.write_text(version_answer if version_answer is not None
                          else text("pve", release, "dpkg_query_pve_container.txt"))
        script = fake / "dpkg-query"
        script.write_text(f"#!/bin/sh\necho call >> '{queries}'\n"
                          f"[ \"$*\" = \"-W -f \\${{db:Status-Status}} \\${{Version}}\\n pve-container\" ] "
                          f"|| exit 64\ncat '{answer}'\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", os.pathsep.join([str(fake), str(STANDIN_BIN), os.environ["PATH"]]))
        monkeypatch.setenv("PCT_STANDIN_CONTAINERS", "105=.")
        monkeypatch.setenv("PCT_STANDIN_CONF", str(tmp_path / "no-conf"))
        monkeypatch.setenv("PCT_STANDIN_LOG", str(log))
        monkeypatch.setenv("PCT_STANDIN_EXEC_OPTIONS", exec_options(release))
        # Something of the host's environment that must not reach the container's commands.
        monkeypatch.setenv("PVE_HOST_SECRET", "from-the-host")
        return log

    play.queries = queries  # type: ignore[attr-defined]
    return play


def connect(data: dict | None = None):
    state = State(Inventory(([("@pct/localhost/105", {"pct_local": True, **(data or {})})], {})), Config())
    connect_all(state)
    (host,) = state.inventory.get_active_hosts()
    return state, host


def run(host, command: str, **arguments):
    return host.run_shell_command(StringCommand(command), **arguments)


@pytest.mark.parametrize("release", RELEASE_NAMES)
def test_connector_runs_on_each_release_pct_exec_recorded_format(pve_host, release, tmp_path):
    log = pve_host(release)
    state, host = connect()
    ok, out = run(host, "env")
    assert ok, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout_lines if "=" in line)
    # A clean environment on every release: the host's variables stay out, PATH is fixed.
    assert "PVE_HOST_SECRET" not in env and "PCT_STANDIN_LOG" not in env
    assert env["PATH"] == CONTAINER_PATH
    assert run(host, 'echo "$A"', _env={"A": "1 '2' $(x)"})[1].stdout == "1 '2' $(x)"
    assert run(host, "pwd", _chdir="/etc")[1].stdout == "/etc"
    assert run(host, "exit 3", _success_exit_codes=[3])[0] is True

    payload = os.urandom(4096) + b"\n'\"$(touch x)\n"
    target = tmp_path / "in container" / "blob"
    target.parent.mkdir()
    assert host.put_file(io.BytesIO(payload), str(target)) is True
    assert target.read_bytes() == payload
    back = io.BytesIO()
    assert host.get_file(str(target), back) is True
    assert back.getvalue() == payload
    disconnect_all(state)

    execs = [c for c in log.read_text().splitlines() if c.startswith("pct exec")]
    assert execs
    if has_keep_env(text("pve", release, "dpkg_query_pve_container.txt").split()[1]):
        assert exec_options(release) == "keep-env"
        assert all(c.startswith("pct exec 105 --keep-env 0 -- ") for c in execs)
    else:
        assert exec_options(release) == ""
        assert all(c.startswith(f"pct exec 105 -- env -i PATH={CONTAINER_PATH} container=lxc ")
                   for c in execs)
    # The version is read once per connection.
    assert len(pve_host.queries.read_text().splitlines()) == 1


@pytest.mark.parametrize("release", ["7.4", "8.0", "8.1"])
def test_keep_env_refused_by_releases_before_5_0_9_recorded_format(pve_host, release):
    """What the connector did before on these releases: ``--keep-env 0`` always. Their pct
    refuses the option, so every command into the container failed."""
    pve_host(release)
    state, host = connect({"pct_pve_container": "5.0.9"})
    ok, out = run(host, "true")
    assert not ok
    assert "Unknown option: keep-env" in out.stderr
    disconnect_all(state)


@pytest.mark.parametrize("release", ["7.4", "9.2"])
def test_unknown_version_takes_the_form_every_release_runs_recorded_format(pve_host, release):
    """dpkg-query answers nothing (no pve-container package it can see): ``env -i`` inside,
    which runs on the oldest and the newest pct alike."""
    log = pve_host(release, version_answer="")
    state, host = connect()
    ok, out = run(host, "env")
    assert ok, out.stderr
    assert "PVE_HOST_SECRET" not in out.stdout
    disconnect_all(state)
    assert " -- env -i PATH=" in log.read_text()


def test_standin_refuses_an_option_a_release_lacks():
    """The stand-in itself: 9.2's pct exec takes --keep-env, never an option it does not
    declare; 8.1's takes none."""
    import subprocess

    env = {**os.environ, "PATH": f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}",
           "PCT_STANDIN_CONTAINERS": "105=.", "PCT_STANDIN_CONF": "/nonexistent"}
    for options, args, refused in [
        ("keep-env", ["--keep-env", "0"], False),
        ("keep-env", ["--keep-env=0"], False),
        ("keep-env", ["--clear-env"], True),
        ("", ["--keep-env", "0"], True),
        ("", [], False),
    ]:
        done = subprocess.run(["pct", "exec", "105", *args, "--", "true"], capture_output=True,
                              text=True, env={**env, "PCT_STANDIN_EXEC_OPTIONS": options})
        assert (done.returncode == 255) is refused, (options, args, done.stderr)
        assert ("Unknown option" in done.stderr) is refused
    assert fixture("pve", "9.2", "pct_exec_options.txt")


def test_a_version_the_rules_cannot_compare_takes_the_form_every_release_runs_recorded_format(
        pve_host, caplog):
    """dpkg-query answers a version no rule can compare: said, naming the host and the
    command, and the form every release runs is taken (was a bare ValueError from the rules
    at the first command: "An internal exception occurred")."""
    log = pve_host("9.2", version_answer="installed 6.1.x\n")
    state, host = connect()
    ok, out = run(host, "true")
    assert ok, out.stderr
    disconnect_all(state)
    assert " -- env -i PATH=" in log.read_text()
    assert ("`dpkg-query -W -f '${db:Status-Status} ${Version}\\n' pve-container 2>/dev/null "
            "|| true` answered pve-container version '6.1.x': not a pve-container version") in caplog.text


def test_a_two_line_version_answer_takes_the_form_every_release_runs_recorded_format(pve_host, caplog):
    """dpkg-query answers two lines (was: the first won, so their order decided --keep-env):
    said, naming the host and the command, and the form every release runs is taken."""
    log = pve_host("9.2", version_answer="installed 6.1.10\ninstalled 5.0.8\n")
    state, host = connect()
    ok, out = run(host, "true")
    assert ok, out.stderr
    disconnect_all(state)
    assert " -- env -i PATH=" in log.read_text()
    assert ("pve-container 2>/dev/null || true` answered pve-container version 'installed 6.1.10 | "
            "installed 5.0.8': 2 lines where one is expected: ambiguous") in caplog.text


def test_a_pct_pve_container_the_rules_cannot_compare_is_refused_before_connecting():
    """``pct_pve_container`` given to a target named on the command line (no hosts file to
    check it): refused when the inventory is built, as the hosts file refuses it, not a bare
    ValueError from the rules at the first command."""
    from pyinfra.api.exceptions import ConnectorDataTypeError

    with pytest.raises(ConnectorDataTypeError, match=(
            r"^@pct/localhost/105: field 'pct_pve_container' = 'abc': not a pve-container "
            r"version; allowed: .*'4\.4-3'")):
        connect({"pct_pve_container": "abc"})


def test_pct_pve_container_with_data_on_a_direct_pct_run_is_a_clear_error(pyinfra_cli):
    """`pyinfra @pct/HOST/VMID ... --data pct_pve_container=abc` through the real CLI: the
    field, the value and what is allowed, no traceback (was "An internal exception
    occurred" and a ValueError from pve_releases)."""
    done = pyinfra_cli("-y", "--data", "pct_pve_container=abc", "--data", "pct_local=true",
                       "@pct/localhost/105", "exec", "--", "true")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert ("@pct/localhost/105: field 'pct_pve_container' = 'abc': not a pve-container version; "
            "allowed: a version as dpkg prints it") in output
    assert "internal exception" not in output and "Traceback" not in output
