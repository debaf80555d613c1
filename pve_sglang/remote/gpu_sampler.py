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

The mean power draw comes from NVML's energy counter where it can be read
(``nvmlDeviceGetTotalEnergyConsumption``, through ``pynvml`` of nvidia-ml-py, which the sglang
venv holds): the energy used between the window's two ends over its length, exact where samples
only estimate; ``power_source`` says which (``nvml-energy``, else ``nvidia-smi``, with
``energy_error`` saying why), and ``sampled_power_w`` keeps the samples' mean.

Standard library only (``pynvml`` where present), and its companion ``server_metrics.py``
(uploaded beside it, ``remote.COMPANIONS``), which holds what both samplers do alike: the
markers' rule (``Window``, with the summary's first keys), the command run and its lines passed
through (``follow``), the checks of the arguments (``wrapped``). The deploy uploads this file as it is and runs it with the container's Python; the
deploy's side imports ``parse_line`` and ``summarise`` from it, and reads the summary line with
``remote.marked_json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

try:  # uploaded beside this script (remote.COMPANIONS)
    from server_metrics import Window, follow, wrapped
except ImportError:  # imported as part of pve_sglang (the deploy's side, the tests)
    from pve_sglang.remote.server_metrics import Window, follow, wrapped

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


def energy_power(start: dict[int, int], stop: dict[int, int], seconds: float) -> dict[int, float]:
    """Mean power (W) per GPU from NVML's energy counter (mJ) read at both ends of a window of
    SECONDS; GPUs read at one end only, or whose counter went back (a driver reload), left out."""
    if seconds <= 0:
        return {}
    return {index: round((stop[index] - start[index]) / 1000 / seconds, 2)
            for index in sorted(start.keys() & stop.keys()) if stop[index] >= start[index]}


def with_energy(gpus: list[dict], power: dict[int, float]) -> list[dict]:
    """GPUS (``summarise``) with POWER (``energy_power``) as their mean draw, and its share of
    the limit; the samples' mean kept as ``sampled_power_w``."""
    out = []
    for gpu in gpus:
        gpu = {**gpu, "sampled_power_w": gpu["power_w"], "power_source": "nvidia-smi"}
        if gpu["index"] in power:
            gpu["power_w"] = power[gpu["index"]]
            gpu["power_source"] = "nvml-energy"
            limit = gpu.get("power_limit_w")
            gpu["power_pct"] = round(100 * gpu["power_w"] / limit, 2) if limit else None
        out.append(gpu)
    return out


class _Sampler:
    """nvidia-smi in the background; each of its lines kept with the time it arrived."""

    def __init__(self, interval_ms: int, raw_file: str | None):
        self.lines: list[tuple[float, str]] = []
        self.error: str | None = None
        self._raw = open(raw_file, "w") if raw_file else None
        try:
            self._proc: subprocess.Popen[str] | None = subprocess.Popen(
                nvidia_smi_argv(interval_ms), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as error:
            self._proc = None
            self.error = f"nvidia-smi: {error.strerror or error}"
            return
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None  # started with a pipe
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


class _Energy:
    """NVML's total energy counter of every GPU (mJ since the driver loaded), when pynvml and
    the NVML library load and the GPUs support it (Volta and later); else ``error`` says why."""

    def __init__(self):
        self.error: str | None = None
        self._nvml = None
        self._handles: dict = {}
        try:
            import pynvml  # nvidia-ml-py, in the sglang venv; optional
        except ImportError as error:
            self.error = f"NVML: {type(error).__name__}: {error}"
            return
        try:
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())}
        except Exception as error:  # NVMLError_LibraryNotFound (no driver), ...
            self.error = f"NVML: {type(error).__name__}: {error}"

    def read(self) -> dict[int, int] | None:
        """Each GPU's counter now; None (and ``error``) when one cannot be read."""
        if self._nvml is None or not self._handles:
            return None
        try:
            return {i: int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
                    for i, handle in self._handles.items()}
        except Exception as error:  # NVMLError_NotSupported on older GPUs
            self.error = f"NVML energy counter: {type(error).__name__}: {error}"
            self._nvml = None
            return None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


def run(command: list[str], interval_ms: int, start_marker: str | None,
        stop_marker: str | None, raw_file: str | None = None, out=None) -> int:
    """Run COMMAND under the sampler (see the module's docstring); return its exit status."""
    out = out or sys.stdout
    sampler = _Sampler(interval_ms, raw_file)
    energy = _Energy()
    began = time.monotonic()
    at_began = energy.read()
    window = Window(start_marker, stop_marker)
    at_ends: dict = {}  # the energy counter read at each end the window marks, at once
    try:
        rc = follow(command, window, out, lambda end: at_ends.update({end: energy.read()}))
    except OSError as error:
        sampler.stop()
        energy.close()
        out.write(f"gpu_sampler: cannot run {command[0]}: {error.strerror or error}\n")
        return 127
    ended = time.monotonic()
    at_start, at_stop = at_ends.get("start"), at_ends.get("stop")
    at_ended = energy.read()
    sampler.stop()
    energy.close()
    window_from, window_to = window.bounds(began, ended)
    first, last = ((at_start, at_stop if window.stop is not None else at_ended)
                   if window.start is not None else (at_began, at_ended))
    samples = [s for t, line in sampler.lines if window_from <= t <= window_to
               for s in [parse_line(line)] if s]
    power = energy_power(first, last, window_to - window_from) if first and last else {}
    summary = {**window.heading((window_from, window_to), interval_ms),
               "gpus": with_energy(summarise(samples), power)}
    if energy.error:
        summary["energy_error"] = energy.error
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
    return run(wrapped(parser, args), args.interval_ms, args.start_marker, args.stop_marker, args.raw_file)


if __name__ == "__main__":
    sys.exit(main())
