"""``make status``'s pure parts (``server/status.py``, ``unit_action.changed_after``) on tables,
and its remote read (``remote/status_read.py``, sent as ``remote.piped`` sends it) run here
against a folder laid out as a deployed container's and the stand-in server's /health and
/metrics (``tests/standin_sglang.py``: SGLang's real metric names; a stand-in, no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pve_sglang import remote
from pve_sglang.facts.status import ContainerStatus
from pve_sglang.server import status
from pve_sglang.server.unit_action import changed_after
from standin_process import standin

STACK = "68a87c7696509d54"
OTHER = "0123456789abcdef"
NOW = 1_800_000_000.0


@pytest.mark.parametrize("value, shown", [
    ("plain", "plain"),
    ("\x1b[31mred\x1b[0m", "[31mred[0m"),  # ESC dropped: no escape sequence reaches the terminal
    ("a\x07b\x9bc", "abc"),  # BEL and the C1 CSI
    ("right\u202eleft", "rightleft"),  # a bidi override
    ("two\nlines\r\tthere", "two lines there"),
    ("x" * status.CELL_CHARS, "x" * status.CELL_CHARS),  # at the bound: kept whole
    ("x" * (status.CELL_CHARS + 1), "x" * (status.CELL_CHARS - 1) + "…"),  # one over: cut
    (None, ""),
])
def test_clean_drops_control_characters_and_bounds_the_length(value, shown):
    assert status.clean(value) == shown


@pytest.mark.parametrize("record, current, words", [
    ({}, STACK, ""),
    ({"trial": STACK, "trial_until": NOW + 60}, OTHER, ""),  # the link names another stack
    ({"trial": STACK}, STACK, f"stack {STACK}: not judged yet"),
    ({"trial": STACK, "trial_until": NOW + 1}, STACK, f"until {status.utc(NOW + 1)}"),
    ({"trial": STACK, "trial_until": NOW}, STACK,  # its end reached: over
     f"ended {status.utc(NOW)}: the next run closes it"),
    ({"trial": STACK, "trial_until": "soon"}, STACK, f"stack {STACK}: unreadable end 'soon'"),
])
def test_probation_words(record, current, words):
    assert status.probation_words(record, current, NOW) == words


FAILED_OLD = {"sglang": "0.5.8", "when": "2026-12-01 10:00:00 UTC", "why": "crash loop"}
FAILED_NEW = {"sglang": "0.5.9", "when": "2026-12-02 10:00:00 UTC", "why": "degenerate"}
FELL = {"from": OTHER, "to": STACK, "when": "2026-12-03 10:00:00 UTC", "why": "start limit"}


@pytest.mark.parametrize("record, words", [
    ({}, ""),
    ({"failed": {}}, ""),
    ({"failed": {OTHER: FAILED_OLD}}, f"2026-12-01 10:00:00 UTC: stack {OTHER}: crash loop"),
    ({"failed": {OTHER: FAILED_OLD, STACK: FAILED_NEW}},
     f"2026-12-02 10:00:00 UTC: stack {STACK}: degenerate"),
    ({"failed": {STACK: FAILED_NEW}, "fell_back": FELL},
     f"2026-12-03 10:00:00 UTC: {OTHER} -> {STACK}: start limit"),
    ({"failed": {STACK: "not a dict"}}, ""),
])
def test_rollback_words_name_the_newest(record, words):
    assert status.rollback_words(record) == words


@pytest.mark.parametrize("started, mtimes, pending", [
    (None, {"the unit file": 5}, []),  # unknown start: decides nothing
    (100, {"the unit file": 100}, []),  # written before or as it started
    (100, {"the unit file": 101}, ["the unit file"]),  # one microsecond after
    (100, {"the unit file": None, "the launcher": 99}, []),
    (100, {"the unit file": 101, "the launcher": 200}, ["the unit file", "the launcher"]),
])
def test_changed_after(started, mtimes, pending):
    assert changed_after(started, mtimes) == pending


@pytest.mark.parametrize("health, words", [
    (None, ""), ({"status": 200}, "ok"), ({"status": 503}, "HTTP 503"),
    ({"error": "refused"}, "down: refused"),
])
def test_health_words(health, words):
    assert status.health_words(health) == words


@pytest.mark.parametrize("runs, last", [
    ([], (None, "")),
    ([{"time": "t1", "rows": [{"output_token_throughput": 10.0}]},
      {"time": "t2", "rows": [{"output_token_throughput": 5.0},
                              {"output_token_throughput": 7.5}, {"concurrency": 3}]}], (7.5, "t2")),
    ([{"time": "t3", "rows": []}], (None, "t3")),
])
def test_bench_last_is_the_newest_runs_best_level(runs, last):
    assert status.bench_last(runs) == last


def test_a_down_row_says_why_and_the_table_holds_every_row():
    rows = [status.down_row("pve1", "c1", "stopped"),
            status.down_row("pve2", "c2", "unreachable: pyinfra could not connect (above)")]
    lines = status.table(rows).splitlines()
    assert lines[0].split()[:3] == ["HOST", "CONTAINER", "STATE"]
    assert lines[1].split() == ["pve1", "c1", "stopped"]
    assert "unreachable" in lines[2]
    assert [r["state"] for r in json.loads(status.as_json(rows))] == [
        "stopped", "unreachable: pyinfra could not connect (above)"]


# --- the remote read, run here against a folder laid out as a container ---------------------


def _container(root: Path, release: str = "0.5.9") -> dict:
    """A deployed container's files under ROOT: the venv link to a complete stack, the stack
    record (a trial on probation, an older failed set), the model's marker; the read's args."""
    venv = root / "opt/sglang/venv"
    stack = root / f"opt/sglang/venv.stacks/{STACK}"
    stack.mkdir(parents=True)
    (stack / "pve-sglang-stack.json").write_text(json.dumps({"sglang": release}))
    (root / f"opt/sglang/venv.stacks/{OTHER}").mkdir()  # incomplete: no release file
    venv.symlink_to(f"venv.stacks/{STACK}")
    record = root / "var/lib/pve-sglang/sglang-stacks.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"trial": STACK, "previous": OTHER, "trial_until": NOW + 600,
                                  "failed": {OTHER: FAILED_OLD}}))
    model = root / "models/m"
    model.mkdir(parents=True)
    (model / ".pve-sglang-model.json").write_text(json.dumps(
        {"repo": "Qwen/Qwen3-0.6B", "commit": "c1a2b3c4d5e6f7a8b9c0"}))
    return {"unit": "pve-sglang-status-test-none.service", "venv_path": str(venv),
            "state": str(record), "model_path": str(model), "marker": ".pve-sglang-model.json",
            "since": {"the launcher": str(root / "opt/sglang/none"), "the sglang stack link":
                      str(venv)}, "timeout_s": 5}


def _piped_read(args: dict) -> dict:
    """The read as the ``ContainerStatus`` fact runs it (its program with ``python -c``), the
    output through the fact's own ``process``."""
    done = subprocess.run([sys.executable, "-c", remote.piped(remote.STATUS_READ),
                           json.dumps(args)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return ContainerStatus().process(done.stdout.splitlines())


def test_the_read_of_a_serving_container_gives_its_row(tmp_path):
    args = _container(tmp_path / "root")
    with standin(tmp_path, "--enable-metrics") as url:
        read = _piped_read({**args, "base_url": url, "metrics": True})
    assert read["health"] == {"status": 200}
    assert read["metrics"]["running_reqs"] == 0 and read["metrics"]["queue_reqs"] == 0
    assert set(read["stacks"]["stacks"]) == {STACK}
    runs = [{"time": "2026-12-04T10:00:00Z", "rows": [{"output_token_throughput": 1234.5}]}]
    row = status.container_row("pve1", "c1", args["venv_path"], read, runs, NOW - 3600, NOW)
    assert {k: row[k] for k in ("release", "stack", "model", "commit", "health", "running",
                                "queued", "token_usage", "bench_tok_s", "bench_date", "probation",
                                "rollback", "tuned")} == {
        "release": "sglang 0.5.9", "stack": STACK, "model": "Qwen/Qwen3-0.6B",
        "commit": "c1a2b3c4d5e6", "health": "ok", "running": "0", "queued": "0",
        "token_usage": "0.00", "bench_tok_s": "1234.5", "bench_date": "2026-12-04T10:00:00Z",
        "probation": f"until {status.utc(NOW + 600)}",
        "rollback": f"2026-12-01 10:00:00 UTC: stack {OTHER}: crash loop",
        "tuned": status.utc(NOW - 3600)}


def test_a_server_without_metrics_and_one_down_are_said_so(tmp_path):
    args = _container(tmp_path / "root")
    with standin(tmp_path) as url:  # no --enable-metrics: /metrics is a 404
        read = _piped_read({**args, "base_url": url, "metrics": True})
    assert read["health"] == {"status": 200}
    assert "HTTP 404" in read["metrics"]["error"]
    down = _piped_read({**args, "base_url": url, "metrics": True})  # the stand-in has ended
    assert "down: " in status.health_words(down["health"])


def test_the_read_stages_as_a_script_with_its_companion_too(tmp_path):
    script = remote.stage(remote.STATUS_READ, tmp_path / "tools")
    args = _container(tmp_path / "root")
    done = subprocess.run([sys.executable, str(script), json.dumps(args)], capture_output=True,
                          text=True, timeout=60, check=True)
    assert json.loads(done.stdout)["marker"]["repo"] == "Qwen/Qwen3-0.6B"


def test_hostile_container_values_reach_the_table_without_escapes(tmp_path):
    args = _container(tmp_path / "root", release="0.5.9\x1b]0;pwned\x07\x1b[2J")
    read = _piped_read(args)
    row = status.container_row("pve1", "c1", args["venv_path"], read, [], None, NOW)
    text = status.table([row]) + status.as_json([row])
    assert "\x1b" not in text and "\x07" not in text
    assert "sglang 0.5.9]0;pwned[2J" in status.table([row])


def test_a_read_that_printed_no_json_is_a_row_not_a_traceback():
    read = ContainerStatus().process(["Traceback (most recent call last):", "boom"])
    row = status.container_row("pve1", "c1", "/opt/sglang/venv", read, [], None, NOW)
    assert row["state"].startswith("running; status read failed: the status read printed no JSON")


@pytest.mark.parametrize("active, sub, pending", [
    ("active", "running", "the unit file"),
    ("activating", "start", "the unit file"),
    ("activating", "auto-restart", ""),  # between two automatic restarts: not serving
    ("failed", "failed", ""),
    ("inactive", "dead", ""),
])
def test_a_restart_is_pending_only_for_a_serving_unit(active, sub, pending):
    read = {"unit": {"active": active, "sub": sub, "started": 100},
            "mtimes": {"the unit file": 101, "the launcher": 100}}
    row = status.container_row("pve1", "c1", "/opt/sglang/venv", read, [], None, NOW)
    assert row["restart_pending"] == pending


@pytest.mark.parametrize("marker, model", [
    ({"commit": "a" * 40}, ""),  # no repo in it
    ({"repo": 7, "commit": None}, "7"),  # the container's file is untrusted: not a string
    ({"repo": "Qwen/Qwen3-0.6B", "commit": "b" * 40}, "Qwen/Qwen3-0.6B"),
])
def test_every_cell_of_a_row_is_text_whatever_the_model_marker_holds(marker, model):
    """The row promises text cells (``dict[str, str]``; --json gives them as read): a model
    marker without its repo gives an empty cell, not null."""
    read = {"unit": {"active": "active", "sub": "running", "started": 100}, "marker": marker}
    row = status.container_row("pve1", "c1", "/opt/sglang/venv", read, [], None, NOW)
    assert row["model"] == model
    assert {key: value for key, value in row.items() if not isinstance(value, str)} == {}
    assert json.loads(status.as_json([row]))
