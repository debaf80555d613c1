"""Server metrics sampler: run a command while the SGLang server's ``/metrics`` is read every
few hundred milliseconds, then print a summary.

    python3 server_metrics.py --url URL --interval-ms N [--start-marker TEXT]
                              [--stop-marker TEXT] -- COMMAND [ARG...]

COMMAND's output (stdout and stderr together) passes through line by line; when it has ended,
one more line follows: ``SERVER_METRICS_JSON {...}``, the running and queued requests, KV cache
token usage, prefix cache hit rate and generation throughput the server reported (``FIGURES``:
mean, min and max of each) over the scrapes taken between the first line holding the start
marker and the first line after it holding the stop marker (``Window``: to the command's end
without a stop, over the whole command without a start). The exit status is COMMAND's; the
environment passes to it unchanged.

The names and types are SGLang's own (``sglang/srt/metrics/collector.py`` in 0.5.9,
``sglang/srt/observability/metrics_collector.py`` in 0.5.23): each a ``Gauge`` labelled by
``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ... (``multiprocess_mode=
"mostrecent"``). A scrape adds the series of one name up (requests, throughput: one series per
scheduler that reports, ``--enable-metrics-for-all-schedulers`` or DP attention) or takes their
largest (token usage, hit rate: shares).

SGLang serves ``/metrics`` without the API key (``sglang/srt/utils/auth.py``), so no key is read
here. What the URL answers is untrusted input: at most ``MAX_BYTES`` are read, the text must be
UTF-8 in Prometheus' text format (parsed by ``prometheus_client``'s parser, which the sglang venv
holds: sglang requires it) for the lines about ``FIGURES`` only (``relevant``: the rest is not
read), a malformed one is named by its number, a non-finite value is dropped, and nothing of it
is run; the summary holds numbers and short messages only.

Standard library and ``prometheus_client`` only: the deploy uploads this file as it is and runs
it with the sglang venv's Python; the deploy's side reads its summary line with
``remote.marked_json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TypeVar

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # a Python without it: the summary says so
    text_string_to_metric_families = None  # type: ignore[assignment]  # None: the parser is missing

SUMMARY_PREFIX = "SERVER_METRICS_JSON "
#: A /metrics answer larger than this is refused (SGLang's, histograms of 8 ranks included, is
#: a few hundred kB).
MAX_BYTES = 8 * 1024 * 1024
#: What is read: SGLang's gauge -> (its key in the summary, how a scrape joins its series).
FIGURES = {
    "sglang:num_running_reqs": ("running_reqs", "sum"),
    "sglang:num_queue_reqs": ("queue_reqs", "sum"),
    "sglang:token_usage": ("token_usage", "max"),
    "sglang:cache_hit_rate": ("cache_hit_rate", "max"),
    "sglang:gen_throughput": ("gen_throughput", "sum"),
}
#: Their Prometheus type in every release read (all ``Gauge``).
TYPE = "gauge"
#: The longest message kept from a failed scrape (it may quote the answer).
MESSAGE_CHARS = 200


class MetricsError(ValueError):
    """A scrape that gave no figures, and why."""


def _short(text: str) -> str:
    text = text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."
    return text.encode("ascii", "backslashreplace").decode()


def _bad_line(text: str) -> str:
    """The first line of TEXT the parser refuses, by number, with the parser's words."""
    for number, line in enumerate(text.splitlines(), 1):
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError as error:
            return f"line {number}: {line[:80]!r} ({error})"
    return "the text as a whole"


def relevant(text: str) -> str:
    """The lines of TEXT about ``FIGURES`` (their samples, ``# HELP`` and ``# TYPE``), blank
    lines for the others, so that line numbers stay. prometheus_client's parser is pure Python
    (about 0.25 ms a line): a TP-8 server's histograms (thousands of lines) would cost more
    than the scrape interval; the figures are a few lines."""
    kept = []
    for line in text.split("\n"):
        if line.startswith("#"):
            words = line.split(None, 3)
            keep = len(words) >= 3 and words[2] in FIGURES
        else:
            keep = line.startswith(_PREFIXES) and line.split("{", 1)[0].split(None, 1)[0] in FIGURES
        kept.append(line if keep else "")
    return "\n".join(kept)


_PREFIXES = tuple(FIGURES)


def figures(text: str) -> dict[str, float]:
    """The ``FIGURES`` of one /metrics answer (Prometheus text format), each series joined as
    ``FIGURES`` says; a name the answer lacks is left out; lines about other metrics are not
    read (``relevant``). Raises MetricsError naming a malformed line, or a known name of
    another type than a gauge."""
    if text_string_to_metric_families is None:
        raise MetricsError("prometheus_client is not importable by this Python")
    text = relevant(text)
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        raise MetricsError(f"malformed /metrics answer: {_short(_bad_line(text))}") from None
    found: dict[str, list[float]] = {}
    for family in families:
        if family.name not in FIGURES:
            continue
        if family.type != TYPE:
            raise MetricsError(f"{family.name} is a {_short(family.type)}, not a {TYPE}")
        found.setdefault(family.name, []).extend(
            float(s.value) for s in family.samples
            if s.name == family.name and math.isfinite(float(s.value)))
    out: dict[str, float] = {}
    for name, values in found.items():
        key, join = FIGURES[name]
        if values:
            out[key] = sum(values) if join == "sum" else max(values)
    return out


