"""Tests for pve_sglang/server/bench.py and remote/bench_record.py against the real sglang wheels
(their parts that need no wheel: tests/unit/test_bench_rows_and_argv.py).

The benchmark's JSONL record is rendered here by each release's own code (its ``result = {...}``
block, executed with made-up metrics and a ``server_info`` holding a key); the real benchmarks
write it against the stand-in server in tests/test_bench_record_lxc.py.

The fixture tests/fixtures/bench/bench_serving_0.5.9.txt (the printed output the hostile-strings
test answers with) is rendered from sglang 0.5.9's own format strings (its "Serving Benchmark
Result" print block, executed with made-up metrics, after a few of its progress lines), not
captured from a real run. ``test_fixture_is_the_release_format`` renders the block again from the
cached wheel and compares, so the fixture cannot drift from it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import textwrap
import zipfile
from types import SimpleNamespace

import pytest

from pve_sglang.remote.bench_record import kept
from pve_sglang.server.bench import (
    bench_argv,
    bench_module,
    PROMPTS_DATASET,
    PROMPTS_IN_CONTAINER,
    RECORD_KEYS,
    record_row,
)
from bench_summary import summary_record
from test_bench_rows_and_argv import FIXTURE, settings

BENCH_SOURCE = {"0.5.9": "sglang/bench_serving.py", "0.5.23": "sglang/benchmark/serving.py"}

# The metrics the fixture was rendered with (64 prompts, 1024 in / 256 out, 64 concurrent).
METRICS = dict(
    completed=64,
    total_input=65536,
    total_input_text=65536,
    total_input_vision=0,
    total_output=16384,
    total_output_retokenized=16380,
    request_throughput=6.0781,
    input_throughput=6223.9734,
    output_throughput=1555.9934,
    max_output_tokens_per_s=1811.0,
    max_concurrent_requests=64,
    total_throughput=7779.9668,
    concurrency=61.87,
    mean_e2e_latency_ms=10179.51,
    median_e2e_latency_ms=10201.36,
    p90_e2e_latency_ms=10410.72,
    p95_e2e_latency_ms=10444.1,
    p99_e2e_latency_ms=10488.05,
    mean_ttft_ms=812.454,
    median_ttft_ms=790.118,
    p90_ttft_ms=1150.3,
    p95_ttft_ms=1201.7,
    p99_ttft_ms=1298.64,
    mean_tpot_ms=36.73,
    median_tpot_ms=36.51,
    p90_tpot_ms=38.2,
    p95_tpot_ms=38.9,
    p99_tpot_ms=39.87,
    mean_itl_ms=36.7342,
    median_itl_ms=35.9071,
    p90_itl_ms=41.2,
    p95_itl_ms=44.16,
    p99_itl_ms=88.42,
    max_itl_ms=412.77,
    # In the record only.
    std_e2e_latency_ms=120.4,
    std_ttft_ms=96.2,
    std_tpot_ms=0.91,
    std_itl_ms=7.75,
)
BENCHMARK_DURATION = 10.5297
KEY = "sk-rec'o\"rd$KEY"
# /get_server_info as 0.5.9 answers it: the ServerArgs fields at the top level.
SERVER_INFO = {"model_path": "/models/model", "api_key": KEY, "tp_size": 8,
               "internal_states": [{"avg_spec_accept_length": None}], "version": "0.5.9"}


@pytest.fixture(scope="module")
def wheel_text(sglang_wheel):
    """``wheel_text(version, member)``: a file of the real sglang wheel, as text."""
    @functools.lru_cache(maxsize=None)
    def text(version: str, member: str) -> str:
        with zipfile.ZipFile(sglang_wheel(version)) as archive:
            return archive.read(member).decode()

    return text


@pytest.fixture(scope="module")
def bench_source(wheel_text):
    """``bench_source(version)``: the release's benchmark module (``BENCH_SOURCE``), as text."""
    return lambda version: wheel_text(version, BENCH_SOURCE[version])


