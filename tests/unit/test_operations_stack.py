"""Container-phase operations: facts in, commands out (changed and converged cases).

The plain cases (an operation's arguments and facts, the exact commands) are data, one file a
case: operations/MODULE.OPERATION/ beside this file, run by test_operation_cases.py. Here are
those that need more: a log line, a command run for real, a fact's own parse.
"""


import pytest
from pyinfra.api import OperationError
from io import StringIO

from pyinfra.api.util import get_file_sha1

from harness import fact_value, op_commands
from pve_sglang.facts.container import (
    NvidiaUserspaceVersion,
    PathStates,
    SglangServerFlags,
    SglangVenv,
    UnitState,
)
from pve_sglang.facts.verify import JournalTail
from pve_sglang.operations import debs, paths, systemd_unit, venv as venv_ops
from pve_sglang.server.command import KnownFlags

PY = "/opt/sglang/venv/bin/python"
TOOLS = "/opt/sglang"


def path_facts(**states) -> dict:
    """PathStates values: one read per path, as an operation asks for one unwatched path."""
    return {(PathStates, ((path,),)): {path: value} for path, value in states.items()}


def venv(packages=None, patch=None) -> dict:
    """A fact value of SglangVenv for PY and TOOLS."""
    return {(SglangVenv, (PY, TOOLS)): {"packages": packages or {}, "patch": patch}}


# `ls` of /usr/lib/x86_64-linux-gnu after NVIDIA's runfile (file names as it installs them).
LIBS_580 = "libcuda.so\nlibcuda.so.1\nlibcuda.so.580.159.04\n"


def test_libcuda_file_names_give_the_userspace_version():
    assert fact_value(NvidiaUserspaceVersion, LIBS_580) == "580.159.04"
    assert fact_value(NvidiaUserspaceVersion, "") is None


def test_venv_fact_normalises_names_and_reads_the_scripts_output():
    output = ('{"packages": {"sglang": "0.5.9", "flashinfer_python": "0.6.3", "Torch": "2.9.1"}, '
              '"patch": "needs-patch\\n"}')
    value = fact_value(SglangVenv, output)
    assert value["packages"] == {"sglang": "0.5.9", "flashinfer-python": "0.6.3", "torch": "2.9.1"}
    assert value["patch"] == "needs-patch"
    assert fact_value(SglangVenv, "") == {"packages": {}, "patch": None}
    flags = fact_value(SglangServerFlags, "version 0.5.9\n--model-path\n--tp-size\n")
    assert flags == {"--model-path", "--tp-size"} and flags.version == "0.5.9"


def test_install_args_wheelhouse_alone_is_offline_and_with_index_is_not():
    assert venv_ops.install_args(["sglang==0.5.9"], None, None, "/wh", True) == [
        "--find-links", "/wh", "--no-index", "--no-deps", "sglang==0.5.9"]
    assert venv_ops.install_args(["sglang==0.5.9"], "https://mirror.invalid/simple", None, "/wh",
                              False) == ["--find-links", "/wh", "--index-url",
                                         "https://mirror.invalid/simple", "sglang==0.5.9"]


@pytest.mark.parametrize("state, changes", [
    ("needs-patch", True), (None, True), ("already-patched", False), ("upstream-enabled", False),
])
def test_autotune_patch_applied_only_when_needed(state, changes):
    commands = op_commands(venv_ops.autotune_patch, python=PY, tools=TOOLS, facts=venv(patch=state))
    assert bool(commands) is changes
    if changes:
        # The venv's mtime first: a run killed after the patch is a pending restart.
        assert commands[0].startswith(f"touch /opt/sglang/venv && {PY} /opt/sglang/")
        assert "autotune_patch.py --apply " in commands[0]


RESET = "systemctl reset-failed sglang.service"


# `systemctl show` of a unit whose server exits at once, Restart=on-failure, in a Debian 12
# container: between two tries (auto-restart), and after the start limit (failed).
SHOW_LOOPING = "ActiveState=activating\nSubState=auto-restart\nUnitFileState=enabled\nNRestarts=7\nResult=exit-code\n"
SHOW_FAILED = "ActiveState=failed\nSubState=failed\nUnitFileState=enabled\nNRestarts=3\nResult=start-limit-hit\n"
TAIL = ["sglang.service: Main process exited, code=exited, status=1/FAILURE",
        "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu."]


