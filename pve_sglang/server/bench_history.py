"""Benchmark history on the machine running pyinfra: one JSON file per host and run, a plot of
output tok/s against concurrency over the host's runs, and the warnings a run earns (a drop
against the previous comparable run; GPUs far under their power limit at the highest level).

Layout: ``<bench_history_dir>/<host>/<UTC time>.json`` (``host`` with characters other than
letters, digits, ``.``, ``_`` and ``-`` replaced by ``_``; ``@lxc/c1`` -> ``_lxc_c1``) and
``<bench_history_dir>/<host>/output_tok_s.png``. A run file::

    {"host": "@lxc/c1", "time": "2026-12-02T15:58:13Z",
     "meta": {"model_path": ..., "served_model_name": ..., "sglang_version": ...,
              "input_len": ..., "output_len": ..., "preset": ..., "tp_size": ...},
     "rows": [{"concurrency": 1, "output_token_throughput": ..., "median_ttft_ms": ...,
               "median_itl_ms": ..., "gpu_power_pct": ..., "running_reqs_mean": ...,
               "queue_reqs_mean": ..., "token_usage_max": ..., "cache_hit_rate_mean": ...,
               ...}, ...]}

The server's figures (``bench.metric_columns``: running and queued requests, KV cache token
usage, cache hit rate, from its ``/metrics``) are kept per level as they came, and drawn in the
plot's third panel; ``bench_hints`` turns them into tuning hints.

Runs compare only when model, input and output lengths match (``comparable``): a run with other
lengths is plotted but never called a regression.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from typing import Any

from pve_sglang.config.settings import BenchView, ServerView
from pve_sglang.server import bench_hints

PLOT_NAME = "output_tok_s.png"
#: Runs the plot overlays: the newest and the ones before it.
PLOT_RUNS = 6
#: What must match for two runs to compare.
COMPARED_META = ("model_path", "input_len", "output_len")


def host_dir_name(host: str) -> str:
    """HOST as one safe directory name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", host).strip(".")
    return name or "_"


def run_meta(bench: BenchView, server: ServerView) -> dict[str, Any]:
    """What a run was made with, kept beside its table: the BENCH's shape, the SERVER's flags."""
    return {
        "model_path": bench.model_path,
        "served_model_name": bench.served_model_name,
        "sglang_version": server.sglang_version,
        "input_len": bench.bench_input_len,
        "output_len": bench.bench_output_len,
        "preset": bench.bench_preset,
        "tp_size": server.tp_size,
        "max_running_requests": server.max_running_requests,
        "disable_cuda_graph": server.disable_cuda_graph,
        "moe_runner_backend": server.moe_runner_backend,
        "mem_fraction_static": server.mem_fraction_static,
        "enable_metrics": server.enable_metrics,
    }


def _stamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(directory: str | Path, host: str, rows: list[dict[str, Any]], meta: dict[str, Any],
           now: datetime.datetime | None = None) -> Path:
    """Write one run of HOST to DIRECTORY (created when missing); return the file. The file is
    written beside its place and renamed into it, so a reader never sees half a run."""
    moment = now or datetime.datetime.now(datetime.timezone.utc)
    folder = Path(directory) / host_dir_name(host)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = _stamp(moment)
    path = folder / (stamp.replace(":", "") + ".json")
    n = 1
    while path.exists():  # two runs within one second
        n += 1
        path = folder / (stamp.replace(":", "") + f"-{n}.json")
    document = {"host": host, "time": stamp, "meta": meta,
                "rows": sorted(rows, key=lambda r: r["concurrency"])}
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    os.replace(partial, path)
    return path


def load_runs(directory: str | Path, host: str) -> list[dict[str, Any]]:
    """HOST's runs in DIRECTORY, oldest first; files that are not runs are skipped."""
    folder = Path(directory) / host_dir_name(host)
    runs = []
    for path in sorted(folder.glob("*.json")):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(run, dict) and isinstance(run.get("rows"), list) and "time" in run:
            run["_file"] = path.name
            runs.append(run)
    return sorted(runs, key=lambda run: (run["time"], len(run["_file"]), run["_file"]))