def summary_block_source(source: str) -> str:
    """The print statements of the summary block of a release's benchmark SOURCE, dedented."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if '" Serving Benchmark Result "' in line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        block.append(line)
        if line.strip() == 'print("=" * 50)':
            break
    return textwrap.dedent("\n".join(block))


def render_summary(source: str, max_concurrency: int = 64) -> str:
    """Run the summary print block of a release's benchmark SOURCE on METRICS; return what it
    prints."""
    namespace = dict(
        metrics=SimpleNamespace(**METRICS),
        backend="sglang",
        request_rate=float("inf"),
        use_trace_timestamps=False,
        max_concurrency=max_concurrency,
        benchmark_duration=BENCHMARK_DURATION,
        accept_length=None,
        goodput=None,
        _EMBEDDING_BACKENDS=frozenset(("sglang-embedding", "vllm-embedding")),
        args=SimpleNamespace(dataset_name="random-ids", goodput=None, cache_report=False),
        print_goodput=lambda goodput: None,
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(summary_block_source(source), namespace)
    return out.getvalue()


def result_block_source(source: str) -> str:
    """The ``result = {...}`` statement (the record's results) of a release's benchmark SOURCE,
    dedented."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "result = {"
                 and '"server_info": server_info,' in "\n".join(lines[i:i + 15]))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines))
               if lines[i].strip() == "}" and len(lines[i]) - len(lines[i].lstrip()) == indent)
    return textwrap.dedent("\n".join(lines[start:end + 1]))


def render_record(source: str, max_concurrency: int = 64) -> dict:
    """The record a release's benchmark SOURCE writes for METRICS (its ``result`` dict), ``server_info`` with
    the key in it."""
    namespace = dict(
        metrics=SimpleNamespace(**METRICS),
        args=SimpleNamespace(tag=None, backend="sglang", dataset_name="random-ids",
                             sharegpt_output_len=None, random_input_len=1024,
                             random_output_len=256, random_range_ratio=1.0),
        use_trace_timestamps=False,
        request_rate=float("inf"),
        max_concurrency=max_concurrency,
        server_info=SERVER_INFO,
        benchmark_duration=BENCHMARK_DURATION,
        accept_length=None,
    )
    exec(result_block_source(source), namespace)
    # Through JSON, as the benchmark writes it (json.dumps) and bench_record reads it.
    return json.loads(json.dumps(namespace["result"]))


def fixture_summary() -> str:
    text = FIXTURE.read_text()
    return text[text.index("\n=") :]


def test_fixture_is_the_release_format(bench_source):
    assert fixture_summary() == render_summary(bench_source("0.5.9"))


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_record_of_the_release_is_read(version, bench_source):
    record = render_record(bench_source(version), max_concurrency=16)
    assert record["server_info"]["api_key"] == KEY  # the release does put the key there
    shown = kept(record)
    assert "server_info" not in shown and KEY not in json.dumps(shown)
    row = record_row(shown)
    assert row["successful_requests"] == 64
    assert row["output_token_throughput"] == 1555.99
    assert row["total_token_throughput"] == 7779.97
    assert row["request_throughput"] == 6.08
    assert row["mean_ttft_ms"] == 812.45
    assert row["median_ttft_ms"] == 790.12
    assert row["p99_ttft_ms"] == 1298.64
    assert row["mean_itl_ms"] == 36.73
    assert row["median_itl_ms"] == 35.91
    assert row["p99_itl_ms"] == 88.42
    assert row["max_concurrency"] == 16
    assert row["mean_concurrency"] == 61.87
    assert row["peak_output_token_throughput"] == 1811.0
    assert row["duration_s"] == 10.53
    assert row["backend"] == "sglang" and row["request_rate"] == float("inf")
    assert row["total_output_tokens"] == 16384


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_printed_summary_and_record_give_the_same_row(version, bench_source):
    """Rows were read from the printed summary until the record replaced it: the same keys and
    values, so the saved history and the plot go on as they were. (tests/bench_summary.py reads
    the public recordings, kept as printed text only, this way.)"""
    source = bench_source(version)
    printed = record_row(summary_record(render_summary(source, max_concurrency=16)))
    assert printed == record_row(kept(render_record(source, max_concurrency=16)))
    assert len(printed) == len(RECORD_KEYS)
    with pytest.raises(ValueError, match="no 'Serving Benchmark Result' block"):
        summary_record("Traceback (most recent call last):\n")


