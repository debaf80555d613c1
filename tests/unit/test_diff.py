"""``--diff`` shows every file change as pyinfra's files.put does, with secrets masked, and the
plan says what will restart and why (issue 10, item 8).

Planned on recorded facts (the H200 machine, public pct outputs) through pyinfra's real API
with ``Config(DIFF=True)``; through the real CLI (``pyinfra ... --dry --diff``) against a real
LXC container on this machine: tests/lxc/test_diff_lxc.py.
"""

from __future__ import annotations

import json
import logging
import re

from pyinfra.api import Config
from pyinfra.facts.files import FileContents

from harness import PATH_STATES_COMMAND, path_states_output, plan_deploy
from pve_sglang.facts.container import UnitState
from pve_sglang.operations.paths import color_diff, mask_secret
from pve_sglang.project import load_defaults
from tasks.container import container_phase
from test_host_phase_recorded import (
    DEVICES_ALL,
    container_answers,
    converged_config,
    gpu_host_responses,
    plan,
)

UNIT = "/etc/systemd/system/sglang.service"
ENV = "/etc/sglang/sglang.env"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
OLD_TOKEN, NEW_TOKEN, NEW_KEY = "hf_old_token_3f9a", "hf_new_token_77c2", "sk-new-key-5e1d"
OLD_UNIT = """[Unit]
Description=SGLang server (an earlier deploy)

[Service]
EnvironmentFile=/etc/sglang/sglang.env
ExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/old
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""
OLD_ENV = f'# Environment of sglang.service\nHF_TOKEN="{OLD_TOKEN}"\n'


def raw(command) -> str:
    """A fact's command as the text the @fake connector matches."""
    return command if isinstance(command, str) else command.get_raw_value()


def text(caplog) -> str:
    return ANSI.sub("", caplog.text)


# The diff itself


def test_masked_diff_shows_a_changed_secret_line_without_its_value():
    old = ["# Environment\n", 'HF_TOKEN="hf_a"\n', 'SGLANG_API_KEY="k"\n']
    new = ["# Environment\n", 'HF_TOKEN="hf_b"\n', 'SGLANG_API_KEY="k"\n']
    lines = [ANSI.sub("", line) for line in color_diff(old, new, secret=True)]
    assert lines == ["@@ -1,3 +1,3 @@", "  # Environment", "- HF_TOKEN=<secret>",
                     "+ HF_TOKEN=<secret>", "  SGLANG_API_KEY=<secret>"]
    assert mask_secret("not an assignment hf_a") == "<secret>"
    assert mask_secret("export HF_TOKEN=x") == "export HF_TOKEN=<secret>"


def test_unmasked_diff_matches_pyinfra_files_put():
    from pyinfra.operations.util.files import generate_color_diff

    old = [f"{i}\n" for i in range(12)]
    new = old[:3] + ["three\n"] + old[4:10] + old[11:] + ["twelve\n"]
    assert list(color_diff(old, new)) == list(generate_color_diff(old, new))
    assert list(color_diff([], new)) == list(generate_color_diff([], new))


def put_with_diff(remote: dict | None, facts: dict, content: str, secret: bool = False):
    """paths.put's commands with --diff on, for a host that answers only FACTS (any other
    fact asked is a KeyError: a read the operation should not have made)."""
    from io import StringIO

    from pyinfra.context import ctx_host, ctx_state

    from harness import _Host
    from pve_sglang.facts.container import PathStates
    from pve_sglang.operations import paths
    from pve_sglang.runtime.pyinfra_private import operation_function

    class Host(_Host):
        def log(self, message, log_func):  # pyinfra's Host.log, which the fake lacks
            log_func(f"[{self.name}] {message}")

    host = Host({PathStates: {ENV: remote}, **facts}, {}, "ct")
    host.state.config.DIFF = True
    with ctx_state.use(host.state), ctx_host.use(host):
        return list(operation_function(paths.put)(src=StringIO(content), dest=ENV, mode="600", secret=secret))


def test_converged_file_with_diff_on_reads_nothing_more(caplog):
    import hashlib

    caplog.set_level(logging.INFO, logger="pyinfra")  # where a diff would be logged
    content = 'HF_TOKEN="x"\n'
    sha1 = hashlib.sha1(content.encode()).hexdigest()
    assert put_with_diff({"type": "file", "mode": "600", "sha1": sha1}, {}, content) == []
    assert "Will" not in caplog.text
    # The same file with other content is diffed (logged where this test looks).
    assert put_with_diff({"type": "file", "mode": "600", "sha1": "0" * 40},
                         {FileContents: ['HF_TOKEN="y"']}, content)
    assert "Will modify" in text(caplog)


