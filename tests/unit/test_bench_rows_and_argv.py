"""pve_sglang/server/bench.py and remote/bench_record.py without a wheel: a record's row and what
it keeps, the summary table, and the benchmark's command (its prompts, its options, the shell that
reads the key and masks a failure). Against the real sglang wheels: tests/network/test_bench_serving.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pve_sglang.remote import marked_json
from pve_sglang.remote.bench_record import RECORD_PREFIX, kept
from pve_sglang.server.bench import (
    bench_argv,
    bench_runs,
    num_prompts,
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


def settings(**overrides) -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**data, **overrides})


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


def test_release_tuple():
    assert release_tuple("0.5.12.post1") == (0, 5, 12)
    assert release_tuple("0.5.23rc1") == (0, 5, 23)
    with pytest.raises(ValueError):
        release_tuple("latest")


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