@pytest.mark.parametrize("show, start, expected", [
    (SHOW_LOOPING, True, [RESET, "systemctl restart sglang.service"]),
    (SHOW_FAILED, True, [RESET, "systemctl restart sglang.service"]),
    (SHOW_LOOPING, False, ["systemctl disable sglang.service", RESET, "systemctl stop sglang.service"]),
])
def test_a_failed_or_looping_unit_is_reported_and_started_again(caplog, show, start, expected):
    import logging

    caplog.set_level(logging.WARNING, logger="pyinfra")
    facts = {(UnitState, ("sglang.service",)): fact_value(UnitState, show),
             (JournalTail, ("sglang.service", 15)): TAIL}
    # Restart requested or not, a unit that does not serve is never "running and unchanged".
    assert op_commands(systemd_unit.service_running, unit="sglang.service", start=start,
                       restart=lambda: False, facts=facts) == expected
    restarts = "7 automatic restarts" if "NRestarts=7" in show else "3 automatic restarts"
    assert "sglang.service is not serving" in caplog.text and restarts in caplog.text
    assert "CUDA driver initialization failed" in caplog.text


def test_restart_on_change_false_writes_but_reports_the_restart_pending(caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="pyinfra")
    facts = {(UnitState, ("sglang.service",)): fact_value(UnitState, SHOW_RUNNING)}
    assert op_commands(systemd_unit.service_running, unit="sglang.service", start=True,
                       restart=lambda: True, since=SINCE, facts=facts,
                       restart_on_change=False) == []
    assert "sglang.service restart pending: this run changed what it runs" in caplog.text


def test_unit_state_fact_and_enable_when_disabled():
    state = fact_value(UnitState, "ActiveState=inactive\nUnitFileState=disabled\n")
    assert state == {"active": "inactive", "enabled": "disabled", "stale": False, "started": None,
                     "sub": None, "restarts": None, "result": None}
    assert op_commands(systemd_unit.service_running, unit="sglang.service", start=True,
                       restart=lambda: False, facts={(UnitState, ("sglang.service",)): state}) == [
        "systemctl enable sglang.service", RESET, "systemctl start sglang.service"]


# A restart a killed run never made (restart pending)

# `systemctl --timestamp=us+utc show -p ... sglang.service` in a Debian 12 container (systemd
# 252), the server started at 21:09:32.618391 UTC: 1796245772.618391 on the epoch.
SHOW_RUNNING = """ExecMainStartTimestamp=Wed 2026-12-02 21:09:32.618391 UTC
ActiveState=active
NeedDaemonReload=no
UnitFileState=enabled
ActiveEnterTimestamp=Wed 2026-12-02 21:09:32.684645 UTC
"""
STARTED = 1796245772_618391
SINCE = {"the unit file": "/etc/systemd/system/sglang.service",
         "the environment file": "/etc/sglang/sglang.env",
         "the sglang venv": "/opt/sglang/venv"}


def test_unit_state_reads_the_start_in_microseconds():
    state = fact_value(UnitState, SHOW_RUNNING)
    assert state == {"active": "active", "enabled": "enabled", "stale": False, "started": STARTED,
                     "sub": None, "restarts": None, "result": None}
    # No main process time: the time it became active.
    assert fact_value(UnitState, SHOW_RUNNING.replace(
        "Wed 2026-12-02 21:09:32.618391 UTC", ""))["started"] == 1796245772_684645
    # Never started; and a systemd without --timestamp (whole seconds, local time): unknown.
    assert fact_value(UnitState, "ActiveState=inactive\nExecMainStartTimestamp=\n"
                                 "ActiveEnterTimestamp=\n")["started"] is None
    assert fact_value(UnitState, "ActiveState=active\nExecMainStartTimestamp=Wed 2026-12-02 "
                                 "22:09:32 CET\n")["started"] is None


