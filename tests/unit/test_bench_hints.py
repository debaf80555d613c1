"""The tuning hints read from the server's figures beside the GPUs' (``server.bench_hints``),
on tables; the history keeps the figures per run and draws them (``bench_history``); the
benchmark's argv carries the metrics sampler only where ``enable_metrics`` is on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pve_sglang.config.settings import ContainerSettings
from pve_sglang.project import load_defaults
from pve_sglang.server import bench_history
from pve_sglang.server.bench import bench_runs, summary_table
from pve_sglang.server.bench_hints import (
    BELOW_SHARE,
    FULL_USAGE,
    capped,
    idle_with_queue,
    kv_bound,
    queued,
    row_hints,
    run_hints,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def row(concurrency, running_mean, running_max, queue, usage, power=None):
    out = {"concurrency": concurrency, "running_reqs_mean": running_mean,
           "running_reqs_max": running_max, "queue_reqs_mean": queue, "token_usage_max": usage,
           "output_token_throughput": 100.0}
    if power is not None:
        out["gpu_power_pct"] = power
    return out


# concurrency, running mean, running max, queued, token usage -> capped, kv bound
@pytest.mark.parametrize("values, is_capped, is_kv_bound", [
    # the seed's run: 64 running at 1024 asked, the rest queued, KV cache half used
    ((1024, 63.5, 64, 950, 0.45), True, False),
    # the same at its ceiling with a full KV cache: memory, not a cap
    ((1024, 63.5, 64, 950, 0.97), False, True),
    # every request runs: nothing holds the level
    ((64, 62.0, 64, 0, 0.3), False, False),
    # fewer running than asked, but none queued: the client sends too slowly
    ((256, 120.0, 128, 0.2, 0.4), False, False),
    # running not flat (ramping): no cap can be read from it
    ((256, 60.0, 128, 40, 0.4), False, False),
    # near the concurrency (over 90% of it): not "below"
    ((64, 59.0, 60, 3, 0.4), False, False),
    # a full KV cache with a queue, running well below: the KV hint alone
    ((512, 200.0, 210, 300, 0.93), False, True),
    # a full KV cache and no queue: good use, no hint
    ((128, 127.0, 128, 0, 0.95), False, False),
])
def test_cap_and_kv_rules(values, is_capped, is_kv_bound):
    assert capped(row(*values)) is is_capped
    assert kv_bound(row(*values)) is is_kv_bound


@pytest.mark.parametrize("power, queue, low, expected", [
    (42.0, 950, 60, True),     # the seed's: 250 of 600 W with requests waiting
    (42.0, 0, 60, False),      # idle GPUs, but nothing waits: the client is the limit
    (75.0, 950, 60, False),    # busy enough
    (None, 950, 60, False),    # not sampled
])
def test_power_rule(power, queue, low, expected):
    assert idle_with_queue(row(1024, 900, 1000, queue, 0.5, power), low) is expected


# Each threshold just below, at and just above its edge (the values written out, not computed
# from the constants: a moved threshold moves a row's answer).
@pytest.mark.parametrize("queue, expected", [(0.99, False), (1.0, True), (1.01, True),
                                             (0, False), (None, False), (True, False),
                                             ("5", False)])
def test_queued_at_its_edge(queue, expected):
    """QUEUED: at least one request waiting on average; a figure that is not a number (the run
    file is read back from disk) counts as none."""
    assert queued({"queue_reqs_mean": queue}) is expected


# concurrency, running mean, running max, queued, token usage -> capped, kv bound
@pytest.mark.parametrize("values, is_capped, is_kv_bound", [
    # FULL_USAGE (0.9): the KV cache is full from 0.9 on, and then no cap is read
    ((100, 80.0, 80, 5, 0.89), True, False),
    ((100, 80.0, 80, 5, 0.9), False, True),
    ((100, 80.0, 80, 5, 0.91), False, True),
    # QUEUED (1.0) for both rules
    ((100, 80.0, 80, 0.99, 0.4), False, False),
    ((100, 80.0, 80, 1.0, 0.4), True, False),
    ((100, 80.0, 80, 0.99, 0.95), False, False),
    ((100, 80.0, 80, 1.0, 0.95), False, True),
    # BELOW_SHARE (0.9): the most running under 90 of 100 asked
    ((100, 89.0, 89, 5, 0.4), True, False),
    ((100, 90.0, 90, 5, 0.4), False, False),
    ((100, 91.0, 91, 5, 0.4), False, False),
    # FLAT_SHARE (0.9): the mean at least 72 of a most of 80
    ((100, 71.9, 80, 5, 0.4), False, False),
    ((100, 72.0, 80, 5, 0.4), True, False),
    ((100, 72.1, 80, 5, 0.4), True, False),
    # none running at all (a server that serves nothing): no cap can be read
    ((100, 0.0, 0, 5, 0.4), False, False),
    ((100, 1.0, 1, 5, 0.4), True, False),
])
def test_cap_and_kv_rules_at_their_edges(values, is_capped, is_kv_bound):
    assert capped(row(*values)) is is_capped
    assert kv_bound(row(*values)) is is_kv_bound


@pytest.mark.parametrize("power, expected", [(59.9, True), (60.0, False), (60.1, False)])
def test_power_rule_at_its_edge(power, expected):
    """Under LOW_POWER_PCT, not at it."""
    assert idle_with_queue(row(1024, 900, 1000, 950, 0.5, power), 60) is expected


@pytest.mark.parametrize("power, hinted", [(59.9, True), (60.0, False), (60.1, False)])
def test_power_rules_at_the_default_setting(power, hinted):
    """bench_low_power_pct's default (60: the seed's tuned run drew 42%, about 250 of 600 W,
    with requests waiting) is the edge of both rules that read it: the tuning hint and the
    benchmark's low-power warning."""
    default = load_defaults()["bench_low_power_pct"]
    run = {"meta": {}, "rows": [row(1024, 900, 1000, 950, 0.5, power)]}
    hints = run_hints(run, default)
    assert (len(hints) == 1 and "of their power limit" in hints[0]) is hinted
    assert (bench_history.low_power_warning(run, default) is not None) is hinted


