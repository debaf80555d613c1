"""The benchmark's printed summary as its JSONL record: for recorded runs that were kept as
printed text only (tests/fixtures/public), so that they go through the deploy's own reading of
a record (``bench.record_row``). The deploy itself reads the record, never this text.
"""

from __future__ import annotations

import re
from typing import Any

from pve_sglang.server.bench import RESULT_HEADER

#: Summary labels as printed ("{:<40} {:<10}".format(label, value); 0.5.9 bench_serving.py and
#: 0.5.23 benchmark/serving.py) -> the record's keys for the same value.
LABELS = {
    "Backend:": "backend",
    "Traffic request rate:": "request_rate",
    "Max request concurrency:": "max_concurrency",
    "Successful requests:": "completed",
    "Benchmark duration (s):": "duration",
    "Total input tokens:": "total_input_tokens",
    "Total generated tokens:": "total_output_tokens",
    "Request throughput (req/s):": "request_throughput",
    "Input token throughput (tok/s):": "input_throughput",
    "Output token throughput (tok/s):": "output_throughput",
    "Peak output token throughput (tok/s):": "max_output_tokens_per_s",
    "Total token throughput (tok/s):": "total_throughput",
    "Concurrency:": "concurrency",
    "Mean E2E Latency (ms):": "mean_e2e_latency_ms",
    "Median E2E Latency (ms):": "median_e2e_latency_ms",
    "Mean TTFT (ms):": "mean_ttft_ms",
    "Median TTFT (ms):": "median_ttft_ms",
    "P99 TTFT (ms):": "p99_ttft_ms",
    "Mean TPOT (ms):": "mean_tpot_ms",
    "Median TPOT (ms):": "median_tpot_ms",
    "Mean ITL (ms):": "mean_itl_ms",
    "Median ITL (ms):": "median_itl_ms",
    "P99 ITL (ms):": "p99_itl_ms",
}


def _number(text: str) -> float | int | str:
    text = text.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def summary_record(text: str) -> dict[str, Any]:
    """The values of the last ``Serving Benchmark Result`` block in TEXT, under the record's
    keys. Raises ValueError when there is no block."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines)
              if RESULT_HEADER in line and line.lstrip().startswith("=")]
    if not starts:
        raise ValueError("no 'Serving Benchmark Result' block")
    record: dict[str, Any] = {}
    for line in lines[starts[-1] + 1:]:
        if re.fullmatch(r"\s*=+\s*", line):
            break
        for label, key in LABELS.items():
            if line.startswith(label):
                record[key] = _number(line[len(label):])
                break
    return record
