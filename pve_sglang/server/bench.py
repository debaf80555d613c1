"""SGLang's serving benchmark: its command line, its record's results, and a table of runs.

Module per release (read from the wheels): ``sglang.bench_serving`` up to 0.5.14;
``sglang.benchmark.serving`` from 0.5.15 (``sglang.bench_serving`` stays as a deprecated shim
there). Dataset ``random-ids`` exists in both 0.5.9 and 0.5.23 and needs no download: prompts are
random token ids (``random`` samples ShareGPT and downloads it unless ``--dataset-path`` is
given). The tokenizer is read from ``model_path`` inside the container.

The benchmark authenticates with ``OPENAI_API_KEY`` from its environment (``Authorization:
Bearer``; 0.5.9 ``bench_serving.py`` and 0.5.23 ``benchmark/serving.py`` alike): ``bench_shell``
exports it from the server's EnvironmentFile, so the key is never on a command line, and its
``benchmark_args=`` line (the argparse Namespace) holds no key. The verify operation masks the
secrets in any benchmark output it shows all the same.

The results are read from the benchmark's JSONL record, not from its printed summary: the record
holds the same figures unrounded, under names that do not move with the print layout. The record
also holds ``server_info`` (the server's ServerArgs, ``api_key`` included), so the benchmark runs
under ``remote/bench_record.py``, which gives it a private record file (0600, removed after) and
prints only the record's numbers (``bench_runs``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pyinfra.api import QuoteString, StringCommand

from pve_sglang import remote
from pve_sglang.config.settings import BenchView
from pve_sglang.server.addresses import base_url
from pve_sglang.runtime.pyinfra_private import joined

RESULT_HEADER = " Serving Benchmark Result "
# Printed once the warmup request is done, before the measured run (0.5.9 bench_serving.py and
# 0.5.23 benchmark/serving.py alike): the GPU sampler averages from here to RESULT_HEADER.
MAIN_RUN_MARKER = "Starting main benchmark run"
# First release whose benchmark lives in sglang/benchmark/serving.py.
BENCHMARK_PACKAGE_FROM = (0, 5, 15)
DATASET = "random-ids"
#: The user's prompts (``bench_prompts_file``) as both releases' benchmark reads them.
PROMPTS_DATASET = "custom"
#: Where the verify phase and ``make tune`` upload ``bench_prompts_file`` in the container.
PROMPTS_IN_CONTAINER = remote.path("bench-prompts.jsonl")

#: The record's results (0.5.9 ``bench_serving.py`` and 0.5.23 ``benchmark/serving.py``: the same
#: keys) -> a row's keys: the names the rows and the saved history have had since they were read
#: from the printed summary (whose labels they follow).
RECORD_KEYS = {
    "backend": "backend",
    "request_rate": "request_rate",
    "max_concurrency": "max_concurrency",
    "completed": "successful_requests",
    "duration": "duration_s",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput",
    "input_throughput": "input_token_throughput",
    "output_throughput": "output_token_throughput",
    "max_output_tokens_per_s": "peak_output_token_throughput",
    "total_throughput": "total_token_throughput",
    # The measured mean number of requests in flight (not the --max-concurrency asked for).
    "concurrency": "mean_concurrency",
    "mean_e2e_latency_ms": "mean_e2e_latency_ms",
    "median_e2e_latency_ms": "median_e2e_latency_ms",
    "mean_ttft_ms": "mean_ttft_ms",
    "median_ttft_ms": "median_ttft_ms",
    "p99_ttft_ms": "p99_ttft_ms",
    "mean_tpot_ms": "mean_tpot_ms",
    "median_tpot_ms": "median_tpot_ms",
    "mean_itl_ms": "mean_itl_ms",
    "median_itl_ms": "median_itl_ms",
    "p99_itl_ms": "p99_itl_ms",
}
REQUIRED = (
    "successful_requests",
    "request_throughput",
    "output_token_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
)


def release_tuple(release: str) -> tuple[int, ...]:
    """``"0.5.12.post1"`` -> ``(0, 5, 12)``: the leading numeric parts."""
    parts = []
    for part in str(release).split("."):
        match = re.match(r"\d+", part)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != part:
            break
    if not parts:
        raise ValueError(f"not a release number: {release!r}")
    return tuple(parts)


def bench_module(release: str) -> str:
    """The benchmark's module for ``python -m``."""
    if release_tuple(release) >= BENCHMARK_PACKAGE_FROM:
        return "sglang.benchmark.serving"
    return "sglang.bench_serving"