def test_unit_state_command_falls_back_without_the_timestamp_option():
    command = UnitState().command("sglang.service").get_raw_value()
    assert command.startswith("{ systemctl --timestamp=us+utc show ")
    assert "|| systemctl show -p ActiveState" in command and "ExecMainStartTimestamp" in command


def pending_commands(caplog, **mtimes) -> list[str]:
    """service_running for the recorded running server, the paths of SINCE changed at MTIMES
    (microseconds; a path not given is missing)."""
    import logging

    caplog.set_level(logging.WARNING, logger="pyinfra")
    states = {path: {"type": "file", "mode": "644", "sha1": "0", "mtime": mtimes[name]}
              if name in mtimes else None
              for name, path in (("unit", SINCE["the unit file"]),
                                 ("env", SINCE["the environment file"]),
                                 ("venv", SINCE["the sglang venv"]))}
    facts = {(UnitState, ("sglang.service",)): fact_value(UnitState, SHOW_RUNNING),
             **path_facts(**states)}
    return op_commands(systemd_unit.service_running, unit="sglang.service", start=True,
                       restart=lambda: False, since=SINCE, facts=facts)


def test_unit_changed_after_the_server_started_is_a_pending_restart(caplog):
    # Written 0.2 s after the start (the same second): the killed run never restarted.
    assert pending_commands(caplog, unit=STARTED + 200_000, env=STARTED - 10**9,
                            venv=STARTED - 10**9) == [RESET, "systemctl restart sglang.service"]
    assert ("sglang.service restart pending: the unit file changed after the server started"
            in caplog.text)


def test_venv_and_env_changed_after_the_start_are_named_together(caplog):
    assert pending_commands(caplog, unit=STARTED - 1, env=STARTED + 1,
                            venv=STARTED + 5 * 10**6) == [RESET, "systemctl restart sglang.service"]
    assert "restart pending: the environment file, the sglang venv changed after" in caplog.text


@pytest.mark.parametrize("mtimes", [
    {"unit": STARTED - 1, "env": STARTED - 1, "venv": STARTED - 1},   # written, then restarted
    {"unit": STARTED, "env": STARTED - 10**6, "venv": STARTED - 10**6},  # the same microsecond
    {"unit": None, "env": None, "venv": None},                        # stat without fractions
    {},                                                               # none there
])
def test_server_started_after_every_change_is_not_restarted_again(caplog, mtimes):
    assert pending_commands(caplog, **mtimes) == []
    assert "pending" not in caplog.text


UNIT = "/etc/systemd/system/sglang.service"


def test_unknown_server_flag_stops_before_the_unit_is_written():
    flags = {(SglangServerFlags, (PY, f"{TOOLS}/sglang_flags.py")):
             KnownFlags({"--model-path", "--tp-size"}, "0.5.9")}
    facts = {**flags, **path_facts(**{UNIT: None})}
    assert op_commands(venv_ops.server_flags, python=PY, tools=TOOLS, unit_path=UNIT, unit_text="new",
                       argv=[PY, "-m", "sglang.launch_server", "--tp-size", "8"], facts=facts) == []
    with pytest.raises(OperationError, match="sglang 0.5.9 does not know --tp-sise.*extra_server_args"):
        op_commands(venv_ops.server_flags, python=PY, tools=TOOLS, unit_path=UNIT, unit_text="new",
                    argv=[PY, "--tp-sise", "8"], facts=facts)


ENV = "HF_TOKEN=\"x\"\n"


def test_upload_new_secret_file_is_created_private_before_its_content():
    facts = path_facts(**{"/etc/sglang/sglang.env": None})
    commands = op_commands(paths.put, src=StringIO(ENV), dest="/etc/sglang/sglang.env", mode="600",
                           facts=facts)
    assert commands[0] == "mkdir -p /etc/sglang && install -m 600 /dev/null /etc/sglang/sglang.env"
    assert commands[1][0] == "upload" and commands[1][2] == "/etc/sglang/sglang.env"
    assert commands[2] == "chmod 600 /etc/sglang/sglang.env"