def comparable(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two runs measured the same thing (``COMPARED_META``)."""
    return all(a.get("meta", {}).get(key) == b.get("meta", {}).get(key) for key in COMPARED_META)


def _by_level(run: dict[str, Any]) -> dict[int, float]:
    return {row["concurrency"]: row["output_token_throughput"] for row in run["rows"]
            if isinstance(row.get("output_token_throughput"), (int, float))}


def regressions(previous: dict[str, Any], current: dict[str, Any], pct: float) -> list[str]:
    """Levels of both runs where CURRENT's output tok/s is more than PCT percent below
    PREVIOUS's, each as "concurrency C: OLD -> NEW tok/s (-X%)"."""
    before, now = _by_level(previous), _by_level(current)
    drops = []
    for level in sorted(before.keys() & now.keys()):
        if before[level] > 0:
            change = 100 * (now[level] - before[level]) / before[level]
            if change < -pct:
                drops.append(f"concurrency {level}: {before[level]:.2f} -> {now[level]:.2f} "
                             f"tok/s ({change:.0f}%)")
    return drops


def regression_warning(runs: list[dict[str, Any]], pct: float) -> str | None:
    """The warning for the newest of RUNS against the newest comparable one before it."""
    if len(runs) < 2:
        return None
    current = runs[-1]
    previous = next((run for run in reversed(runs[:-1]) if comparable(run, current)), None)
    if previous is None:
        return None
    drops = regressions(previous, current, pct)
    if not drops:
        return None
    return (f"output tok/s fell more than {pct:g}% against the run of {previous['time']}: "
            + "; ".join(drops))


def low_power_hints(meta: dict[str, Any]) -> list[str]:
    """What our users learned keeps GPUs under their power limit, with the run's values."""
    cap = meta.get("max_running_requests")
    return [
        f"max_running_requests caps the batch (now {cap if cap is not None else 'no cap'}): "
        "a cap of 64 throttled the tuned run to a quarter",
        f"CUDA graphs (disable_cuda_graph: {meta.get('disable_cuda_graph')}): decode without "
        "them is launch-bound at small batches",
        f"the MoE backend (moe_runner_backend: {meta.get('moe_runner_backend')}) and its "
        "autotune: an untuned or failed FlashInfer autotune falls back to slow tactics",
    ]


def low_power_warning(run: dict[str, Any], pct: float) -> str | None:
    """A warning when the GPUs of RUN's highest level drew on average under PCT percent of
    their power limit; None when they did not or were not sampled."""
    rows = [row for row in run["rows"] if row.get("gpu_power_pct") is not None]
    if not rows:
        return None
    top = max(rows, key=lambda row: row["concurrency"])
    if top["gpu_power_pct"] >= pct:
        return None
    hints = "; ".join(low_power_hints(run.get("meta", {})))
    return (f"at concurrency {top['concurrency']} the {top.get('gpu_count', '?')} GPU(s) drew "
            f"{top['gpu_power_pct']:.0f}% of their power limit on average "
            f"({top.get('gpu_power_w')} of {top.get('gpu_power_limit_w')} W), under "
            f"{pct:g}%: the server leaves the GPUs idle part of the time; check: {hints}")


def _label(run: dict[str, Any]) -> str:
    meta = run.get("meta", {})
    label = run["time"].replace("T", " ").rstrip("Z")
    extra = meta.get("label") or meta.get("sglang_version")
    return f"{label} ({extra})" if extra else label


def plot(runs: list[dict[str, Any]], path: str | Path, regression_pct: float | None = None,
         title: str | None = None) -> Path:
    """Draw output tok/s against concurrency for the newest ``PLOT_RUNS`` of RUNS (the newest
    bold, with its values), and, where the runs were sampled, the GPUs' mean power draw as a
    share of their limit; levels that fell more than REGRESSION_PCT are marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = runs[-PLOT_RUNS:]
    sampled = any(row.get("gpu_power_pct") is not None for run in shown for row in run["rows"])
    served = any(row.get("running_reqs_mean") is not None for run in shown for row in run["rows"])
    panels = 1 + sampled + served
    fig, axes = plt.subplots(1, panels, figsize=(5 + 6 * (panels - 1) if panels > 1 else 8, 4.8),
                             squeeze=False)
    ax = axes[0][0]
    levels = sorted({row["concurrency"] for run in shown for row in run["rows"]})
    for i, run in enumerate(shown):
        newest = i == len(shown) - 1
        points = sorted(_by_level(run).items())
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", lw=2.4 if newest else 1.2, alpha=1 if newest else 0.55,
                color="#c05621" if newest else None, label=_label(run) + (" (this run)" if newest else ""))
        if newest:
            for x, y in points:
                ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=8)
    if regression_pct is not None and len(shown) >= 2:
        current = shown[-1]
        previous = next((r for r in reversed(shown[:-1]) if comparable(r, current)), None)
        if previous is not None:
            before, now = _by_level(previous), _by_level(current)
            fallen = [lv for lv in sorted(before.keys() & now.keys())
                      if before[lv] > 0 and 100 * (now[lv] - before[lv]) / before[lv] < -regression_pct]
            if fallen:
                ax.scatter(fallen, [now[lv] for lv in fallen], s=160, facecolors="none",
                           edgecolors="#c53030", lw=2, zorder=5,
                           label=f"fell > {regression_pct:g}% vs previous run")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.set_xlabel("concurrent requests (--max-concurrency)")
    ax.set_ylabel("output tokens/s")
    meta = shown[-1].get("meta", {}) if shown else {}
    ax.set_title(title or f"{shown[-1]['host'] if shown else ''}: output tok/s "
                 f"({meta.get('input_len')} in / {meta.get('output_len')} out)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if sampled:
        ax2 = axes[0][1]
        for i, run in enumerate(shown):
            newest = i == len(shown) - 1
            points = sorted((row["concurrency"], row["gpu_power_pct"]) for row in run["rows"]
                            if row.get("gpu_power_pct") is not None)
            if points:
                xs, ys = zip(*points)
                ax2.plot(xs, ys, marker="s", lw=2.4 if newest else 1.2,
                         alpha=1 if newest else 0.55, color="#2b6cb0" if newest else None,
                         label=_label(run))
        ax2.set_xscale("log", base=2)
        ax2.set_xticks(levels, [str(level) for level in levels])
        ax2.set_ylim(0, 105)
        ax2.set_xlabel("concurrent requests")
        ax2.set_ylabel("GPU power draw, % of limit (mean)")
        ax2.set_title("GPU power during the measured run")
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=8)
    if served:
        _server_panel(axes[0][panels - 1], shown, levels)
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial.png")
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, target)
    return target


def _server_panel(ax, shown: list[dict[str, Any]], levels: list[int]) -> None:
    """The server's own figures per level: mean running requests (solid) and queued (dashed)
    of each run, the newest bold, and the newest run's peak KV cache use on a second axis."""
    for i, run in enumerate(shown):
        newest = i == len(shown) - 1
        for key, style in (("running_reqs_mean", "-"), ("queue_reqs_mean", "--")):
            points = sorted((row["concurrency"], row[key]) for row in run["rows"]
                            if isinstance(row.get(key), (int, float)))
            if not points:
                continue
            xs, ys = zip(*points)
            what = "running" if key.startswith("running") else "queued"
            ax.plot(xs, ys, style, marker="o", lw=2.4 if newest else 1.2,
                    alpha=1 if newest else 0.55,
                    color=("#2f855a" if what == "running" else "#b7791f") if newest else None,
                    label=f"{what}: {_label(run)}" if newest or what == "running" else None)
    ax.plot(levels, levels, ":", color="grey", lw=1, label="concurrency asked")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("requests in the server (mean)")
    ax.set_title("server /metrics: running and queued requests")
    ax.grid(True, alpha=0.3)
    usage = sorted((row["concurrency"], row["token_usage_max"]) for row in shown[-1]["rows"]
                   if isinstance(row.get("token_usage_max"), (int, float)))
    if usage:
        twin = ax.twinx()
        xs, ys = zip(*usage)
        twin.plot(xs, ys, marker="^", color="#805ad5", lw=1.6, label="KV cache use (peak)")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("KV cache token usage (peak)")
        twin.legend(fontsize=8, loc="lower right")
    ax.legend(fontsize=8, loc="upper left")


def after_run(directory: str | Path, host: str, rows: list[dict[str, Any]],
              meta: dict[str, Any], regression_pct: float | None, low_power_pct: float | None,
              now: datetime.datetime | None = None) -> tuple[list[str], list[str]]:
    """Record a run, redraw the host's plot; return (what was written, warnings). A
    percentage of None skips its check."""
    saved = record(directory, host, rows, meta, now=now)
    runs = load_runs(directory, host)
    current = json.loads(saved.read_text())
    picture = plot(runs, saved.parent / PLOT_NAME, regression_pct=regression_pct)
    info = [f"benchmark run saved to {saved}",
            f"plot of {min(len(runs), PLOT_RUNS)} run(s): {picture}"]
    warnings = []
    if regression_pct is not None:
        warnings.append(regression_warning(runs, regression_pct))
    if low_power_pct is not None:
        warnings.append(low_power_warning(current, low_power_pct))
    warnings += [f"tuning hint: {hint}" for hint in bench_hints.run_hints(current, low_power_pct)]
    return info, [w for w in warnings if w]