def test_no_power_rule_without_a_threshold():
    """bench_low_power_pct unset (None): no power hint, however low the power."""
    run = {"meta": {}, "rows": [row(1024, 900, 1000, 950, 0.5, 0.0)]}
    assert run_hints(run, None) == []
    assert len(run_hints(run, 0.1)) == 1


def test_the_troubleshooting_page_states_the_thresholds_of_the_code():
    """docs/troubleshooting.md writes two thresholds out; they are the code's."""
    text = re.sub(r"\s+", " ", (DOCS / "troubleshooting.md").read_text())
    assert f"under {BELOW_SHARE:.0%} of the concurrency asked" in text
    assert f"token usage at {FULL_USAGE:g} or more" in text


def test_rows_without_metrics_earn_no_hint():
    """An old run, or one with enable_metrics off: no figure, no hint, no error."""
    assert row_hints({"concurrency": 64, "gpu_power_pct": 20.0}, {}, 60) == []


def test_hints_name_the_figures_and_the_settings():
    meta = {"max_running_requests": 64, "mem_fraction_static": 0.92, "tp_size": 8,
            "disable_cuda_graph": True, "moe_runner_backend": "flashinfer_cutlass"}
    run = {"meta": meta, "rows": [row(1024, 63.5, 64, 950, 0.45, power=42.0),
                                  row(1, 1, 1, 0, 0.01, power=10.0)]}
    cap, power = run_hints(run, 60)
    assert cap.startswith("concurrency 1024: 64 running (at most 64) with 950 queued")
    assert "max_running_requests: 64" in cap and "a cap of 64" in cap
    assert power.startswith("concurrency 1024: GPUs at 42% of their power limit with 950 queued")
    assert "disable_cuda_graph: True" in power and "moe_runner_backend: flashinfer_cutlass" in power
    [kv] = run_hints({"meta": meta, "rows": [row(1024, 300, 310, 700, 0.98)]}, None)
    assert "KV cache use reached 0.98 with 700 queued" in kv
    assert "mem_fraction_static: 0.92" in kv and "tp_size: 8" in kv
    no_cap = row_hints(row(1024, 63.5, 64, 950, 0.45), {"max_running_requests": None}, 60)
    assert "none set, so SGLang sizes its own" in no_cap[0]


def test_history_keeps_the_figures_and_draws_them(tmp_path):
    """The run file holds each level's server figures; the plot gets its third panel (wider);
    the warnings carry the tuning hints."""
    meta = {"model_path": "/m", "input_len": 1024, "output_len": 256, "max_running_requests": 64,
            "mem_fraction_static": 0.92}
    rows = [{**row(c, min(c, 64) - 0.5, min(c, 64), max(0, c - 64), 0.4, power=45.0),
             "metrics_scrapes": 9, "queue_reqs_max": max(0, c - 64), "cache_hit_rate_mean": 0.0}
            for c in (1, 64, 256, 1024)]
    for row_ in rows[:1]:
        row_["running_reqs_mean"] = 1
    info, warnings = bench_history.after_run(tmp_path, "@lxc/c1", rows, meta, 10, 60)
    [saved] = (tmp_path / "_lxc_c1").glob("*.json")
    kept = json.loads(saved.read_text())["rows"]
    assert [r["running_reqs_mean"] for r in kept] == [1, 63.5, 63.5, 63.5]
    assert [r["queue_reqs_mean"] for r in kept] == [0, 0, 192, 960]
    assert kept[-1]["token_usage_max"] == 0.4 and kept[-1]["metrics_scrapes"] == 9
    hints = [w for w in warnings if w.startswith("tuning hint: ")]
    assert [h.split(":")[1].strip() for h in hints] == [
        "concurrency 256", "concurrency 256", "concurrency 1024", "concurrency 1024"]
    from matplotlib import image

    drawn = image.imread(tmp_path / "_lxc_c1" / bench_history.PLOT_NAME)
    assert drawn.shape[1] >= 1700  # three panels (two without the server's figures: 1430)
    table = summary_table(rows)
    assert "running" in table and "queued" in table and "KV use" in table


def settings(**overrides) -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**data, **overrides})


def test_bench_runs_sample_metrics_only_where_enabled():
    """The metrics sampler sits between the GPU sampler and the record wrapper, reading
    /metrics at the address the benchmark uses (an IPv6 one in brackets); none when off."""
    py = "/opt/sglang/venv/bin/python"
    on = bench_runs(settings(bench_preset="quick"), py, "::1", "0.5.23", "/s/gpu.py",
                    "/s/rec.py", "/s/metrics.py")
    argv = on[16]
    inner = argv[argv.index("--") + 1:]
    assert inner[:7] == [py, "/s/metrics.py", "--url", "http://[::1]:30000/metrics",
                         "--interval-ms", "1000", "--start-marker"]
    assert inner[inner.index("--") + 1:][:2] == [py, "/s/rec.py"]
    off = bench_runs(settings(bench_preset="quick", enable_metrics=False), py, "::1", "0.5.23",
                     "/s/gpu.py", "/s/rec.py", "/s/metrics.py")
    assert "/s/metrics.py" not in off[16] and "--url" not in off[16]
