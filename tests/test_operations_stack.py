"""Container-phase operations: facts in, commands out (changed and converged cases)."""

import shlex

import pytest
from pyinfra.api import OperationError
from pyinfra.facts.files import File
from pyinfra.facts.systemd import SystemdStatus

from harness import fact_value, op_commands
from pve_sglang.facts.container import (
    AutotunePatchState,
    NvidiaUserspaceVersion,
    PythonPackages,
    SglangServerFlags,
)
from pve_sglang.operations import stack
from pve_sglang.server_command import KnownFlags

PY = "/opt/sglang/venv/bin/python"
RUNFILE = "/var/cache/pve-sglang/NVIDIA-Linux-x86_64-580.159.04.run"
# `ls` of /usr/lib/x86_64-linux-gnu after NVIDIA's runfile (file names as it installs them).
LIBS_580 = "libcuda.so\nlibcuda.so.1\nlibcuda.so.580.159.04\n"
LIBS_570 = "libcuda.so\nlibcuda.so.1\nlibcuda.so.570.133.20\n"


def test_libcuda_file_names_give_the_userspace_version():
    assert fact_value(NvidiaUserspaceVersion, LIBS_580) == "580.159.04"
    assert fact_value(NvidiaUserspaceVersion, "") is None


@pytest.mark.parametrize("libs, expected", [
    (LIBS_580, []),                                                        # converged
    (LIBS_570, [f"sh {RUNFILE} --no-kernel-modules --silent"]),            # host upgraded
    ("", [f"sh {RUNFILE} --no-kernel-modules --silent"]),                  # first install
])
def test_userspace_driver_follows_the_host_version(libs, expected):
    installed = fact_value(NvidiaUserspaceVersion, libs)
    assert op_commands(stack.userspace_driver, version="580.159.04", runfile=RUNFILE,
                       facts={NvidiaUserspaceVersion: installed}) == expected


def test_python_packages_fact_normalises_names():
    output = '{"sglang": "0.5.9", "flashinfer_python": "0.6.3", "Torch": "2.9.1"}'
    assert fact_value(PythonPackages, output, PY) == {
        "sglang": "0.5.9", "flashinfer-python": "0.6.3", "torch": "2.9.1"}


PINS = {"sglang": "0.5.9", "torch": "2.9.1", "flashinfer-python": "0.6.3"}


def test_venv_packages_converged_sends_nothing():
    installed = {**PINS, "numpy": "2.1.0"}
    assert op_commands(stack.venv_packages, uv="/opt/sglang/tools/bin/uv", python=PY, pins=PINS,
                       args=["sglang==0.5.9"], facts={(PythonPackages, (PY,)): installed}) == []


def test_venv_packages_one_pin_off_reinstalls_the_set():
    installed = {**PINS, "torch": "2.9.0"}
    args = stack.install_args([f"{n}=={v}" for n, v in PINS.items()], index_url=None,
                              extra_index_url="https://example.invalid/whl/cu128",
                              wheelhouse=None, no_deps=False)
    assert op_commands(stack.venv_packages, uv="/opt/sglang/tools/bin/uv", python=PY, pins=PINS,
                       args=args, facts={(PythonPackages, (PY,)): installed}) == [
        f"/opt/sglang/tools/bin/uv pip install --system-certs --python {PY} --extra-index-url "
        "https://example.invalid/whl/cu128 --index-strategy unsafe-best-match sglang==0.5.9 "
        "torch==2.9.1 flashinfer-python==0.6.3"
    ]


def test_install_args_wheelhouse_alone_is_offline_and_with_index_is_not():
    assert stack.install_args(["sglang==0.5.9"], None, None, "/wh", True) == [
        "--find-links", "/wh", "--no-index", "--no-deps", "sglang==0.5.9"]
    assert stack.install_args(["sglang==0.5.9"], "https://mirror.invalid/simple", None, "/wh",
                              False) == ["--find-links", "/wh", "--index-url",
                                         "https://mirror.invalid/simple", "sglang==0.5.9"]


