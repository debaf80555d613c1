"""The startup watch, the metrics reader, the benchmark record's parser, the GPU sampler's
summary and the tuning drive's endings against what SGLang 0.5.17 really printed on the lent
Hopper GPU (``tests/device/gpu_serve.py``'s OUT, kept in ``tests/fixtures/gpu/<run>/``, its
README naming the GPU, driver, release and date). Recorded output: no GPU here.

The first run: an H100, 2026-12-07 (``h100-sglang-0.5.17-2026-12-07``). What it found is
fixed in the product (the weights' bar 0.5.17 draws, ``Multi-thread loading shards``), not in
the fixture."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pve_sglang.remote import bench_record, gpu_sampler, marked_json, server_metrics
from pve_sglang.server import startup_log
from pve_sglang.server.bench import (REQUIRED, bench_exit_status, gpu_columns, metric_columns,
                                     record_row)
from pve_sglang.tuning import record
from pve_sglang.tuning.drive import ending_of

RUNS = sorted(p for p in (Path(__file__).parents[1] / "fixtures" / "gpu").glob("*") if p.is_dir())
pytestmark = pytest.mark.skipif(not RUNS, reason="no GPU run recorded")


def lines(run: Path) -> list[tuple[float, str]]:
    """The server's lines as the startup watch emits them: (seconds, text)."""
    out = []
    for raw in (run / "startup.jsonl").read_text().splitlines():
        entry = json.loads(raw)
        out.append((entry["t"] / 1e6, entry["m"]))
    return out


def levels(run: Path) -> dict[int, str]:
    """Each benchmark level's whole output (``bench.txt``: one ``### concurrency N`` each)."""
    parts = re.split(r"^### concurrency (\d+)\n", (run / "bench.txt").read_text(), flags=re.M)
    return {int(level): text for level, text in zip(parts[1::2], parts[2::2])}


@pytest.fixture(params=RUNS, ids=[p.name for p in RUNS])
def run(request) -> Path:
    return request.param


def test_watch_follows_the_real_start_through_every_phase_to_ready(run):
    seen = lines(run)
    progress = startup_log.Progress(start=seen[0][0])
    messages = [m for when, line in seen for m in progress.feed(line, when)]
    assert progress.ready, "the ready line was not recognised"
    # Each phase of a dense model's start with CUDA graphs on, in order: a line the watch
    # does not know leaves its phase out (the release worded it otherwise).
    # FlashInfer's autotune runs on a dense model too (its GEMMs), before the graphs.
    assert list(progress.times) == ["starting", "init", "weights", "kv cache", "autotune",
                                    "cuda graph", "warmup"]
    assert any(m.startswith("KV cache: ") for m in messages)
    assert any(m.startswith("weights: 1/1 shards") for m in messages)
    assert startup_log.diagnose([line for _, line in seen]) == []


def test_metrics_reader_finds_every_figure_under_sglangs_real_names(run):
    text = (run / "metrics.txt").read_text()
    found = server_metrics.figures(text)
    assert set(found) == {key for key, _ in server_metrics.FIGURES.values()}
    assert found["running_reqs"] == 0  # read once the benchmark had ended


def test_record_parser_and_samplers_read_every_level(run):
    outputs = levels(run)
    assert len(outputs) >= 2
    for level, output in outputs.items():
        assert bench_exit_status(output) == 0
        row = record_row(marked_json(bench_record.RECORD_PREFIX, output))
        assert set(REQUIRED) <= set(row)
        assert row["max_concurrency"] == level
        assert row["successful_requests"] >= level
        gpus = marked_json(gpu_sampler.SUMMARY_PREFIX, output)
        assert gpus["window"] == "benchmark" and "error" not in gpus
        columns = gpu_columns(gpus)
        assert columns["gpu_count"] == 1 and columns["gpu_power_w"] > 0
        metrics = marked_json(server_metrics.SUMMARY_PREFIX, output)
        assert metrics["window"] == "benchmark"
        assert metric_columns(metrics)["metrics_scrapes"] > 0


def test_gpu_sampler_summary_takes_power_from_nvmls_energy_counter(run):
    for output in levels(run).values():
        [gpu] = marked_json(gpu_sampler.SUMMARY_PREFIX, output)["gpus"]
        assert gpu["power_source"] == "nvml-energy"
        assert 0 < gpu["power_pct"] <= 100


def test_generation_check_judged_the_trained_model_not_degenerate(run):
    summary = json.loads((run / "summary.json").read_text())
    answer = summary["generation"]["result"]
    assert answer["status"] == 200 and answer["text"].strip()
    assert startup_log.degenerate(answer["text"]) is None
    assert startup_log.bad_logprobs(answer["logprobs"]) == 0


def tries_of(run: Path) -> list[tuple[dict, list[str]]]:
    """Each start of the tries: its candidate and its server lines (``tries_log.txt``, and
    ``oom_log.txt``: the start out of memory on purpose, ``gpu_serve.py tries --oom``)."""
    text = "".join((run / name).read_text() for name in ("tries_log.txt", "oom_log.txt")
                   if (run / name).exists())
    parts = re.split(r"^### start \d+: (.*)\n", text, flags=re.M)
    out = []
    for candidate, body in zip(parts[1::2], parts[2::2]):
        server = body.split("\n### bench at ")[0]
        out.append((json.loads(candidate), server.splitlines()))
    return out


def test_drive_record_holds_the_real_tries_and_their_endings(run):
    if not (run / "tries.jsonl").exists():
        pytest.skip("no tries in this run")
    read = record.read_search(run / "tries.jsonl")
    assert read.found is not None and read.ended is not None
    assert read.tries and all(done.outcome.ended == "measured" for done in read.tries)
    # What the drive kept is what the record says it measured best, and a later deploy's
    # tuned file names those flags.
    assert read.ended["best"] in [done.proposal.candidate for done in read.tries]


def test_a_start_out_of_memory_ends_as_oom_from_its_real_log(run):
    if not (run / "tries_log.txt").exists():
        pytest.skip("no tries in this run")
    starts = tries_of(run)
    oom = [log for candidate, log in starts if candidate["mem_fraction_static"] >= 0.99]
    served = [log for candidate, log in starts if candidate["mem_fraction_static"] < 0.99]
    assert oom and served
    assert all(ending_of(log, stalled=False, answer=None) == "oom" for log in oom)
    assert all("cuda-oom" not in [h.name for h, _ in startup_log.diagnose(log)]
               for log in served)
