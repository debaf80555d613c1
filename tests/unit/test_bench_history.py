"""Benchmark history (pve_sglang/server/bench_history.py) on real bench_serving output.

The recorded runs are public: Kimi-K2.5 with the same benchmark command on 8x H200 and on 4x
MI350X (tests/fixtures/public/bench_serving_kimi-k2.5_*_sgl-cookbook.txt; sources in
tests/fixtures/README.md), kept as printed text: ``bench_summary.summary_record`` turns each
block into the record the benchmark writes, which the deploy reads (``bench.record_row``). The
end-to-end test runs the ``benchmark`` operation through the pyinfra CLI on @local: the real
GPU sampler, record wrapper and env file, a stand-in nvidia-smi, and a stand-in benchmark that
prints a recorded result block and appends its record (``server_info`` and the key inside) to
the ``--output-file`` it is given.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pve_sglang.server import bench_history
from pve_sglang.server.bench import RESULT_HEADER, record_row, summary_table
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import SettingsError, validate_container
from bench_summary import summary_record

REPO = Path(__file__).resolve().parents[2]
PUBLIC = REPO / "tests" / "fixtures" / "public"
H200 = PUBLIC / "bench_serving_kimi-k2.5_h200x8_sgl-cookbook.txt"
MI350X = PUBLIC / "bench_serving_kimi-k2.5_mi350x4_sgl-cookbook.txt"
META = {"model_path": "moonshotai/Kimi-K2.5", "input_len": 1000, "output_len": 1000}
T0 = datetime.datetime(2026, 4, 9, 12, 0, tzinfo=datetime.timezone.utc)


def blocks(path: Path) -> list[str]:
    """The result blocks of a recorded run, one per level."""
    text = path.read_text()
    starts = [m.start() for m in re.finditer(r"^=+" + RESULT_HEADER, text, re.MULTILINE)]
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def rows(path: Path) -> list[dict]:
    parsed = [record_row(summary_record(block)) for block in blocks(path)]
    return [{"concurrency": row["max_concurrency"], **row} for row in parsed]


def label(path: Path, value: str) -> float:
    """A value of a block read by its label, independently of the parser."""
    return float(re.search(rf"^{re.escape(value)}\s+(\S+)", path.read_text(), re.MULTILINE).group(1))


def test_parser_reads_the_recorded_runs():
    h200 = rows(H200)
    assert [r["concurrency"] for r in h200] == [1, 16, 100]
    assert [r["successful_requests"] for r in h200] == [10, 80, 500]
    for block, row in zip(blocks(H200), h200):
        for key, text in (("output_token_throughput", "Output token throughput (tok/s):"),
                          ("median_ttft_ms", "Median TTFT (ms):"),
                          ("median_itl_ms", "Median ITL (ms):"),
                          ("peak_output_token_throughput", "Peak output token throughput (tok/s):")):
            assert row[key] == float(re.search(rf"{re.escape(text)}\s+(\S+)", block).group(1))
    assert h200[0]["output_token_throughput"] == label(H200, "Output token throughput (tok/s):")
    assert [r["concurrency"] for r in rows(MI350X)] == [1, 16]
    table = summary_table(h200).splitlines()
    assert "median ITL ms" in table[0] and "GPU" not in table[0]
    assert table[-1].split()[:2] == ["100", f"{h200[-1]['output_token_throughput']:.2f}"]


def test_history_records_and_warns_on_a_drop(tmp_path):
    first = bench_history.record(tmp_path, "@lxc/kimi", rows(H200), META, now=T0)
    second = bench_history.record(tmp_path, "@lxc/kimi", rows(MI350X), META,
                                  now=T0 + datetime.timedelta(days=1))
    assert first.parent == second.parent == tmp_path / "_lxc_kimi"
    assert first.name == "2026-04-09T120000Z.json"
    (first.parent / "notes.json").write_text("[]")  # not a run: skipped
    runs = bench_history.load_runs(tmp_path, "@lxc/kimi")
    assert [run["time"] for run in runs] == ["2026-04-09T12:00:00Z", "2026-04-10T12:00:00Z"]
    assert runs[0]["rows"][2]["output_token_throughput"] == rows(H200)[2]["output_token_throughput"]
    warning = bench_history.regression_warning(runs, 10)
    h200, mi = rows(H200), rows(MI350X)
    for old, new in zip(h200[:2], mi):
        change = 100 * (new["output_token_throughput"] - old["output_token_throughput"]) / old[
            "output_token_throughput"]
        assert change < -10  # the recorded runs do differ that much
        assert f"concurrency {new['concurrency']}: {old['output_token_throughput']:.2f} -> " \
               f"{new['output_token_throughput']:.2f} tok/s ({change:.0f}%)" in warning
    assert "concurrency 100" not in warning  # not measured in the second run
    assert "2026-04-09T12:00:00Z" in warning
    # Reversed, throughput rose: no warning; other lengths: not comparable.
    assert bench_history.regression_warning(runs[::-1], 10) is None
    other = {**runs[1], "meta": {**META, "output_len": 8000}}
    assert bench_history.regression_warning([runs[0], other], 10) is None
    assert bench_history.regression_warning(runs[:1], 10) is None


def test_low_power_warning_names_the_hints():
    meta = {"max_running_requests": 64, "disable_cuda_graph": True,
            "moe_runner_backend": "flashinfer_cutlass"}
    run = {"meta": meta, "rows": [
        {"concurrency": 1, "gpu_power_pct": 20.0},
        {"concurrency": 1024, "gpu_power_pct": 41.5, "gpu_count": 8, "gpu_power_w": 290.5,
         "gpu_power_limit_w": 700.0},
    ]}
    warning = bench_history.low_power_warning(run, 60)
    assert "at concurrency 1024 the 8 GPU(s) drew 42% of their power limit" in warning
    assert "max_running_requests caps the batch (now 64)" in warning
    assert "disable_cuda_graph: True" in warning
    assert "moe_runner_backend: flashinfer_cutlass" in warning and "autotune" in warning
    assert bench_history.low_power_warning(run, 40) is None
    assert bench_history.low_power_warning({"meta": meta, "rows": [{"concurrency": 1}]}, 60) is None


def test_plot_of_two_recorded_runs(tmp_path):
    bench_history.record(tmp_path, "h", rows(H200), META, now=T0)
    bench_history.record(tmp_path, "h", rows(MI350X), META, now=T0 + datetime.timedelta(days=1))
    picture = bench_history.plot(bench_history.load_runs(tmp_path, "h"), tmp_path / "p.png",
                                 regression_pct=10)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.stat().st_size > 10_000
    assert not list(tmp_path.glob("*.partial*"))


def test_settings_refuse_bad_bench_values():
    defaults = load_defaults()
    cs = validate_container("pve1", "105", {}, defaults)
    assert cs.bench_preset == "full" and cs.bench_history_dir == "bench-history"
    for data, words in [
        ({"bench_preset": "fast"}, "field 'bench_preset' = 'fast': not allowed; allowed: 'full' or 'quick'"),
        ({"bench_quick_concurrencies": [4, 4]}, "field 'bench_quick_concurrencies' = [4, 4]: [4] listed more than once"),
        ({"bench_regression_pct": 0}, "field 'bench_regression_pct' = 0"),
        ({"bench_gpu_sample_ms": 10}, "field 'bench_gpu_sample_ms' = 10"),
        ({"bench_low_power_pct": 120}, "field 'bench_low_power_pct' = 120"),
        ({"bench_history_dir": ""}, "field 'bench_history_dir' = ''"),
    ]:
        with pytest.raises(SettingsError) as error:
            validate_container("pve1", "105", data, defaults)
        assert str(error.value).startswith("host pve1, container 105: ")
        assert words in str(error.value), str(error.value)


DEPLOY = '''
import os, sys
from pyinfra import host
from pve_sglang.server.bench_history import run_meta
from pve_sglang.server.bench import metrics_argv, recorded_argv, sampled_argv
from pve_sglang.operations import verify
from pve_sglang.remote import BENCH_RECORD, GPU_SAMPLER, SERVER_METRICS, source
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings

cs = ContainerSettings.model_validate(
    {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields})
code = (
    "import os, sys, time\\n"
    "print('Warmup completed with 1 sequences. Starting main benchmark run...')\\n"
    "open(os.environ['PHASE'], 'w').write('load'); time.sleep(0.5)\\n"
    "sys.stdout.write(open(sys.argv[1]).read())\\n"
    "record = sys.argv[sys.argv.index('--output-file') + 1]\\n"
    "open(record, 'a').write(open(sys.argv[1][:-4] + '.json').read())\\n"
    "open(os.environ['PHASE'], 'w').write('idle')\\n"
)
runs = {int(level): sampled_argv(sys.executable, str(source(GPU_SAMPLER)), 50, metrics_argv(
            sys.executable, str(source(SERVER_METRICS)), os.environ["METRICS_URL"], 100,
            recorded_argv(sys.executable, str(source(BENCH_RECORD)),
                          [sys.executable, "-c", code, path])))
        for level, path in (item.split("=") for item in os.environ["BLOCKS"].split(","))}
verify.benchmark(name="Benchmark", runs=runs, env_file=os.environ["ENV_FILE"],
                 history_dir="bench-history", meta={**run_meta(cs.benchmark, cs.server), "model_path": "kimi"},
                 regression_pct=10, low_power_pct=95)
'''


def test_benchmark_operation_through_the_pyinfra_cli(tmp_path):
    """Two deploys on @local: each saves its table and redraws the plot; the second, from the
    slower recorded run, warns on the drop; GPUs at 90% of their limit are under 95%. Each level
    also reads the stand-in server's /metrics (SGLang's names and types; idle: no request runs)
    through the metrics sampler, and the history keeps its figures."""
    from standin_process import standin

    with standin(tmp_path, "--enable-metrics", key="sk-secret") as url:
        _benchmark_operation(tmp_path, url + "/metrics")


def _benchmark_operation(tmp_path, metrics_url):
    from test_bench_gpu_sampler import FAKE_NVIDIA_SMI

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    (tmp_path / "deploy_bench.py").write_text(DEPLOY)
    env_file = tmp_path / "sglang.env"
    env_file.write_text("SGLANG_API_KEY=sk-secret\n")
    for i, block in enumerate(blocks(H200) + blocks(MI350X)):
        (tmp_path / f"b{i}.txt").write_text(block)
        # The record the benchmark appends: its results and the server's ServerArgs, key included.
        record = {**summary_record(block), "server_info": {"api_key": "sk-secret", "tp_size": 8}}
        (tmp_path / f"b{i}.json").write_text(json.dumps(record) + "\n")
    pyinfra = Path(sys.executable).parent / "pyinfra"
    outputs = []
    for blocks_env in ("1=b0.txt,16=b1.txt,100=b2.txt", "1=b3.txt,16=b4.txt"):
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PHASE": str(tmp_path / "phase"),
               "ENV_FILE": str(env_file), "BLOCKS": blocks_env, "METRICS_URL": metrics_url,
               "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
        done = subprocess.run([str(pyinfra), "@local", "deploy_bench.py", "-y"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout + done.stderr)
    first, second = outputs
    assert "GPU % of power limit" in first and "median ITL ms" in first
    assert "benchmark run saved to bench-history/_local/" in first
    folder = tmp_path / "bench-history" / "_local"
    saved = sorted(folder.glob("*.json"))
    assert len(saved) == 2 and (folder / bench_history.PLOT_NAME).stat().st_size > 10_000
    run = json.loads(saved[-1].read_text())
    assert [r["concurrency"] for r in run["rows"]] == [1, 16]
    assert run["rows"][0]["gpu_count"] == 2 and run["rows"][0]["gpu_power_pct"] > 60
    assert run["rows"][0]["metrics_scrapes"] >= 2
    assert run["rows"][0]["running_reqs_max"] == 0 and run["rows"][0]["queue_reqs_max"] == 0
    assert "KV use" in first and "cache hit" in first and "tuning hint" not in first
    assert "output tok/s fell more than 10% against the run of" in second
    old, new = rows(H200)[1]["output_token_throughput"], rows(MI350X)[1]["output_token_throughput"]
    assert f"concurrency 16: {old:.2f} -> {new:.2f} tok/s (" in second
    assert "of their power limit on average" in second and "max_running_requests" in second
    assert "sk-secret" not in first + second
    # The key is in the env file and in the records the stand-in copied from; nowhere else,
    # the history included, and no record was left where the benchmark ran.
    holding = {path.name for path in tmp_path.rglob("*") if path.is_file()
               and b"sk-secret" in path.read_bytes()}
    assert holding == {"sglang.env"} | {f"b{i}.json" for i in range(5)}
    assert not list(tmp_path.glob("*.jsonl"))
