"""pve_sglang/remote/gpu_sampler.py as the container runs it: a real process running a real
command, with nvidia-smi replaced by a stand-in script on PATH (this machine has no GPU).

The stand-in prints nvidia-smi's ``--format=csv,noheader,nounits`` lines for the sampler's query
(two GPUs, an H200's 700 W limit and 143771 MiB as recorded in tests/fixtures/h200/nvidia_smi.txt)
every 50 ms, drawing "load" power while a phase file says so. The real H200 recording under a
torch load comes from tests/device/gpu_sampler_h200.py; the window's markers in each release's
benchmark: tests/network/test_bench_gpu_sampler_release.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pve_sglang.server.bench import (
    MAIN_RUN_MARKER,
    RESULT_HEADER,
    bench_runs,
    gpu_columns,
    sampled_argv,
)
from pve_sglang.remote import GPU_SAMPLER, marked_json, source
from pve_sglang.remote import gpu_sampler, server_metrics
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings
from test_server_metrics_sampler import SAMPLER_REFUSALS, START, STOP, WINDOWS

REPO = Path(__file__).resolve().parents[2]
FAKE_NVIDIA_SMI = """#!/bin/sh
# Stand-in for nvidia-smi --query-gpu=...: 2 GPUs every 50 ms, load power while $PHASE says so.
case "$*" in *"--query-gpu=index,power.draw,power.limit,utilization.gpu,memory.used,memory.total"*) ;;
  *) echo "unexpected arguments: $*" >&2; exit 2;; esac
while :; do
  if [ "$(cat "$PHASE" 2>/dev/null)" = load ]; then p=630.50; u=97; m=120512; else p=110.25; u=0; m=0; fi
  echo "0, $p, 700.00, $u, $m, 143771"
  echo "1, [N/A], 700.00, $u, $m, 143771"
  sleep 0.05
done
"""


# Stand-in for nvidia-ml-py's pynvml (no GPU here), on the sampler's PYTHONPATH as the venv's
# would be: two GPUs whose energy counters (mJ) grow at a steady 450.25 W and 300 W, or, with
# STANDIN_NVML=unsupported, refuse as NVML does on GPUs older than Volta. The real counter's
# behaviour on an H200 is recorded in tests/fixtures/h200/gpu_sampler_nvml/.
STANDIN_PYNVML = """
import os, time
class NVMLError(Exception):
    pass
class NVMLError_NotSupported(NVMLError):
    pass
def nvmlInit():
    pass
def nvmlShutdown():
    pass
def nvmlDeviceGetCount():
    return 2
def nvmlDeviceGetHandleByIndex(index):
    return index
def nvmlDeviceGetTotalEnergyConsumption(handle):
    if os.environ.get("STANDIN_NVML") == "unsupported":
        raise NVMLError_NotSupported("Not Supported")
    return int(time.monotonic() * 1000 * (450.25, 300.0)[handle])
"""


def settings(**overrides) -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**data, **overrides})


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """PATH with the stand-in nvidia-smi first; returns the phase file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(0o755)
    phase = tmp_path / "phase"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("PHASE", str(phase))
    return phase


def _load_command(phase: Path, rc: int = 0) -> list[str]:
    """A stand-in benchmark: idle, then the main-run marker and load, then the result header."""
    code = (
        "import os, sys, time\n"
        "print('#Input tokens: 1024'); time.sleep(0.4)\n"
        f"print('Warmup completed with 1 sequences. {MAIN_RUN_MARKER}...')\n"
        f"open({str(phase)!r}, 'w').write('load'); time.sleep(0.8)\n"
        f"open({str(phase)!r}, 'w').write('idle')\n"
        f"print('=' * 12 + {RESULT_HEADER!r} + '=' * 12)\n"
        "print('key seen:', os.environ.get('OPENAI_API_KEY'))\n"
        "time.sleep(0.4)\n"
        f"sys.exit({rc})\n"
    )
    return [sys.executable, "-c", code]


