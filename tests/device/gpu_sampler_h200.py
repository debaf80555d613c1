"""The GPU sampler (pve_sglang/remote/gpu_sampler.py) on a real GPU under a real torch load.

    python3 tests/device/gpu_sampler_h200.py --out "$OUT"

Not part of the CPU test suite: run on the device machine (torch with CUDA, nvidia-smi; pynvml
of nvidia-ml-py on PYTHONPATH for the energy counter). For each intensity ("light": a small
matmul with a sleep between launches; "heavy": large bf16 matmuls back to back; "bursty": heavy
for 0.3 s, idle for 0.3 s, as a benchmark level that is not always saturated), the sampler runs
this file's ``--load`` mode as its command, as the
deploy runs the benchmark: the load prints a start marker after a 2 s warmup and a stop marker
when done, so the summary averages the loaded seconds only (the deploy passes the benchmark's
own lines as the markers). Written under
OUT: ``<intensity>_raw.csv`` (nvidia-smi's lines exactly as printed), ``<intensity>_output.txt``
(the command's output and the sampler's summary line), ``summary.json`` (both summaries, the
torch and GPU facts, and whether the heavy load drew more power than the light one).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pve_sglang.remote import gpu_sampler, marked_json  # noqa: E402  (stdlib only, as in the container)

# The load's markers, as the benchmark's "Starting main benchmark run" and result header.
START, STOP = "LOAD STARTS", "LOAD DONE"

INTENSITIES = {
    # size, dtype, sleep between launches (s)
    "light": (1024, "float32", 0.02),
    "heavy": (8192, "bfloat16", 0.0),
    "bursty": (8192, "bfloat16", 0.3),
}
#: Seconds of back-to-back launches between the sleeps of a bursty load.
BURST_S = 0.3


def load(intensity: str, seconds: float) -> None:
    """Matmuls on GPU 0 for SECONDS after a 2 s warmup, with the benchmark's markers."""
    import torch

    size, dtype, pause = INTENSITIES[intensity]
    a = torch.randn(size, size, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(size, size, device="cuda", dtype=getattr(torch, dtype))
    end = time.monotonic() + 2
    while time.monotonic() < end:
        (a @ b).sum().item()
    print(f"warmup done; {START}", flush=True)
    launches = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        burst_end = time.monotonic() + (BURST_S if intensity == "bursty" else 0)
        while True:
            for _ in range(4 if pause and intensity != "bursty" else 16):
                c = a @ b
            torch.cuda.synchronize()
            launches += 4 if pause and intensity != "bursty" else 16
            if time.monotonic() >= burst_end:
                break
        if pause:
            time.sleep(pause)
    tflops = 2 * size**3 * launches / seconds / 1e12
    print(f"{launches} matmuls of {size}x{size} {dtype} in {seconds:.0f}s ({tflops:.1f} TFLOP/s)",
          flush=True)
    print(STOP, flush=True)
    del c


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--interval-ms", type=int, default=500)
    parser.add_argument("--load", choices=sorted(INTENSITIES))
    args = parser.parse_args()
    if args.load:
        load(args.load, args.seconds)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"argv": sys.argv, "interval_ms": args.interval_ms, "seconds": args.seconds}
    for tool, command in {
        "nvidia_smi_query_gpu": ["nvidia-smi", "--query-gpu=index,name,driver_version,power.limit,"
                                 "power.default_limit,memory.total", "--format=csv"],
        "torch": [sys.executable, "-c", "import torch; print(torch.__version__, "
                  "torch.version.cuda, torch.cuda.get_device_name(0))"],
    }.items():
        done = subprocess.run(command, capture_output=True, text=True)
        result[tool] = done.stdout.strip() or done.stderr.strip()
    for intensity in INTENSITIES:
        text = io.StringIO()
        started = time.time()
        rc = gpu_sampler.run(
            [sys.executable, __file__, "--out", str(out), "--seconds", str(args.seconds),
             "--load", intensity],
            args.interval_ms, START, STOP,
            raw_file=str(out / f"{intensity}_raw.csv"), out=text,
        )
        (out / f"{intensity}_output.txt").write_text(text.getvalue())
        result[intensity] = {"rc": rc, "wall_s": round(time.time() - started, 1),
                             "summary": marked_json(gpu_sampler.SUMMARY_PREFIX, text.getvalue())}
        print(intensity, json.dumps(result[intensity]), flush=True)
    try:
        light = result["light"]["summary"]["gpus"][0]["power_w"]
        heavy = result["heavy"]["summary"]["gpus"][0]["power_w"]
        result["heavy_draws_more"] = heavy > light
    except (KeyError, IndexError, TypeError):
        result["heavy_draws_more"] = None
    # The samples' mean against the energy counter's (exact) per load, in percent.
    result["sampled_vs_energy_pct"] = {
        intensity: round(100 * (gpu["sampled_power_w"] - gpu["power_w"]) / gpu["power_w"], 2)
        for intensity in INTENSITIES
        for gpu in (result[intensity]["summary"] or {}).get("gpus", [])[:1]
        if gpu.get("power_source") == "nvml-energy"}
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("heavy_draws_more", "sampled_vs_energy_pct", "torch")}))
    return 0 if result["heavy_draws_more"] else 1


if __name__ == "__main__":
    sys.exit(main())