def bench_levels(bench: BenchView) -> list[int]:
    """The concurrency levels of the benchmark preset, in the order given."""
    if bench.bench_preset == "quick":
        return list(bench.bench_quick_concurrencies)
    return list(bench.bench_concurrencies)


def num_prompts(bench: BenchView, concurrency: int, share: float = 1.0) -> int:
    """Prompts of the run at CONCURRENCY: ``bench_prompts_per_concurrency`` per concurrent
    request, so that the server holds the level for most of the run, and at least
    ``bench_num_prompts``, so that a low level still averages over some requests. SHARE: the
    part of that a shorter run asks (the tuning search's successive halving), at least one
    prompt per concurrent request."""
    if not 0 < share <= 1:
        raise ValueError(f"benchmark share {share!r}: allowed: above 0, at most 1")
    whole = max(bench.bench_num_prompts, bench.bench_prompts_per_concurrency * concurrency)
    return max(concurrency, math.ceil(whole * share)) if share < 1 else whole


def bench_argv(
    bench: BenchView,
    python: str,
    concurrency: int,
    host: str,
    port: int,
    release: str,
    share: float = 1.0,
) -> list[str]:
    """``python -m <bench module>`` against the running server, one concurrency level, SHARE
    of its prompts (``num_prompts``).

    Lengths are fixed (``--random-range-ratio 1``) so runs compare. No ``--output-file``: run it
    under ``recorded_argv``, which gives it a private one (without, the benchmark writes its
    record, the server's API key inside, to its working directory).
    """
    if concurrency < 1:
        raise ValueError(f"bench concurrency {concurrency}: must be >= 1")
    argv = [python, "-m", bench_module(release), "--backend", "sglang"]
    # --base-url too: 0.5.9 builds http://{host}:{port} itself, unbracketed for IPv6.
    argv += ["--host", host, "--port", str(port), "--base-url", base_url(host, port)]
    argv += ["--model", bench.model_path, "--tokenizer", bench.model_path]
    if bench.served_model_name:
        argv += ["--served-model-name", bench.served_model_name]
    argv += ["--num-prompts", str(num_prompts(bench, concurrency, share))]
    argv += ["--max-concurrency", str(concurrency)]
    if bench.bench_prompts_file:
        # The file's prompts, each asked for bench_output_len tokens (its answers' lengths
        # otherwise: runs would not compare).
        argv += ["--dataset-name", PROMPTS_DATASET, "--dataset-path", PROMPTS_IN_CONTAINER]
        argv += ["--sharegpt-output-len", str(bench.bench_output_len)]
    else:
        argv += ["--dataset-name", DATASET]
        argv += ["--random-input-len", str(bench.bench_input_len)]
        argv += ["--random-output-len", str(bench.bench_output_len)]
        argv += ["--random-range-ratio", "1.0"]
    argv += ["--disable-tqdm"]
    return argv


def recorded_argv(python: str, recorder: str, argv: list[str]) -> list[str]:
    """ARGV run under the uploaded record wrapper (``remote/bench_record.py`` at RECORDER): the
    benchmark's record goes to a private file, removed after; its numbers are printed."""
    return [python, recorder, "--", *argv]


def sampled_argv(python: str, sampler: str, interval_ms: int, argv: list[str]) -> list[str]:
    """ARGV run under the uploaded GPU sampler (``remote/gpu_sampler.py`` at SAMPLER), which
    averages each GPU's nvidia-smi samples over the measured run (its mean power from NVML's
    energy counter where it can be read) and prints them after it."""
    return [python, sampler, "--interval-ms", str(interval_ms),
            "--start-marker", MAIN_RUN_MARKER, "--stop-marker", RESULT_HEADER.strip(), "--", *argv]