def test_sampler_averages_the_measured_run_only(fake_gpus, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out = io.StringIO()
    raw = tmp_path / "raw.csv"
    rc = gpu_sampler.run(_load_command(fake_gpus, rc=3), 50, MAIN_RUN_MARKER,
                         RESULT_HEADER.strip(), raw_file=str(raw), out=out)
    text = out.getvalue()
    assert rc == 3  # the command's exit status
    assert "#Input tokens: 1024" in text and "key seen: sk-test" in text  # output, env pass
    summary = marked_json(gpu_sampler.SUMMARY_PREFIX, text)
    assert summary["window"] == "benchmark"
    assert 0.5 < summary["seconds"] < 5
    gpu0, gpu1 = summary["gpus"]
    assert (gpu0["index"], gpu1["index"]) == (0, 1)
    assert gpu0["samples"] >= 3
    # Mostly load samples (a boundary sample may be idle): far above the idle 110 W.
    assert gpu0["power_w"] > 450 and gpu0["power_pct"] > 60
    assert gpu0["power_limit_w"] == 700.0 and gpu0["memory_total_mib"] == 143771
    assert gpu0["memory_used_mib"] == 120512
    assert gpu1["power_w"] is None and gpu1["power_pct"] is None  # [N/A] stays unknown
    assert gpu1["util_pct"] > 50
    lines = raw.read_text().splitlines()
    assert lines and all(gpu_sampler.parse_line(line) for line in lines)
    assert len(lines) > 2 * gpu0["samples"]  # the raw file holds the idle samples too


def test_sampler_without_markers_averages_the_whole_command(fake_gpus):
    out = io.StringIO()
    rc = gpu_sampler.run(_load_command(fake_gpus), 50, None, None, out=out)
    summary = marked_json(gpu_sampler.SUMMARY_PREFIX, out.getvalue())
    assert rc == 0
    assert summary["window"] == "whole command"
    assert 110 < summary["gpus"][0]["power_w"] < 630  # idle and load mixed


def test_sampler_without_nvidia_smi_still_runs_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    out = io.StringIO()
    rc = gpu_sampler.run([sys.executable, "-c", "print('benchmark output')"], 50, None, None,
                         out=out)
    summary = marked_json(gpu_sampler.SUMMARY_PREFIX, out.getvalue())
    assert rc == 0 and "benchmark output" in out.getvalue()
    assert summary["gpus"] == [] and summary["error"].startswith("nvidia-smi:")
    assert gpu_columns(summary) == {}


def test_sampler_as_a_script_with_its_argv(fake_gpus, tmp_path):
    """The uploaded file, run as the deploy runs it: ``python gpu_sampler.py ... -- argv``."""
    argv = sampled_argv(sys.executable, str(source(GPU_SAMPLER)), 50, _load_command(fake_gpus))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OPENAI_API_KEY": "sk-x"})
    assert done.returncode == 0, done.stderr
    summary = marked_json(gpu_sampler.SUMMARY_PREFIX, done.stdout)
    assert summary["window"] == "benchmark"
    row = gpu_columns(summary)
    assert row["gpu_count"] == 2 and row["gpu_power_pct"] > 60
    assert row["gpu_memory_gib"] == round(120512 / 1024, 2)
    assert "sk-x" not in " ".join(argv)
    refused = subprocess.run([sys.executable, str(source(GPU_SAMPLER)), "--interval-ms", "50"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "no command given" in refused.stderr


@pytest.mark.parametrize("lines, marks", WINDOWS)
def test_the_gpu_sampler_opens_the_window_the_metrics_sampler_does(lines, marks, tmp_path,
                                                                   monkeypatch):
    """One markers' rule for both samplers: the GPU sampler reads its window with the metrics
    sampler's ``Window`` (its companion), and on that one's table opens a window where it
    does."""
    assert gpu_sampler.Window is server_metrics.Window
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the window alone is read
    out, metrics_out = io.StringIO(), io.StringIO()
    code = "".join(f"print({line!r})\n" for line in lines)
    assert gpu_sampler.run([sys.executable, "-c", code], 50, START, STOP, out=out) == 0
    summary = marked_json(gpu_sampler.SUMMARY_PREFIX, out.getvalue())
    assert summary["window"] == ("benchmark" if marks[0] else "whole command")
    # Both summaries begin alike: the window's name, its length, the interval (a closed port:
    # the metrics sampler's scrapes fail, its window is read all the same).
    assert server_metrics.run([sys.executable, "-c", code], "http://127.0.0.1:9/metrics", 50,
                              START, STOP, out=metrics_out) == 0
    metrics = marked_json(server_metrics.SUMMARY_PREFIX, metrics_out.getvalue())
    assert list(summary)[:3] == list(metrics)[:3] == ["window", "seconds", "interval_ms"]
    assert (summary["window"], summary["interval_ms"]) == (metrics["window"], metrics["interval_ms"])
    # The lines passed through are the command's, in order, on both.
    assert out.getvalue().splitlines()[:-1] == metrics_out.getvalue().splitlines()[:-1] == lines


@pytest.mark.parametrize("args, words", SAMPLER_REFUSALS)
def test_the_gpu_sampler_refuses_the_arguments_the_metrics_sampler_does(args, words, capsys):
    """One check of a sampler's arguments (``server_metrics.wrapped``): the GPU sampler refuses
    each row of the metrics sampler's table with the same words, before anything runs."""
    argv = [*args, "--", sys.executable, "-c", "pass"] if "no command" not in words else args
    with pytest.raises(SystemExit) as stopped:
        gpu_sampler.main(argv)
    assert stopped.value.code == 2 and words in capsys.readouterr().err


def test_parse_line():
    assert gpu_sampler.parse_line("0, 108.45, 700.00, 0, 0, 143771") == {
        "index": 0, "power_w": 108.45, "power_limit_w": 700.0, "util_pct": 0.0,
        "memory_used_mib": 0.0, "memory_total_mib": 143771.0}
    assert gpu_sampler.parse_line("3, [N/A], [Not Supported], 12, 512, 24564")["power_w"] is None
    for junk in ("", "index, power.draw [W]", "NVIDIA-SMI has failed because it couldn't "
                 "communicate with the NVIDIA driver.", "0, 1, 2"):
        assert gpu_sampler.parse_line(junk) is None


def test_bench_runs_follow_the_preset():
    full = settings()
    runs = bench_runs(full, "/opt/sglang/venv/bin/python", "127.0.0.1", "0.5.9",
                      "/opt/sglang/gpu_sampler.py", "/opt/sglang/bench_record.py")
    assert list(runs) == full.bench_concurrencies == [1, 64, 256, 1024]
    argv = runs[1024]
    assert argv[:4] == ["/opt/sglang/venv/bin/python", "/opt/sglang/gpu_sampler.py",
                        "--interval-ms", str(full.bench_gpu_sample_ms)]
    recorded = argv[argv.index("--") + 1:]
    assert recorded[:3] == ["/opt/sglang/venv/bin/python", "/opt/sglang/bench_record.py", "--"]
    bench = recorded[3:]
    assert bench[:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.bench_serving"]
    prompts = {c: int(a[a.index("--num-prompts") + 1]) for c, a in runs.items()}
    assert prompts == {c: max(full.bench_num_prompts, full.bench_prompts_per_concurrency * c)
                       for c in runs}
    assert prompts[1] == full.bench_num_prompts and prompts[1024] == 4 * 1024
    quick = settings(bench_preset="quick", bench_quick_concurrencies=[2, 8])
    assert list(bench_runs(quick, "/py", "::1", "0.5.23", "/s.py", "/r.py")) == [2, 8]


def run_script(fake_gpus: Path, tmp_path: Path, **env) -> dict:
    """The sampler run as the deploy runs it, over the stand-in benchmark; its summary."""
    argv = sampled_argv(sys.executable, str(source(GPU_SAMPLER)), 50, _load_command(fake_gpus))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return marked_json(gpu_sampler.SUMMARY_PREFIX, done.stdout)


def test_sampler_takes_the_mean_power_from_the_standin_nvml_energy_counter(fake_gpus, tmp_path):
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(STANDIN_PYNVML)
    summary = run_script(fake_gpus, tmp_path, PYTHONPATH=str(tmp_path / "nvml"))
    gpu0, gpu1 = summary["gpus"]
    assert "energy_error" not in summary
    # The counters' rate over the window, not the samples' (630.50 W under load, 110.25 idle).
    assert gpu0["power_source"] == gpu1["power_source"] == "nvml-energy"
    assert gpu0["power_w"] == pytest.approx(450.25, rel=0.02)
    assert gpu0["power_pct"] == round(100 * gpu0["power_w"] / 700, 2)
    assert gpu0["sampled_power_w"] > 450 and gpu0["sampled_power_w"] != gpu0["power_w"]
    # A GPU whose power.draw is [N/A] still gets its mean draw from its counter.
    assert gpu1["sampled_power_w"] is None and gpu1["power_w"] == pytest.approx(300, rel=0.02)
    row = gpu_columns(summary)
    assert row["gpu_power_w"] == pytest.approx((450.25 + 300) / 2, rel=0.02)


def test_sampler_falls_back_to_the_samples_without_nvml(fake_gpus, tmp_path):
    """No pynvml (this machine), or a GPU without an energy counter: nvidia-smi's samples,
    and why."""
    summary = run_script(fake_gpus, tmp_path, PYTHONPATH="")
    assert summary["energy_error"].startswith("NVML: ModuleNotFoundError")
    assert all(gpu["power_source"] == "nvidia-smi" for gpu in summary["gpus"])
    assert summary["gpus"][0]["power_w"] == summary["gpus"][0]["sampled_power_w"] > 450
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(STANDIN_PYNVML)
    summary = run_script(fake_gpus, tmp_path, PYTHONPATH=str(tmp_path / "nvml"),
                         STANDIN_NVML="unsupported")
    assert summary["energy_error"] == "NVML energy counter: NVMLError_NotSupported: Not Supported"
    assert summary["gpus"][0]["power_source"] == "nvidia-smi"


def test_energy_power_and_with_energy():
    assert gpu_sampler.energy_power({0: 1_000_000, 1: 5_000}, {0: 1_691_160, 1: 4_000}, 1.0) == {
        0: 691.16}  # GPU 1's counter went back (a driver reload): left out
    assert gpu_sampler.energy_power({0: 0}, {0: 10}, 0) == {}
    gpus = [{"index": 0, "power_w": 139.11, "power_limit_w": 700.0, "power_pct": 19.87},
            {"index": 1, "power_w": 120.0, "power_limit_w": None, "power_pct": None}]
    assert gpu_sampler.with_energy(gpus, {0: 133.18, 1: 100.0}) == [
        {"index": 0, "power_w": 133.18, "power_limit_w": 700.0, "power_pct": 19.03,
         "sampled_power_w": 139.11, "power_source": "nvml-energy"},
        {"index": 1, "power_w": 100.0, "power_limit_w": None, "power_pct": None,
         "sampled_power_w": 120.0, "power_source": "nvml-energy"}]
    assert gpu_sampler.with_energy(gpus[:1], {})[0]["power_source"] == "nvidia-smi"