@pytest.mark.parametrize(
    "release, module",
    [("0.5.9", "sglang.bench_serving"), ("0.5.14", "sglang.bench_serving"),
     ("0.5.15", "sglang.benchmark.serving"), ("0.5.23", "sglang.benchmark.serving")],
)
def test_bench_module_matches_the_wheel(release, module, sglang_wheel):
    path = module.replace(".", "/") + ".py"
    with zipfile.ZipFile(sglang_wheel(release)) as archive:
        names = set(archive.namelist())
    assert bench_module(release) == module
    assert path in names
    if module == "sglang.bench_serving":
        assert "sglang/benchmark/serving.py" not in names


def _parser_flags_and_datasets(source: str) -> tuple[set[str], set[str]]:
    flags = set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', source))
    start = source.index('"--dataset-name"')
    choices = source[start : source.index("]", start)]
    return flags, set(re.findall(r'"([a-z0-9_-]+)"', choices))


@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_bench_argv_uses_what_the_release_has(release, bench_source):
    s = settings(bench_num_prompts=64, bench_input_len=1024, bench_output_len=256)
    argv = bench_argv(s, "/opt/sglang/venv/bin/python", 16, "127.0.0.1", 30000, release)
    assert argv[:3] == ["/opt/sglang/venv/bin/python", "-m", bench_module(release)]
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--backend"] == "sglang"
    assert pairs["--dataset-name"] == "random-ids"
    assert pairs["--max-concurrency"] == "16"
    assert pairs["--num-prompts"] == "64"
    assert pairs["--random-input-len"] == "1024"
    assert pairs["--random-output-len"] == "256"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "30000"
    assert pairs["--model"] == pairs["--tokenizer"] == "/models/model"
    flags, datasets = _parser_flags_and_datasets(bench_source(release))
    assert "random-ids" in datasets
    used = {arg for arg in argv if arg.startswith("--")}
    assert used <= flags, used - flags


@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_the_users_prompts_go_as_the_releases_custom_dataset(release, bench_source, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"conversations": [{"content": "a b c"}, {"content": "d e"}]}\n')
    s = settings(bench_prompts_file=str(prompts), bench_output_len=64)
    argv = bench_argv(s, "/opt/sglang/venv/bin/python", 16, "127.0.0.1", 30000, release)
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--dataset-name"] == PROMPTS_DATASET
    assert pairs["--dataset-path"] == PROMPTS_IN_CONTAINER == "/opt/sglang/bench-prompts.jsonl"
    assert pairs["--sharegpt-output-len"] == "64"
    assert not any(arg.startswith("--random-") for arg in argv)
    flags, datasets = _parser_flags_and_datasets(bench_source(release))
    assert PROMPTS_DATASET in datasets
    used = {arg for arg in argv if arg.startswith("--")}
    assert used <= flags, used - flags


def test_random_ids_needs_no_download(wheel_text):
    """In both releases only the "random" dataset samples (and downloads) ShareGPT."""
    assert 'random_sample=args.dataset_name == "random"' in wheel_text("0.5.9", "sglang/bench_serving.py")
    assert 'random_sample=(args.dataset_name == "random")' in wheel_text(
        "0.5.23", "sglang/benchmark/datasets/random.py"
    )