@pytest.mark.parametrize("state, changes", [
    ("needs-patch", True), (None, True), ("already-patched", False), ("upstream-enabled", False),
])
def test_autotune_patch_applied_only_when_needed(state, changes):
    commands = op_commands(stack.autotune_patch, python=PY, script="/opt/sglang/autotune_patch.py",
                           facts={(AutotunePatchState, (PY, "/opt/sglang/autotune_patch.py")): state})
    assert bool(commands) is changes
    if changes:
        assert commands[0].startswith(f"{PY} /opt/sglang/autotune_patch.py --apply ")


def test_autotune_patch_refuses_unrecognised_code_naming_it():
    state = "unrecognised: 0.5.6 /x/sglang/srt/model_executor/model_runner.py"
    with pytest.raises(OperationError, match="unrecognised: 0.5.6 .*model_runner.py"):
        op_commands(stack.autotune_patch, python=PY, script="/s.py",
                    facts={(AutotunePatchState, (PY, "/s.py")): state})


@pytest.mark.parametrize("running, start, restart, expected", [
    (True, True, True, ["systemctl restart sglang.service"]),   # changed: exactly one restart
    (True, True, False, []),                                     # converged: no restart
    (False, True, True, ["systemctl start sglang.service"]),     # down: start, no restart too
    (False, False, True, []),                                    # no GPU: not started
])
def test_service_restarts_only_on_change(running, start, restart, expected):
    assert op_commands(stack.service_running, unit="sglang.service", start=start,
                       restart=lambda: restart,
                       facts={SystemdStatus: {"sglang.service": running}}) == expected


def test_unknown_server_flag_stops_before_the_unit_is_written():
    known = KnownFlags({"--model-path", "--tp-size"}, "0.5.9")
    facts = {(SglangServerFlags, (PY, "/f.py")): known}
    assert op_commands(stack.server_flags, python=PY, script="/f.py",
                       argv=[PY, "-m", "sglang.launch_server", "--tp-size", "8"], facts=facts) == []
    with pytest.raises(OperationError, match="sglang 0.5.9 does not know --tp-sise.*extra_server_args"):
        op_commands(stack.server_flags, python=PY, script="/f.py",
                    argv=[PY, "--tp-sise", "8"], facts=facts)


def test_venv_created_once():
    facts = {(File, ("/opt/sglang/venv/pyvenv.cfg",)): None}
    assert op_commands(stack.venv, uv="/u", path="/opt/sglang/venv", python="/usr/bin/python3",
                       facts=facts) == [
        "UV_PYTHON_DOWNLOADS=never /u venv --python /usr/bin/python3 /opt/sglang/venv"]
    facts = {(File, ("/opt/sglang/venv/pyvenv.cfg",)): {"mode": 644}}
    assert op_commands(stack.venv, uv="/u", path="/opt/sglang/venv", python="/usr/bin/python3",
                       facts=facts) == []


def test_model_downloaded_once_with_the_token_from_the_env_file():
    facts = {(File, ("/models/glm/config.json",)): None}
    [command] = op_commands(stack.model_download, python=PY, repo="zai-org/GLM-5", revision=None,
                            path="/models/glm", env_file="/etc/sglang/sglang.env", facts=facts)
    assert command.startswith("set -a; [ -r /etc/sglang/sglang.env ] && . /etc/sglang/sglang.env")
    python_code = shlex.split(command.split("; set +a; ", 1)[1])[2]
    assert python_code.endswith(
        "snapshot_download(repo_id='zai-org/GLM-5', revision=None, local_dir='/models/glm')")
    assert "HF_TOKEN" not in command
    facts = {(File, ("/models/glm/config.json",)): {"mode": 644}}
    assert op_commands(stack.model_download, python=PY, repo="zai-org/GLM-5", revision=None,
                       path="/models/glm", env_file="/e", facts=facts) == []