def test_upload_same_content_and_mode_sends_nothing_and_mode_alone_is_fixed():
    digest = {"type": "file", "mode": "600", "sha1": get_file_sha1(StringIO(ENV))}
    assert op_commands(paths.put, src=StringIO(ENV), dest="/e", mode="600",
                       facts=path_facts(**{"/e": digest})) == []
    assert op_commands(paths.put, src=StringIO(ENV), dest="/e", mode="600",
                       facts=path_facts(**{"/e": {**digest, "mode": "644"}})) == ["chmod 600 /e"]
    assert [c if isinstance(c, str) else c[0] for c in
            op_commands(paths.put, src=StringIO(ENV), dest="/e", mode="600",
                        facts=path_facts(**{"/e": {**digest, "sha1": "0" * 40}}))] == [
        "upload", "chmod 600 /e"]


def test_path_states_fact_reads_files_dirs_and_missing_in_one_output():
    a, b = "a" * 40, "b" * 40
    output = (f"/e|file\n/etc/sglang|dir\n/nope|missing\n/a|b|file\n"
              f"600 1796245854.682410\n700 1796245854.5\n644 1796245854\n"
              f"{a}  /e\n\\{b}  /a|b\n")
    assert fact_value(PathStates, output) == {
        "/e": {"type": "file", "mode": "600", "sha1": a, "mtime": 1796245854682410},
        "/etc/sglang": {"type": "dir", "mode": "700", "sha1": None, "mtime": 1796245854500000},
        "/nope": None,
        # A path may hold "|"; sha1sum escapes some names (a backslash first); a stat without
        # fractions gives no mtime.
        "/a|b": {"type": "file", "mode": "644", "sha1": b, "mtime": None},
    }


def test_path_states_fact_refuses_output_that_does_not_add_up():
    # A file removed between the kinds and stat: one stat line short.
    with pytest.raises(OperationError, match="2 paths"):
        fact_value(PathStates, f"/e|file\n/f|file\n600 1.5\n{'a' * 40}  /e\n")


def test_path_states_command_on_this_machine(tmp_path):
    """The fact's shell command, run here for real, gives what process() expects: also for a
    name sha1sum escapes, a name holding "|" and "'", and a link (its own mode, the file's
    hash)."""
    import subprocess
    (tmp_path / "f").write_text("x")
    (tmp_path / "f").chmod(0o640)
    odd = tmp_path / "a|b\\c'd"
    odd.write_text("odd")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    asked = (str(odd), str(tmp_path / "f"), str(tmp_path), str(tmp_path / "nope"),
             str(tmp_path / "link"))
    cmd = PathStates().command(paths=asked).get_raw_value()
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    states = fact_value(PathStates, out)
    assert set(states) == set(asked)
    mtime = (tmp_path / "f").stat().st_mtime_ns // 1000
    assert states[str(tmp_path / "f")] == {"type": "file", "mode": "640",
                                            "sha1": get_file_sha1(str(tmp_path / "f")),
                                            "mtime": mtime}
    assert states[str(odd)]["sha1"] == get_file_sha1(str(odd))
    assert states[str(tmp_path / "link")]["mode"] == "777"
    assert states[str(tmp_path / "link")]["sha1"] == get_file_sha1(str(tmp_path / "f"))
    assert states[str(tmp_path)]["mtime"] == tmp_path.stat().st_mtime_ns // 1000
    assert states[str(tmp_path)]["type"] == "dir" and states[str(tmp_path / "nope")] is None


@pytest.mark.parametrize("name, expected", [
    ("https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
     "cuda-keyring_1.1-1_all.deb", ("cuda-keyring", "1.1-1")),
    ("file:///opt/pvs-repo/cuda-keyring_1.1-1_all.deb", ("cuda-keyring", "1.1-1")),
    ("libfoo2_2.4.1+dfsg-3_amd64.deb", ("libfoo2", "2.4.1+dfsg-3")),
])
def test_deb_file_name(name, expected):
    assert debs.deb_file_name(name) == expected


@pytest.mark.parametrize("name", ["cuda-keyring.deb", "cuda-keyring_1.1-1_all.tar", "a__all.deb",
                                  "a_1_b_all.deb"])
def test_deb_file_name_refuses_other_names(name):
    with pytest.raises(ValueError, match="not a Debian package file name"):
        debs.deb_file_name(name)
