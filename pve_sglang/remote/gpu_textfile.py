"""GPU figures for Debian's prometheus-node-exporter: every few seconds, ``nvidia-smi``'s power
draw, power limit, utilisation and memory of each GPU, written as Prometheus text into the
exporter's textfile folder (its textfile collector serves them on the host's /metrics).

    python3 gpu_textfile.py --dir /var/lib/prometheus/node-exporter [--interval-s 5] [--once]

The query and its parser are the GPU sampler's (``gpu_sampler.py``, uploaded beside it). The
file is replaced whole (written beside it, then renamed): the exporter never reads half of it.
Where nvidia-smi fails, the file says so (``pve_sglang_gpu_up 0``) and keeps no stale figure.
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

try:  # uploaded beside this script (remote.COMPANIONS)
    from gpu_sampler import QUERY, parse_line
except ImportError:  # imported as part of pve_sglang (the tests)
    from pve_sglang.remote.gpu_sampler import QUERY, parse_line

FILE_NAME = "pve_sglang_gpu.prom"
#: metric -> (the sample's field, its factor, help text).
METRICS = {
    "pve_sglang_gpu_power_watts": ("power_w", 1, "Power draw of the GPU (W), nvidia-smi"),
    "pve_sglang_gpu_power_limit_watts": ("power_limit_w", 1, "Power limit of the GPU (W)"),
    "pve_sglang_gpu_utilization_ratio": ("util_pct", 0.01, "SM utilisation of the GPU (0-1)"),
    "pve_sglang_gpu_memory_used_bytes": ("memory_used_mib", 1 << 20, "GPU memory in use"),
    "pve_sglang_gpu_memory_total_bytes": ("memory_total_mib", 1 << 20, "GPU memory in all"),
}


def render(samples: list[dict] | None) -> str:
    """The textfile for SAMPLES (``parse_line``'s dicts), None: nvidia-smi failed."""
    lines = ["# HELP pve_sglang_gpu_up 1 when nvidia-smi answered the last sample",
             "# TYPE pve_sglang_gpu_up gauge", f"pve_sglang_gpu_up {0 if samples is None else 1}"]
    for metric, (field, factor, text) in METRICS.items():
        rows = [s for s in samples or () if s.get(field) is not None]
        if not rows:
            continue
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge"]
        lines += [f'{metric}{{gpu="{s["index"]}"}} {s[field] * factor:g}' for s in rows]
    return "\n".join(lines) + "\n"


def sample() -> list[dict] | None:
    """One reading of every GPU; None when nvidia-smi is missing or fails."""
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [s for s in map(parse_line, done.stdout.splitlines()) if s is not None]


def write(folder: str, text: str) -> None:
    """TEXT as FOLDER's textfile, replaced whole."""
    path = os.path.join(folder, FILE_NAME)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as out:
        out.write(text)
    os.chmod(partial, 0o644)
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--interval-s", type=float, default=5)
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args(argv)
    while True:
        write(args.dir, render(sample()))
        if args.once:
            return 0
        time.sleep(args.interval_s)


if __name__ == "__main__":
    sys.exit(main())