def scrape(url: str, timeout_s: float) -> dict[str, float]:
    """``figures`` of URL's answer now; MetricsError when it cannot be read or parsed."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as answer:
            body = answer.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as error:
        hint = ": the server runs without --enable-metrics?" if error.code == 404 else ""
        raise MetricsError(f"HTTP {error.code} from {url}{hint}") from None
    except (OSError, ValueError) as error:
        raise MetricsError(f"cannot read {url}: {_short(str(getattr(error, 'reason', error)))}") from None
    if len(body) > MAX_BYTES:
        raise MetricsError(f"the answer of {url} is larger than {MAX_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MetricsError(f"the answer of {url} is not UTF-8 (byte {error.start})") from None
    return figures(text)


def summarise(scrapes: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per figure: the number of scrapes that held it, its mean, min and max."""
    out = {}
    for key, _ in FIGURES.values():
        values = [s[key] for s in scrapes if key in s]
        if values:
            out[key] = {"scrapes": len(values), "mean": round(sum(values) / len(values), 4),
                        "min": round(min(values), 4), "max": round(max(values), 4)}
    return out


@dataclass
class Window:
    """Where the figures are read: from the first line holding the start marker to the first
    line after it holding the stop marker (to the command's end without one; the whole command
    without a start)."""

    start_marker: str | None
    stop_marker: str | None
    start: float | None = None
    stop: float | None = None

    def see(self, line: str, now: float) -> str | None:
        """LINE of the command's output, read at NOW; the end it marks (``"start"``,
        ``"stop"``), else None."""
        if self.start is None:
            if self.start_marker and self.start_marker in line:
                self.start = now
                return "start"
        elif self.stop is None and self.stop_marker and self.stop_marker in line:
            self.stop = now
            return "stop"
        return None

    def bounds(self, began: float, ended: float) -> tuple[float, float]:
        """The window's first and last second, for a command run from BEGAN to ENDED."""
        if self.start is None:
            return began, ended
        return self.start, self.stop if self.stop is not None else ended

    def heading(self, bounds: tuple[float, float], interval_ms: int) -> dict:
        """A summary's first keys: which window it covers, how long (BOUNDS), how often it was
        sampled; the same for both samplers (this one and ``gpu_sampler.py``)."""
        return {"window": "benchmark" if self.start is not None else "whole command",
                "seconds": round(bounds[1] - bounds[0], 2), "interval_ms": interval_ms}


def follow(command: list[str], window: Window, out, on_end=None) -> int:
    """Run COMMAND, its output (stdout and stderr together) passed to OUT line by line as it
    comes, each line read by WINDOW (ON_END called with each end it marks, at once); its exit
    status. OSError: it could not be started."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None  # stdout=PIPE
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        end = window.see(line, time.monotonic())
        if end and on_end:
            on_end(end)
        out.write(line)
        out.flush()
    return proc.wait()


def wrapped(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The command a sampler runs (what follows ``--``), after the checks both samplers make of
    their arguments; PARSER's error (exit status 2) when one fails."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    if args.interval_ms < 1:
        parser.error("--interval-ms must be >= 1")
    return command


_T = TypeVar("_T")


def inside(timed: list[tuple[float, _T]], bounds: tuple[float, float]) -> list[_T]:
    """The values of TIMED ((second, value) pairs) taken within BOUNDS, both ends included."""
    first, last = bounds
    return [value for when, value in timed if first <= when <= last]


class _Scraper:
    """URL read every INTERVAL_MS in the background; each result kept with its time."""

    def __init__(self, url: str, interval_ms: int):
        self.scrapes: list[tuple[float, dict[str, float]]] = []
        self.errors: list[tuple[float, str]] = []
        self._url, self._interval = url, interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.scrapes.append((began, scrape(self._url, max(1.0, 2 * self._interval))))
            except MetricsError as error:
                self.errors.append((began, str(error)))
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def run(command: list[str], url: str, interval_ms: int, start_marker: str | None,
        stop_marker: str | None, out=None) -> int:
    """Run COMMAND under the sampler (see the module's docstring); return its exit status."""
    out = out or sys.stdout
    scraper = _Scraper(url, interval_ms)
    began = time.monotonic()
    window = Window(start_marker, stop_marker)
    try:
        rc = follow(command, window, out)
    except OSError as error:
        scraper.stop()
        out.write(f"server_metrics: cannot run {command[0]}: {error.strerror or error}\n")
        return 127
    ended = time.monotonic()
    scraper.stop()
    bounds = window.bounds(began, ended)
    taken, errors = inside(scraper.scrapes, bounds), inside(scraper.errors, bounds)
    summary: dict = {**window.heading(bounds, interval_ms), "scrapes": len(taken),
                     "figures": summarise(taken)}
    if errors:
        summary["failed_scrapes"] = len(errors)
        summary["last_error"] = errors[-1]
    if not taken:
        summary["error"] = ("no scrape in the window" + (f"; the last said: {errors[-1]}"
                                                         if errors else ""))
    out.write(SUMMARY_PREFIX + json.dumps(summary) + "\n")
    out.flush()
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--interval-ms", type=int, required=True)
    parser.add_argument("--start-marker")
    parser.add_argument("--stop-marker")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = wrapped(parser, args)
    if not args.url.startswith(("http://", "https://")):
        parser.error("--url must be an http:// or https:// URL")
    return run(command, args.url, args.interval_ms, args.start_marker, args.stop_marker)


if __name__ == "__main__":
    sys.exit(main())
