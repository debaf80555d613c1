"""The verify phase's startup watch and generation check against a real server process under
the deploy's own unit in a real LXC container (systemd, journald), through pyinfra's CLI.

The server is ``tests/standin_sglang.py``: it replays real SGLang log lines (fixtures/sglang_logs)
to the journal with short pauses and serves /health and /v1/chat/completions; only the unit's
ExecStart is replaced (a drop-in), as in test_deploy_lxc. Each case must reach its verdict within
seconds of its event (the crash, the start of the silence, the bad answer), not at a timeout;
the measured delays are printed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pve_sglang.server.command import server_argv, venv_python
from pve_sglang.server.unit_text import env_file_path, render_env, render_unit, unit_name, unit_path
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
LOGS = REPO / "tests" / "fixtures" / "sglang_logs"
STANDIN = "/opt/standin"
EVENT = "/run/standin-event"
PORT = 39000 + os.getpid() % 900
API_KEY = "sk-standin-secret-Qx7"
STALL_S = 3
SETTINGS = {"api_key": API_KEY, "server_port": PORT, "startup_stall_s": STALL_S,
            "health_timeout_s": 300, "model_path": "/models/standin"}
DELAYS: dict[str, float] = {}


def settings() -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**data, **SETTINGS})


def put(box, path: str, text: str, mode: str = "644") -> None:
    box.attach(f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)} && "
               f"chmod {mode} {shlex.quote(path)}", input=text)


@pytest.fixture(scope="module")
def box(lxc_env):
    """A container with the deploy's env file and unit, and the stand-in server."""
    container = lxc_env.create(lxc_env.new_name("watch"))
    s = settings()
    put(container, env_file_path(s), render_env(s), mode="600")
    put(container, unit_path(s), render_unit(s, server_argv(s, 1, [], None, 1, None, venv_python(s))))
    put(container, f"{STANDIN}/standin_sglang.py", (REPO / "tests" / "standin_sglang.py").read_text())
    for log in LOGS.glob("*.log"):
        put(container, f"{STANDIN}/logs/{log.name}", log.read_text())
    container.attach(f"mkdir -p {s.sglang_cache_dir}")
    yield container
    container.destroy()


def run_case(box, case: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """The stand-in's CASE under the unit, and the test deploy: (its result, when the event
    happened, when the deploy ended; wall-clock seconds)."""
    s = settings()
    unit = unit_name(s)
    dropin = ("[Service]\nExecStart=\nExecStart=/usr/bin/python3 " + f"{STANDIN}/standin_sglang.py "
              f"--logs {STANDIN}/logs --port {PORT} --case {case} --event-file {EVENT}\n")
    box.attach(f"systemctl stop {unit}; rm -f {EVENT}", check=False)
    put(box, f"/etc/systemd/system/{unit}.d/standin.conf", dropin)
    box.attach("systemctl daemon-reload")
    inventory = box.dir / "inventory.py"
    inventory.write_text(f"hosts = [({box.inventory_name!r}, {{**{box.host_data()!r}, "
                         f"'settings': {SETTINGS!r}}})]\n")
    done = subprocess.run([str(PYINFRA), str(inventory), "tests/deploys/server_checks.py", "-y"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    ended = time.time()
    event = box.attach(f"cat {EVENT}", check=False).stdout.strip()
    box.attach(f"systemctl stop {unit}", check=False)
    return done, float(event) if event else float("nan"), ended


def verdict(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


def test_normal_start_reports_phases_and_a_good_completion(box):
    done, _, _ = run_case(box, "normal")
    log = verdict(done)
    assert done.returncode == 0, log[-4000:]
    for seen in ("sglang.service: init (at", "weights: 81/145 shards (56%), 2.70it/s, ETA 23s",
                 "KV cache: 2,795,207 tokens, 106.62 GB per GPU", "autotune finished",
                 "sglang.service: ready after", "sglang.service ready in",
                 "chat completion of standin-model", "tok/s single stream"):
        assert seen in log, f"{seen!r} not in:\n{log[-4000:]}"
    assert API_KEY not in log


def test_crash_during_load_fails_at_once_with_the_journal_tail(box):
    done, event, ended = run_case(box, "crash-load")
    log = verdict(done)
    assert done.returncode != 0
    assert "sglang.service stopped running" in log and "during weights" in log, log[-4000:]
    assert "HeaderTooLarge" in log and "no known cause matched" in log
    DELAYS["crash during load"] = ended - event
    assert ended - event < 15, ended - event


def test_stall_during_autotune_is_called_stuck_with_the_sm120_hint(box):
    done, event, ended = run_case(box, "stall-autotune")
    log = verdict(done)
    assert done.returncode != 0
    assert "sglang.service is stuck: no log line for" in log and "during autotune" in log, log[-4000:]
    assert "hint (sm120-autotune)" in log
    DELAYS["stall during autotune (beyond startup_stall_s)"] = ended - event - STALL_S
    assert STALL_S <= ended - event < STALL_S + 15, ended - event


def test_oom_during_graph_capture_names_mem_fraction_static(box):
    done, event, ended = run_case(box, "oom")
    log = verdict(done)
    assert done.returncode != 0
    assert "during cuda graph" in log and "hint (cuda-oom)" in log, log[-4000:]
    assert "lower mem_fraction_static" in log
    DELAYS["CUDA OOM"] = ended - event
    assert ended - event < 15, ended - event


def test_degenerate_generation_fails_the_deploy(box):
    done, event, ended = run_case(box, "degenerate")
    log = verdict(done)
    assert done.returncode != 0
    assert "sglang.service ready in" in log
    assert "chat completion is degenerate (24 of 24 characters are '!')" in log, log[-4000:]
    DELAYS["degenerate generation"] = ended - event
    assert ended - event < 15, ended - event
    print("\nevent -> verdict (s): " + ", ".join(f"{k} {v:.2f}" for k, v in DELAYS.items()))


def test_a_server_that_cannot_start_stops_at_the_start_limit(box):
    """The deploy's unit with a server that exits at once: systemd starts it START_LIMIT_BURST
    times, RestartSec apart, refuses the next automatic restart (systemd 252 counts it in
    NRestarts and keeps Result=exit-code) and leaves it failed instead of looping."""
    from pve_sglang.server.unit_text import START_LIMIT_BURST

    unit = unit_name(settings())
    box.attach(f"systemctl stop {unit}; systemctl reset-failed {unit}", check=False)
    put(box, f"/etc/systemd/system/{unit}.d/standin.conf",
        "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -c 'raise SystemExit(1)'\n")
    box.attach(f"systemctl daemon-reload && systemctl start {unit}", check=False)
    deadline = time.monotonic() + 60
    show = ""
    while time.monotonic() < deadline:
        show = box.attach(f"systemctl show -p ActiveState -p Result -p NRestarts {unit}").stdout
        if "ActiveState=failed" in show:
            break
        time.sleep(1)
    assert "ActiveState=failed" in show and f"NRestarts={START_LIMIT_BURST}" in show, show
    time.sleep(12)  # longer than RestartSec: no further try
    assert f"NRestarts={START_LIMIT_BURST}" in box.attach(
        f"systemctl show -p NRestarts {unit}").stdout