def metrics_argv(python: str, scraper: str, url: str, interval_ms: int,
                 argv: list[str]) -> list[str]:
    """ARGV run under the uploaded server metrics sampler (``remote/server_metrics.py`` at
    SCRAPER), which reads the server's /metrics at URL (no key: SGLang serves it without) over
    the measured run and prints the running and queued requests, token usage and cache hit
    rate after it."""
    return [python, scraper, "--url", url, "--interval-ms", str(interval_ms),
            "--start-marker", MAIN_RUN_MARKER, "--stop-marker", RESULT_HEADER.strip(), "--", *argv]


def bench_runs(bench: BenchView, python: str, host: str, release: str,
               sampler: str, recorder: str, scraper: str | None = None,
               levels: list[int] | None = None, share: float = 1.0) -> dict[int, list[str]]:
    """The argv of each level of the preset (or of LEVELS), SHARE of its prompts: the benchmark
    under the record wrapper at RECORDER, under the server metrics sampler at SCRAPER (when
    given and ``enable_metrics`` is on), under the GPU sampler at SAMPLER."""
    runs = {}
    for c in levels or bench_levels(bench):
        argv = recorded_argv(python, recorder, bench_argv(
            bench, python, c, host, bench.server_port, release, share))
        if scraper and bench.enable_metrics:
            url = base_url(host, bench.server_port) + "/metrics"
            argv = metrics_argv(python, scraper, url, bench.bench_metrics_sample_ms, argv)
        runs[c] = sampled_argv(python, sampler, bench.bench_gpu_sample_ms, argv)
    return runs


#: The last line of ``bench_shell``'s output: the benchmark's exit status.
EXIT_STATUS_PREFIX = "BENCH_EXIT_STATUS="


def bench_shell(argv: list[str], env_file: str) -> StringCommand:
    """A ``sh -c`` body running the benchmark with the server's API key (if any) taken from
    ``env_file`` as ``OPENAI_API_KEY``: the key itself never appears in the command or an argv,
    and the env file's other variables (``HF_TOKEN``) are read but not exported.

    It exits 0 whatever the benchmark did, its stderr on stdout, and ends with the benchmark's
    status (``bench_exit_status``): pyinfra prints a failed command's output as it is, and the
    benchmark runs with the key, so the deploy masks its output itself before showing any."""
    return StringCommand(
        ".", joined(QuoteString(env_file), ";"),
        'if [ -n "${SGLANG_API_KEY:-}" ]; then export OPENAI_API_KEY="$SGLANG_API_KEY"; fi;',
        *(QuoteString(arg) for arg in argv), "2>&1;",
        f'echo "{EXIT_STATUS_PREFIX}$?"',
    )


def bench_exit_status(output: str) -> int | None:
    """The benchmark's exit status from ``bench_shell``'s OUTPUT; None when the line is
    missing (the shell itself was killed)."""
    for line in reversed(output.splitlines()):
        if line.startswith(EXIT_STATUS_PREFIX):
            return int(line[len(EXIT_STATUS_PREFIX):])
    return None


