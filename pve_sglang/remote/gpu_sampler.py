"""GPU sampler: run a command while ``nvidia-smi`` samples every GPU, then print a summary.

    python3 gpu_sampler.py --interval-ms N [--start-marker TEXT] [--stop-marker TEXT]
                           [--raw-file PATH] -- COMMAND [ARG...]

COMMAND's output (stdout and stderr together) passes through line by line; when it has ended,
one more line follows: ``GPU_SAMPLES_JSON {...}``, the power draw, power limit, SM utilisation
and memory use of each GPU averaged over the samples taken between the first line holding the
start marker and the first line holding the stop marker (over the whole command when a marker
never shows). The exit status is COMMAND's. The environment passes to COMMAND unchanged (the
benchmark's API key stays out of every argv), with ``PYTHONUNBUFFERED=1`` so that a Python
COMMAND's lines arrive as they are printed, and the markers with them.

Standard library only: the deploy uploads this file as it is and runs it with the container's
Python; the deploy's side imports ``parse_line``, ``summarise`` and ``parse_summary`` from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

#: The query, in the order ``FIELDS`` names its columns.
QUERY = "index,power.draw,power.limit,utilization.gpu,memory.used,memory.total"
FIELDS = ("index", "power_w", "power_limit_w", "util_pct", "memory_used_mib", "memory_total_mib")
SUMMARY_PREFIX = "GPU_SAMPLES_JSON "


def nvidia_smi_argv(interval_ms: int) -> list[str]:
    """nvidia-smi printing one CSV line per GPU every INTERVAL_MS milliseconds."""
    return ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
            "-lms", str(interval_ms)]


def _value(text: str) -> float | None:
    """A number, or None where nvidia-smi prints ``[N/A]``, ``N/A`` or ``[Not Supported]``."""
    try:
        return float(text)
    except ValueError:
        return None


def parse_line(line: str) -> dict | None:
    """One CSV line of ``QUERY`` as a dict of ``FIELDS``; None for anything else (a blank
    line, an error message)."""
    parts = [part.strip() for part in line.strip().split(",")]
    if len(parts) != len(FIELDS) or not parts[0].isdigit():
        return None
    sample: dict = {"index": int(parts[0])}
    for name, text in zip(FIELDS[1:], parts[1:]):
        sample[name] = _value(text)
    return sample


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 2) if known else None


def summarise(samples: list[dict]) -> list[dict]:
    """Per GPU (by index): the number of samples, mean power draw (W), the power limit (W),
    mean draw as a share of the limit (%), mean SM utilisation (%), peak memory used and the
    memory total (MiB)."""
    by_gpu: dict[int, list[dict]] = {}
    for sample in samples:
        by_gpu.setdefault(sample["index"], []).append(sample)
    gpus = []
    for index, rows in sorted(by_gpu.items()):
        shares = [100 * r["power_w"] / r["power_limit_w"] for r in rows
                  if r["power_w"] is not None and r["power_limit_w"]]
        used = [r["memory_used_mib"] for r in rows if r["memory_used_mib"] is not None]
        gpus.append({
            "index": index,
            "samples": len(rows),
            "power_w": _mean([r["power_w"] for r in rows]),
            "power_limit_w": _mean([r["power_limit_w"] for r in rows]),
            "power_pct": _mean(shares),
            "util_pct": _mean([r["util_pct"] for r in rows]),
            "memory_used_mib": max(used) if used else None,
            "memory_total_mib": _mean([r["memory_total_mib"] for r in rows]),
        })
    return gpus


def parse_summary(text: str) -> dict | None:
    """The last ``GPU_SAMPLES_JSON`` line in TEXT, decoded; None when there is none."""
    for line in reversed(text.splitlines()):
        if line.startswith(SUMMARY_PREFIX):
            return json.loads(line[len(SUMMARY_PREFIX):])
    return None


class _Sampler:
    """nvidia-smi in the background; each of its lines kept with the time it arrived."""

    def __init__(self, interval_ms: int, raw_file: str | None):
        self.lines: list[tuple[float, str]] = []
        self.error: str | None = None
        self._raw = open(raw_file, "w") if raw_file else None
        try:
            self._proc = subprocess.Popen(nvidia_smi_argv(interval_ms), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)
        except OSError as error:
            self._proc = None
            self.error = f"nvidia-smi: {error.strerror or error}"
            return
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            if self._raw:
                self._raw.write(line)
                self._raw.flush()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._thread.join(timeout=5)
            if not self.lines and self._proc.returncode not in (0, -15):
                self.error = f"nvidia-smi exited with {self._proc.returncode}"
        if self._raw:
            self._raw.close()


def run(command: list[str], interval_ms: int, start_marker: str | None,
        stop_marker: str | None, raw_file: str | None = None, out=None) -> int:
    """Run COMMAND under the sampler (see the module's docstring); return its exit status."""
    out = out or sys.stdout
    sampler = _Sampler(interval_ms, raw_file)
    began = time.monotonic()
    start = stop = None
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    except OSError as error:
        sampler.stop()
        out.write(f"gpu_sampler: cannot run {command[0]}: {error.strerror or error}\n")
        return 127
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        out.write(line)
        out.flush()
        now = time.monotonic()
        if start is None and start_marker and start_marker in line:
            start = now
        elif start is not None and stop is None and stop_marker and stop_marker in line:
            stop = now
    rc = proc.wait()
    ended = time.monotonic()
    sampler.stop()
    window_from, window_to = (start, stop or ended) if start is not None else (began, ended)
    samples = [s for t, line in sampler.lines if window_from <= t <= window_to
               for s in [parse_line(line)] if s]
    summary = {
        "window": "benchmark" if start is not None else "whole command",
        "seconds": round(window_to - window_from, 2),
        "interval_ms": interval_ms,
        "gpus": summarise(samples),
    }
    if sampler.error:
        summary["error"] = sampler.error
    elif not samples:
        unparsed = [line for _, line in sampler.lines if not parse_line(line)]
        summary["error"] = ("no sample in the window" + (f"; nvidia-smi said: {unparsed[-1]}"
                                                         if unparsed else ""))
    out.write(SUMMARY_PREFIX + json.dumps(summary) + "\n")
    out.flush()
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval-ms", type=int, required=True)
    parser.add_argument("--start-marker")
    parser.add_argument("--stop-marker")
    parser.add_argument("--raw-file")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    if args.interval_ms < 1:
        parser.error("--interval-ms must be >= 1")
    return run(command, args.interval_ms, args.start_marker, args.stop_marker, args.raw_file)


if __name__ == "__main__":
    sys.exit(main())
