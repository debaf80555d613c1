"""The tuning search against the full grid, on the three landscapes of tests/landscapes/.

For each landscape and each seed of its noise, the guided search (``pve_sglang.tuning.strategy``)
runs on the simulator (``tests/tune_sim.py``: the landscape's figures, its noise, its restart
and benchmark times); the grid is every meaningful candidate at the whole benchmark length,
one restart each. Written: ``bench/results/tune_search.json`` (per landscape: the grid's size,
its best and its time; per seed: the search's tries and simulated hours to reach 5% of the
grid's best, its end, its best's share) and ``bench/results/tune_search.png`` (one search: each
try's measured objective by its length, the failures, the best taken).

    .venv/bin/python bench/tune_search.py [--seeds 10]

The times are the landscapes' (a restart of ``costs.start_s``, a whole benchmark of
``costs.bench_s``), not a GPU's; the search's own computing time is measured (wall, this
machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import tune_sim  # noqa: E402
from landscape import Landscape  # noqa: E402
from pve_sglang.tuning.space import grid  # noqa: E402

RESULTS = REPO / "bench" / "results"
LANDSCAPES = sorted((REPO / "tests" / "landscapes").glob("*.yaml"))


def grid_figures(landscape: Landscape) -> dict:
    """The grid: its size, its best, the hours it takes, and the tries until a candidate
    within 5% of the best (in the grid's own order; and on average in a random order)."""
    candidates = grid(landscape.space)
    values = [landscape.objective(c) for c in candidates]
    best = max(v for v in values if v is not None)
    within = [i for i, v in enumerate(values, 1) if v is not None and v >= 0.95 * best]
    costs = landscape.data["costs"]
    per_try = costs["start_s"] + costs["bench_s"]
    return {"candidates": len(candidates), "failing": sum(v is None for v in values),
            "best": round(best, 1), "within_5pct": len(within),
            "hours": round(len(candidates) * per_try / 3600, 1),
            "tries_to_5pct_in_order": within[0],
            "tries_to_5pct_random_mean": round((len(candidates) + 1) / (len(within) + 1), 1)}


def search_figures(landscape: Landscape, seed: int) -> dict:
    started = time.perf_counter()
    run = tune_sim.search(landscape, seed=seed)
    compute_s = time.perf_counter() - started
    reached = tune_sim.reached(landscape, run)
    best = tune_sim.best_of(landscape)[1]
    return {"seed": seed, "tries": len(run.tries), "hours": round(run.spent_s / 3600, 1),
            "failed_tries": sum(not t.outcome.ok for t in run.tries),
            "tries_to_5pct": reached and reached[0],
            "hours_to_5pct": reached and round(reached[1] / 3600, 1),
            "best_share": round((landscape.objective(run.best) or 0) / best, 3),
            "start_share": round((landscape.objective(landscape.start) or 0) / best, 3),
            "noise": round(run.noise, 4), "stopped": run.stopped,
            "compute_s": round(compute_s, 3)}


def plot(landscape: Landscape, seed: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = tune_sim.search(landscape, seed=seed)
    best = tune_sim.best_of(landscape)[1]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colours = {0.25: "#9ecae1", 0.5: "#4292c6", 1.0: "#08306b"}
    for length, colour in colours.items():
        points = [(n, t.outcome.objective) for n, t in enumerate(run.tries, 1)
                  if t.outcome.ok and t.proposal.length == length]
        ax.scatter(*zip(*points), s=14, color=colour, label=f"measured, {length:g} of the run")
    failed = [n for n, t in enumerate(run.tries, 1) if not t.outcome.ok]
    ax.scatter(failed, [0] * len(failed), marker="x", color="#cb181d", s=20,
               label="failed (out of memory, no start, stall, degenerate, bound)")
    steps = [(made, landscape.objective(c)) for made, c, _ in run.bests]
    xs, ys = [], []
    for (made, value), nxt in zip(steps, [*steps[1:], (len(run.tries), None)]):
        xs += [made, nxt[0]]
        ys += [value, value]
    ax.plot(xs, ys, color="#238b45", label="the best taken (its true value)")
    ax.axhline(best, color="grey", ls="--", lw=0.8, label="the grid's best")
    ax.axhline(0.95 * best, color="grey", ls=":", lw=0.8, label="5% below it")
    ax.set_xlabel("try")
    ax.set_ylabel("output tok/s at the target concurrency")
    ax.set_title(f"tuning search on {landscape.name} (seed {seed}): {len(run.tries)} tries, "
                 f"{run.spent_s / 3600:.1f} h simulated; grid: {len(grid(landscape.space))}")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    out = {"seeds": args.seeds, "landscapes": {}}
    for path in LANDSCAPES:
        landscape = Landscape.read(path)
        runs = [search_figures(landscape, seed) for seed in range(args.seeds)]
        hit = [r for r in runs if r["tries_to_5pct"]]
        out["landscapes"][landscape.name] = {
            "grid": grid_figures(landscape),
            "search": {
                "reached_5pct": f"{len(hit)} of {len(runs)}",
                "median_tries_to_5pct": statistics.median(r["tries_to_5pct"] for r in hit),
                "median_hours_to_5pct": statistics.median(r["hours_to_5pct"] for r in hit),
                "median_tries": statistics.median(r["tries"] for r in runs),
                "median_hours": statistics.median(r["hours"] for r in runs),
                "median_best_share": statistics.median(r["best_share"] for r in runs),
                "runs": runs,
            },
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tune_search.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(Landscape.read(REPO / "tests" / "landscapes" / "seed_moe.yaml"), 0,
         RESULTS / "tune_search.png")
    print("| landscape | grid: candidates, hours | grid: tries to 5% (order / random) | "
          "search: reached 5% | tries to 5% | hours to 5% | tries in all | hours in all | "
          "best share |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, figures in out["landscapes"].items():
        g, s = figures["grid"], figures["search"]
        print(f"| {name} | {g['candidates']}, {g['hours']} | {g['tries_to_5pct_in_order']} / "
              f"{g['tries_to_5pct_random_mean']} | {s['reached_5pct']} | "
              f"{s['median_tries_to_5pct']} | {s['median_hours_to_5pct']} | "
              f"{s['median_tries']} | {s['median_hours']} | {s['median_best_share']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