def record_row(record: dict[str, Any] | None) -> dict[str, Any]:
    """A row's values (keys of ``RECORD_KEYS``) from the benchmark's record (``bench_record``'s
    ``remote.marked_json``), floats rounded to 2 places as the printed summary shows them.

    Raises ValueError when there is no record or a key metric is missing.
    """
    if record is None:
        raise ValueError("no benchmark record (BENCH_RECORD_JSON line): the benchmark failed "
                         "before writing it, or ran without remote/bench_record.py")
    row: dict[str, Any] = {}
    for key, name in RECORD_KEYS.items():
        value = record.get(key)
        if value is None:
            continue
        row[name] = round(value, 2) if isinstance(value, float) and math.isfinite(value) else value
    missing = [key for key in REQUIRED if key not in row]
    if missing:
        raise ValueError(f"benchmark record lacks {', '.join(missing)}")
    return row


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table, one row per concurrency level (sorted by it).

    Each row: the keys of ``record_row`` plus ``concurrency`` (the level asked for;
    ``max_concurrency`` from the summary when absent), and the GPU columns of ``gpu_columns``
    where sampled. Missing values show as ``-``.
    """
    columns = [
        ("concurrency", "concurrency", "{}"),
        ("output tok/s", "output_token_throughput", "{:.2f}"),
        ("total tok/s", "total_token_throughput", "{:.2f}"),
        ("req/s", "request_throughput", "{:.2f}"),
        ("median TTFT ms", "median_ttft_ms", "{:.2f}"),
        ("median ITL ms", "median_itl_ms", "{:.2f}"),
    ]
    if any("running_reqs_mean" in row for row in rows):
        columns += [
            ("running", "running_reqs_mean", "{:.0f}"),
            ("max running", "running_reqs_max", "{:.0f}"),
            ("queued", "queue_reqs_mean", "{:.0f}"),
            ("KV use", "token_usage_mean", "{:.2f}"),
            ("cache hit", "cache_hit_rate_mean", "{:.2f}"),
        ]
    if any("gpu_power_pct" in row for row in rows):
        columns += [
            ("GPU W", "gpu_power_w", "{:.0f}"),
            ("GPU % of power limit", "gpu_power_pct", "{:.0f}"),
            ("GPU util %", "gpu_util_pct", "{:.0f}"),
            ("GPU mem GiB", "gpu_memory_gib", "{:.1f}"),
        ]
    body = []
    def level(row: dict[str, Any]) -> Any:
        return row.get("concurrency", row.get("max_concurrency"))

    for row in sorted(rows, key=lambda r: level(r) if isinstance(level(r), int) else 0):
        cells = []
        for _, key, fmt in columns:
            value = level(row) if key == "concurrency" else row.get(key)
            cells.append("-" if value is None else fmt.format(value))
        body.append(cells)
    headers = [title for title, _, _ in columns]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in body]
    return "\n".join(lines) + "\n"


def gpu_columns(sampled: dict[str, Any] | None) -> dict[str, Any]:
    """The GPU sampler's summary (``remote.marked_json``) as row values: mean power
    draw (W, per GPU), its share of the limit, SM utilisation (%), averaged over the GPUs, and
    the peak memory used (GiB, the largest GPU's). Empty without samples."""
    gpus = [g for g in (sampled or {}).get("gpus", []) if g.get("samples")]
    if not gpus:
        return {}

    def mean(key: str) -> float | None:
        values = [g[key] for g in gpus if g.get(key) is not None]
        return round(sum(values) / len(values), 2) if values else None

    memory = [g["memory_used_mib"] for g in gpus if g.get("memory_used_mib") is not None]
    return {
        "gpu_count": len(gpus),
        "gpu_power_w": mean("power_w"),
        "gpu_power_limit_w": mean("power_limit_w"),
        "gpu_power_pct": mean("power_pct"),
        "gpu_util_pct": mean("util_pct"),
        "gpu_memory_gib": round(max(memory) / 1024, 2) if memory else None,
    }


#: The server metrics sampler's figures (``server_metrics.summarise``) -> their statistics kept
#: in a row, as ``<figure>_<statistic>``.
METRIC_COLUMNS = {
    "running_reqs": ("mean", "max"),
    "queue_reqs": ("mean", "max"),
    "token_usage": ("mean", "max"),
    "cache_hit_rate": ("mean",),
    "gen_throughput": ("mean",),
}


def metric_columns(sampled: dict[str, Any] | None) -> dict[str, Any]:
    """The server metrics sampler's summary (``remote.marked_json``) as row values:
    the mean (and max) running and queued requests, KV cache token usage (0 to 1), prefix cache
    hit rate and generation throughput over the measured run, with the number of scrapes.
    Empty without a scrape. Only finite numbers are taken: the summary came from the container."""
    if not isinstance(sampled, dict):
        return {}
    found = sampled.get("figures")
    if not isinstance(found, dict) or not sampled.get("scrapes"):
        return {}
    row: dict[str, Any] = {"metrics_scrapes": sampled["scrapes"]}
    for figure, stats in METRIC_COLUMNS.items():
        values = found.get(figure)
        if not isinstance(values, dict):
            continue
        for stat in stats:
            value = values.get(stat)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                row[f"{figure}_{stat}"] = round(float(value), 4)
    return row


def metrics_problem(sampled: dict[str, Any] | None) -> str | None:
    """Why the summary holds no figures (its ``error``), as printable ASCII of bounded length;
    None when it has them or there is no summary."""
    error = sampled.get("error") if isinstance(sampled, dict) else None
    if not error:
        return None
    text = str(error)[:300]
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)
