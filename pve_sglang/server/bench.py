"""SGLang's serving benchmark: its command line, its summary block, and a table of runs.

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
"""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import QuoteString, StringCommand

from pve_sglang.config.settings import ContainerSettings, base_url
from pve_sglang.runtime.pyinfra_private import joined

RESULT_HEADER = " Serving Benchmark Result "
# Printed once the warmup request is done, before the measured run (0.5.9 bench_serving.py and
# 0.5.23 benchmark/serving.py alike): the GPU sampler averages from here to RESULT_HEADER.
MAIN_RUN_MARKER = "Starting main benchmark run"
# First release whose benchmark lives in sglang/benchmark/serving.py.
BENCHMARK_PACKAGE_FROM = (0, 5, 15)
DATASET = "random-ids"

# Summary labels as printed by the release ("{:<40} {:<10}".format(label, value)).
LABELS = {
    "Backend:": "backend",
    "Traffic request rate:": "request_rate",
    "Max request concurrency:": "max_concurrency",
    "Successful requests:": "successful_requests",
    "Benchmark duration (s):": "duration_s",
    "Total input tokens:": "total_input_tokens",
    "Total generated tokens:": "total_output_tokens",
    "Request throughput (req/s):": "request_throughput",
    "Input token throughput (tok/s):": "input_token_throughput",
    "Output token throughput (tok/s):": "output_token_throughput",
    "Peak output token throughput (tok/s):": "peak_output_token_throughput",
    "Total token throughput (tok/s):": "total_token_throughput",
    # The measured mean number of requests in flight (not the --max-concurrency asked for).
    "Concurrency:": "mean_concurrency",
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


def bench_levels(settings: ContainerSettings) -> list[int]:
    """The concurrency levels of the benchmark preset, in the order given."""
    if settings.bench_preset == "quick":
        return list(settings.bench_quick_concurrencies)
    return list(settings.bench_concurrencies)


def num_prompts(settings: ContainerSettings, concurrency: int) -> int:
    """Prompts of the run at CONCURRENCY: ``bench_prompts_per_concurrency`` per concurrent
    request, so that the server holds the level for most of the run, and at least
    ``bench_num_prompts``, so that a low level still averages over some requests."""
    return max(settings.bench_num_prompts, settings.bench_prompts_per_concurrency * concurrency)


def bench_argv(
    settings: ContainerSettings,
    python: str,
    concurrency: int,
    host: str,
    port: int,
    release: str,
    output_file: str | None = None,
) -> list[str]:
    """``python -m <bench module>`` against the running server, one concurrency level.

    Lengths are fixed (``--random-range-ratio 1``) so runs compare. ``output_file``: where the
    benchmark appends its JSONL record (without it, a file in the working directory).
    """
    if concurrency < 1:
        raise ValueError(f"bench concurrency {concurrency}: must be >= 1")
    argv = [python, "-m", bench_module(release), "--backend", "sglang"]
    # --base-url too: 0.5.9 builds http://{host}:{port} itself, unbracketed for IPv6.
    argv += ["--host", host, "--port", str(port), "--base-url", base_url(host, port)]
    argv += ["--model", settings.model_path, "--tokenizer", settings.model_path]
    if settings.served_model_name:
        argv += ["--served-model-name", settings.served_model_name]
    argv += ["--num-prompts", str(num_prompts(settings, concurrency))]
    argv += ["--max-concurrency", str(concurrency)]
    argv += ["--dataset-name", DATASET]
    argv += ["--random-input-len", str(settings.bench_input_len)]
    argv += ["--random-output-len", str(settings.bench_output_len)]
    argv += ["--random-range-ratio", "1.0"]
    argv += ["--disable-tqdm"]
    if output_file:
        argv += ["--output-file", output_file]
    return argv


def sampled_argv(python: str, sampler: str, interval_ms: int, argv: list[str]) -> list[str]:
    """ARGV run under the uploaded GPU sampler (``remote/gpu_sampler.py`` at SAMPLER), which
    averages each GPU's nvidia-smi samples over the measured run and prints them after it."""
    return [python, sampler, "--interval-ms", str(interval_ms),
            "--start-marker", MAIN_RUN_MARKER, "--stop-marker", RESULT_HEADER.strip(), "--", *argv]


def bench_runs(settings: ContainerSettings, python: str, host: str, release: str,
               sampler: str) -> dict[int, list[str]]:
    """The argv of each level of the preset, each under the GPU sampler at SAMPLER."""
    return {
        c: sampled_argv(python, sampler, settings.bench_gpu_sample_ms,
                        bench_argv(settings, python, c, host, settings.server_port, release))
        for c in bench_levels(settings)
    }


def bench_shell(argv: list[str], env_file: str) -> StringCommand:
    """A ``sh -c`` body running the benchmark with the server's API key (if any) taken from
    ``env_file`` as ``OPENAI_API_KEY``: the key itself never appears in the command or an argv,
    and the env file's other variables (``HF_TOKEN``) are read but not exported."""
    return StringCommand(
        ".", joined(QuoteString(env_file), ";"),
        'if [ -n "${SGLANG_API_KEY:-}" ]; then export OPENAI_API_KEY="$SGLANG_API_KEY"; fi;',
        "exec", *(QuoteString(arg) for arg in argv),
    )


def _number(text: str) -> float | int | str:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_bench_output(text: str) -> dict[str, Any]:
    """Values of the last ``Serving Benchmark Result`` block in ``text`` (keys from ``LABELS``).

    Raises ValueError when there is no block or a key metric is missing.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if RESULT_HEADER in line and line.lstrip().startswith("=")]
    if not starts:
        raise ValueError("no 'Serving Benchmark Result' block in the benchmark output")
    result: dict[str, Any] = {}
    for line in lines[starts[-1] + 1 :]:
        if re.fullmatch(r"\s*=+\s*", line):
            break
        for label, key in LABELS.items():
            if line.startswith(label):
                result[key] = _number(line[len(label) :])
                break
    missing = [key for key in REQUIRED if key not in result]
    if missing:
        raise ValueError(f"benchmark summary lacks {', '.join(missing)}")
    return result


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table, one row per concurrency level (sorted by it).

    Each row: the keys of ``parse_bench_output`` plus ``concurrency`` (the level asked for;
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
    """The GPU sampler's summary (``gpu_sampler.parse_summary``) as row values: mean power
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
