"""Container-phase operations: facts in, commands out (changed and converged cases)."""

import shlex

import pytest
from pyinfra.api import OperationError
from io import StringIO

from pyinfra.api.util import get_file_sha1
from pyinfra.facts.files import File

from harness import fact_value, op_commands
from pve_sglang.facts.container import (
    FileDigest,
    NvidiaUserspaceVersion,
    SglangVenv,
    UnitState,
    UvVersion,
)
from pve_sglang.operations import stack, upload
from pve_sglang.server_command import KnownFlags

PY = "/opt/sglang/venv/bin/python"
TOOLS = "/opt/sglang"


def venv(packages=None, patch=None, flags=None) -> dict:
    """A fact value of SglangVenv for PY and TOOLS."""
    return {(SglangVenv, (PY, TOOLS)): {"packages": packages or {}, "patch": patch, "flags": flags}}
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


def test_venv_fact_normalises_names_and_reads_the_scripts_output():
    output = ('{"packages": {"sglang": "0.5.9", "flashinfer_python": "0.6.3", "Torch": "2.9.1"}, '
              '"patch": "needs-patch\\n", "flags": "version 0.5.9\\n--model-path\\n--tp-size\\n"}')
    value = fact_value(SglangVenv, output)
    assert value["packages"] == {"sglang": "0.5.9", "flashinfer-python": "0.6.3", "torch": "2.9.1"}
    assert value["patch"] == "needs-patch"
    assert value["flags"] == {"--model-path", "--tp-size"} and value["flags"].version == "0.5.9"
    assert fact_value(SglangVenv, "") == {"packages": {}, "patch": None, "flags": None}


PINS = {"sglang": "0.5.9", "torch": "2.9.1", "flashinfer-python": "0.6.3"}


def test_venv_packages_converged_sends_nothing():
    installed = {**PINS, "numpy": "2.1.0"}
    assert op_commands(stack.venv_packages, uv="/opt/sglang/tools/bin/uv", python=PY, tools=TOOLS,
                       pins=PINS, args=["sglang==0.5.9"], facts=venv(installed)) == []


def test_venv_packages_one_pin_off_reinstalls_the_set():
    installed = {**PINS, "torch": "2.9.0"}
    args = stack.install_args([f"{n}=={v}" for n, v in PINS.items()], index_url=None,
                              extra_index_url="https://example.invalid/whl/cu128",
                              wheelhouse=None, no_deps=False)
    assert op_commands(stack.venv_packages, uv="/opt/sglang/tools/bin/uv", python=PY, tools=TOOLS,
                       pins=PINS, args=args, facts=venv(installed)) == [
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
    commands = op_commands(stack.autotune_patch, python=PY, tools=TOOLS, facts=venv(patch=state))
    assert bool(commands) is changes
    if changes:
        assert commands[0].startswith(f"{PY} /opt/sglang/autotune_patch.py --apply ")


def test_autotune_patch_refuses_unrecognised_code_naming_it():
    state = "unrecognised: 0.5.6 /x/sglang/srt/model_executor/model_runner.py"
    with pytest.raises(OperationError, match="unrecognised: 0.5.6 .*model_runner.py"):
        op_commands(stack.autotune_patch, python=PY, tools=TOOLS, facts=venv(patch=state))


@pytest.mark.parametrize("active, start, restart, expected", [
    ("active", True, True, ["systemctl restart sglang.service"]),   # changed: one restart
    ("active", True, False, []),                                     # converged: no restart
    ("inactive", True, True, ["systemctl start sglang.service"]),    # down: start, no restart
    ("failed", False, True, []),                                     # no GPU: not started
])
def test_service_restarts_only_on_change(active, start, restart, expected):
    facts = {(UnitState, ("sglang.service",)): {"active": active, "enabled": "enabled"}}
    assert op_commands(stack.service_running, unit="sglang.service", start=start,
                       restart=lambda: restart, facts=facts) == expected


def test_unit_state_fact_and_enable_when_disabled():
    state = fact_value(UnitState, "ActiveState=inactive\nUnitFileState=disabled\n")
    assert state == {"active": "inactive", "enabled": "disabled"}
    assert op_commands(stack.service_running, unit="sglang.service", start=True,
                       restart=lambda: False, facts={(UnitState, ("sglang.service",)): state}) == [
        "systemctl enable sglang.service", "systemctl start sglang.service"]


def test_unknown_server_flag_stops_before_the_unit_is_written():
    facts = venv(flags=KnownFlags({"--model-path", "--tp-size"}, "0.5.9"))
    assert op_commands(stack.server_flags, python=PY, tools=TOOLS,
                       argv=[PY, "-m", "sglang.launch_server", "--tp-size", "8"], facts=facts) == []
    with pytest.raises(OperationError, match="sglang 0.5.9 does not know --tp-sise.*extra_server_args"):
        op_commands(stack.server_flags, python=PY, tools=TOOLS,
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


@pytest.mark.parametrize("uv, expected", [
    ("uv 0.13.8", []),
    ("uv 0.9.0", ["[ -x /opt/sglang/tools/bin/pip ] || python3 -m venv /opt/sglang/tools",
                  "/opt/sglang/tools/bin/pip install uv==0.13.8"]),
    ("", ["[ -x /opt/sglang/tools/bin/pip ] || python3 -m venv /opt/sglang/tools",
          "/opt/sglang/tools/bin/pip install uv==0.13.8"]),
])
def test_tools_venv_reads_uv_version_once(uv, expected):
    facts = {(UvVersion, ("/opt/sglang/tools/bin/uv",)): fact_value(UvVersion, uv)}
    assert op_commands(stack.tools_venv, path="/opt/sglang/tools", uv_version="0.13.8",
                       facts=facts) == expected


ENV = "HF_TOKEN=\"x\"\n"


def test_upload_new_secret_file_is_created_private_before_its_content():
    facts = {(FileDigest, ("/etc/sglang/sglang.env",)): None}
    commands = op_commands(upload.put, src=StringIO(ENV), dest="/etc/sglang/sglang.env", mode="600",
                           facts=facts)
    assert commands[0] == "mkdir -p /etc/sglang && install -m 600 /dev/null /etc/sglang/sglang.env"
    assert commands[1][0] == "upload" and commands[1][2] == "/etc/sglang/sglang.env"
    assert commands[2] == "chmod 600 /etc/sglang/sglang.env"


def test_upload_same_content_and_mode_sends_nothing_and_mode_alone_is_fixed():
    digest = {"mode": "600", "sha1": get_file_sha1(StringIO(ENV))}
    facts = {(FileDigest, ("/e",)): digest}
    assert op_commands(upload.put, src=StringIO(ENV), dest="/e", mode="600", facts=facts) == []
    facts = {(FileDigest, ("/e",)): {**digest, "mode": "644"}}
    assert op_commands(upload.put, src=StringIO(ENV), dest="/e", mode="600", facts=facts) == [
        "chmod 600 /e"]
    facts = {(FileDigest, ("/e",)): {**digest, "sha1": "0" * 40}}
    assert [c if isinstance(c, str) else c[0] for c in
            op_commands(upload.put, src=StringIO(ENV), dest="/e", mode="600", facts=facts)] == [
        "upload", "chmod 600 /e"]


def test_file_digest_fact_reads_mode_and_sha1():
    assert fact_value(FileDigest, "600\nabc123  /e\n") == {"mode": "600", "sha1": "abc123"}
    assert fact_value(FileDigest, "") is None