def test_changed_secret_file_is_read_once_for_the_diff_and_masked(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    remote = {"type": "file", "mode": "600", "sha1": "0" * 40}
    commands = put_with_diff(remote, {FileContents: OLD_ENV.splitlines()},
                             f'HF_TOKEN="{NEW_TOKEN}"\n', secret=True)
    assert commands  # upload and chmod
    log = text(caplog)
    assert "- HF_TOKEN=<secret>" in log and "+ HF_TOKEN=<secret>" in log
    assert OLD_TOKEN not in log and NEW_TOKEN not in log


# Planned on recorded facts


def container_plan(caplog, diff: bool = True, answers: dict | None = None, **container):
    """The container phase for an existing, running container whose unit and env file are
    an earlier deploy's (ANSWERS: more recorded outputs); returns (ct105's operations, the
    log)."""
    defaults = load_defaults()
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve",
          "hf_token": NEW_TOKEN, "api_key": NEW_KEY, **container}
    responses = {
        **gpu_host_responses(),
        **container_answers(converged_config(DEVICES_ALL), "running"),
        # One read of every managed path (PathStates): the unit and env file exist, changed.
        PATH_STATES_COMMAND: path_states_output({UNIT: ("file", "644", "1" * 40),
                                                 ENV: ("file", "600", "2" * 40)}),
        FileContents().command(path=UNIT).get_raw_value(): OLD_UNIT,
        FileContents().command(path=ENV).get_raw_value(): OLD_ENV,
        raw(UnitState().command("sglang.service")): "ActiveState=active\nUnitFileState=enabled",
        **(answers or {}),
    }
    responses = dict(sorted(responses.items(), key=lambda item: -len(str(item[0]))))
    caplog.set_level(logging.INFO, logger="pyinfra")
    ops = plan_deploy(
        container_phase,
        hosts=[("pve1", {**defaults}), ("ct105", ct)],
        responses=responses,
        groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"]},
        config=Config(DIFF=diff),
    )["ct105"]
    return ops, text(caplog)


def test_plan_with_diff_shows_unit_change_masks_secrets_and_names_restart_reasons(caplog):
    ops, log = container_plan(caplog)
    [upload] = [c for _, cmds in ops for c in cmds if c.startswith(f"upload {UNIT}\n")]
    new_exec = next(line for line in upload.splitlines() if line.startswith("ExecStart="))
    assert f"Will modify {UNIT}" in log
    assert "- ExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server --model-path " \
           "/models/old" in log
    assert f"+ {new_exec}" in log
    assert f"Will modify {ENV}" in log
    assert "- HF_TOKEN=<secret>" in log and "+ HF_TOKEN=<secret>" in log
    assert "+ SGLANG_API_KEY=<secret>" in log
    for secret in (OLD_TOKEN, NEW_TOKEN, NEW_KEY):
        assert secret not in log
    [reason] = [line for line in log.splitlines() if "will restart because" in line]
    assert "sglang.service will restart because: " in reason
    assert "systemd unit sglang.service changes" in reason
    assert f"Server environment {ENV}" in reason


def test_plan_without_diff_shows_no_diff_and_reads_no_file(caplog):
    # The FileContents answers are the only way the plan could know the old content.
    ops, log = container_plan(caplog, diff=False)
    assert "Will modify" not in log and "HF_TOKEN" not in log
    assert "sglang.service will restart because" in log  # the reason shows without --diff too


def model_plan(complete: bool) -> dict:
    """``model_fetch.py plan``'s answer (the container's model_path) as the fetcher prints it."""
    return {"model_fetch.py plan": json.dumps({
        "repo": "org/model", "commit": "c" * 40, "revision": None, "recorded": "c" * 40,
        "hub_commit": "c" * 40, "files": 5, "bytes": 10**9, "dir": "/models/model",
        "missing_files": 0 if complete else 2, "missing_bytes": 0 if complete else 4 * 10**8,
        "partial_bytes": 0, "free_bytes": 10**11, "complete": complete, "settled": complete,
        "gated": False})}


def test_plan_names_a_model_download_as_a_restart_reason(caplog):
    """A model fetched into the container's model_path (a file missing, found by its plan,
    read before any change) restarts the server that loads it: the plan says so; a verified
    model is no reason."""
    _, log = container_plan(caplog, diff=False, answers=model_plan(complete=False),
                            model_download="org/model")
    [reason] = [line for line in log.splitlines() if "will restart because" in line]
    assert "Model org/model in /models/model (verified against the hub) changes" in reason
    assert "model org/model: commit " + "c" * 40 + ": 2 of 5 files to fetch" in log
    caplog.clear()
    _, log = container_plan(caplog, diff=False, answers=model_plan(complete=True),
                            model_download="org/model")
    [reason] = [line for line in log.splitlines() if "will restart because" in line]
    assert "Model org/model" not in reason  # the unit and env file of the old deploy still are


def test_host_plan_names_the_config_op_that_reboots_the_container(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    two_gpus = ["/dev/nvidia1,mode=0666", *DEVICES_ALL]
    plan({**gpu_host_responses(), **container_answers(converged_config(two_gpus), "running")})
    [reason] = [line for line in text(caplog).splitlines() if "will restart because" in line]
    assert "container 105 (pct reboot) will restart because: Container 105 GPU 0 = " \
        "/dev/nvidia0 (devN: dev0 " \
           "removed: applied at a restart) changes" in reason


def test_host_plan_raw_config_diff_from_content_already_read(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    conf = converged_config([]) + "lxc.cgroup2.devices.allow: c 10:200 rwm\n"
    path = "/etc/pve/lxc/105.conf"
    defaults = load_defaults()
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve",
          "hostname": "glm5", "cores": 64, "memory_mib": 524288}
    responses = {**gpu_host_responses("installed 4.4-6"),
                 **container_answers(converged_config([]), "running"),
                 FileContents().command(path=path).get_raw_value(): conf}
    responses = dict(sorted(responses.items(), key=lambda item: -len(str(item[0]))))
    from tasks.host import host_phase

    plan_deploy(host_phase, hosts=[("pve1", {**defaults, "containers": ["@fake/ct105"]}),
                                   ("ct105", ct)],
                responses=responses, groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"]},
                config=Config(DIFF=True))
    log = text(caplog)
    assert f"Will modify {path}" in log
    assert "  lxc.cgroup2.devices.allow: c 10:200 rwm" in log  # context: the user's line stays
    assert "+ lxc.cgroup2.devices.allow: c 195:0 rwm" in log
    assert log.count(f"Will modify {path}") == 1
