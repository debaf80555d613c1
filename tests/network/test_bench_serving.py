"""Tests for pve_sglang/server/bench.py and remote/bench_record.py against the real sglang wheels.

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
import sys
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from pve_sglang.remote import marked_json
from pve_sglang.remote.bench_record import RECORD_PREFIX, kept
from pve_sglang.server.bench import (
    bench_argv,
    bench_module,
    bench_runs,
    num_prompts,
    PROMPTS_DATASET,
    PROMPTS_IN_CONTAINER,
    RECORD_KEYS,
    bench_exit_status,
    bench_shell,
    record_row,
    recorded_argv,
    release_tuple,
    summary_table,
)
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings
from bench_summary import summary_record

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "bench" / "bench_serving_0.5.9.txt"
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


def settings(**overrides) -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**data, **overrides})


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


def test_record_row_refuses_a_missing_record_or_metric():
    with pytest.raises(ValueError, match="no benchmark record"):
        record_row(None)
    cut = {k: v for k, v in summary_record(FIXTURE.read_text()).items() if "ttft" not in k}
    with pytest.raises(ValueError, match="lacks mean_ttft_ms, median_ttft_ms"):
        record_row(cut)


def test_parse_record_takes_the_last_line():
    text = (f"{RECORD_PREFIX}{json.dumps({'completed': 1})}\nlogs\n"
            f"{RECORD_PREFIX}{json.dumps({'completed': 2})}\n")
    assert marked_json(RECORD_PREFIX, text) == {"completed": 2}
    assert marked_json(RECORD_PREFIX, "Traceback (most recent call last):\n") is None


def test_kept_holds_numbers_and_named_strings_only():
    record = {"completed": 3, "output_throughput": 1.5, "accept_length": None, "tag": "t",
              "backend": "sglang", "request_rate": "trace", "server_info": {"api_key": "k"},
              "cache_report": {"x": 1}, "errors": ["e"], "base_url": "http://u:p@h", "flag": True}
    assert kept(record) == {"completed": 3, "output_throughput": 1.5, "accept_length": None,
                            "tag": "t", "backend": "sglang", "request_rate": "trace"}


def test_summary_table():
    base = record_row(summary_record(FIXTURE.read_text()))
    rows = [
        {**base, "concurrency": 64},
        {**base, "concurrency": 1, "output_token_throughput": 61.5, "total_token_throughput": 307.48,
         "request_throughput": 0.24, "median_ttft_ms": 95.1},
        {**base, "concurrency": 16, "median_ttft_ms": None},
    ]
    table = summary_table(rows)
    lines = table.splitlines()
    assert lines[0].split() == ["concurrency", "output", "tok/s", "total", "tok/s", "req/s", "median", "TTFT", "ms",
                                "median", "ITL", "ms"]
    assert set(lines[1]) == {"-", " "}
    assert [line.split() for line in lines[2:]] == [
        ["1", "61.50", "307.48", "0.24", "95.10", "35.91"],
        ["16", "1555.99", "7779.97", "6.08", "-", "35.91"],
        ["64", "1555.99", "7779.97", "6.08", "790.12", "35.91"],
    ]
    # With the GPU sampler's columns (gpu_columns): power, its share of the limit, util, memory.
    sampled = summary_table([{**rows[0], "gpu_power_w": 612.4, "gpu_power_pct": 87.49,
                              "gpu_util_pct": 99.0, "gpu_memory_gib": 131.3}, rows[1]])
    assert "GPU % of power limit" in sampled.splitlines()[0]
    assert [line.split()[-4:] for line in sampled.splitlines()[2:]] == [
        ["-", "-", "-", "-"], ["612", "87", "99", "131.3"]]
    assert len({len(line) for line in lines}) == 1  # right-aligned columns
    # Rows straight from record_row: the level comes from the record's max_concurrency.
    assert summary_table([base]).splitlines()[2].split()[0] == "64"


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


def test_release_tuple():
    assert release_tuple("0.5.12.post1") == (0, 5, 12)
    assert release_tuple("0.5.23rc1") == (0, 5, 23)
    with pytest.raises(ValueError):
        release_tuple("latest")


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


@pytest.mark.parametrize("prompts, per_level, level, share, expected", [
    (64, 8, 16, 1.0, 128),    # the whole run: 8 per concurrent request
    (64, 8, 16, 0.25, 32),    # a quarter of it (the tuning search's first rung)
    (64, 8, 16, 0.5, 64),
    (8, 2, 4, 0.25, 4),       # never fewer than one prompt per concurrent request
    (200, 1, 4, 0.25, 50),    # bench_num_prompts rules the whole, its share the short run
])
def test_a_shorter_run_asks_its_share_of_the_prompts(prompts, per_level, level, share, expected):
    s = settings(bench_num_prompts=prompts, bench_prompts_per_concurrency=per_level)
    assert num_prompts(s, level, share) == expected
    [argv] = bench_runs(s, "/py", "127.0.0.1", "0.5.23", "/s.py", "/r.py", levels=[level],
                        share=share).values()
    assert argv[argv.index("--num-prompts") + 1] == str(expected)
    assert argv[argv.index("--max-concurrency") + 1] == str(level)


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ValueError, match=f"benchmark share {share!r}: allowed: above 0, at most 1"):
        num_prompts(settings(), 4, share)


def test_random_ids_needs_no_download(wheel_text):
    """In both releases only the "random" dataset samples (and downloads) ShareGPT."""
    assert 'random_sample=args.dataset_name == "random"' in wheel_text("0.5.9", "sglang/bench_serving.py")
    assert 'random_sample=(args.dataset_name == "random")' in wheel_text(
        "0.5.23", "sglang/benchmark/datasets/random.py"
    )


def test_bench_argv_options():
    s = settings(served_model_name="glm-5")
    argv = bench_argv(s, "/py", 1, "10.0.0.5", 30001, "0.5.9")
    assert argv[argv.index("--served-model-name") + 1] == "glm-5"
    assert "--output-file" not in argv  # the record wrapper gives it a private one
    assert recorded_argv("/py", "/opt/sglang/bench_record.py", argv) == [
        "/py", "/opt/sglang/bench_record.py", "--", *argv]
    with pytest.raises(ValueError, match="concurrency 0"):
        bench_argv(s, "/py", 0, "h", 1, "0.5.9")


def test_bench_shell_reads_the_key_from_the_env_file(tmp_path):
    import subprocess

    from pve_sglang.server.unit_text import render_env

    env_file = tmp_path / "sglang.env"
    env_file.write_text(render_env(settings(api_key='k$y"1"')))
    argv = [sys.executable, "-c", "import os; print(os.environ['OPENAI_API_KEY'])"]
    command = bench_shell(argv, str(env_file)).get_raw_value()
    assert "k$y" not in command
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ['k$y"1"', "BENCH_EXIT_STATUS=0"]
    env_file.write_text("# no key\n")
    argv = [sys.executable, "-c", "import os; print('OPENAI_API_KEY' in os.environ)"]
    done = subprocess.run(["sh", "-c", bench_shell(argv, str(env_file)).get_raw_value()], capture_output=True, text=True,
                          check=True, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.splitlines()[0] == "False"


def test_a_failed_benchmark_exits_0_with_its_status_and_output_for_the_deploy_to_mask(tmp_path):
    """pyinfra prints a failed command's output unmasked; the benchmark (which holds the key)
    never fails the command: its status and its stderr come back on stdout, masked by the
    deploy before it shows any."""
    import subprocess

    from pve_sglang.server.unit_text import render_env

    env_file = tmp_path / "sglang.env"
    env_file.write_text(render_env(settings(api_key="sk-fails")))
    argv = [sys.executable, "-c", "import os, sys; sys.exit('401 for ' + os.environ['OPENAI_API_KEY'])"]
    done = subprocess.run(["sh", "-c", bench_shell(argv, str(env_file)).get_raw_value()],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == ["401 for sk-fails", "BENCH_EXIT_STATUS=1"]
    assert bench_exit_status(done.stdout) == 1 and bench_exit_status("killed\n") is None
