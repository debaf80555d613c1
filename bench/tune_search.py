"""The tuning search side by side with its peers, in one run (``make bench-tune``).

On each landscape of the seed's class (``tests/landscapes/``: the seed's own, a narrow peak by
an out-of-memory cliff, two peaks, a plateau under the noise, the defaults already best; a
restart 420 s, a whole benchmark 600 s) at one noise (4% by default), for each seed and each
budget, three searches on the same simulated server and clock (``tests/tune_sim.py``), in the
same space, from the same start:

- ``pve-sglang``: the project's search through its real ``Drive`` (``tuning.strategy``);
- ``optuna-tpe``: Optuna's TPE sampler with the failed tries as constraints and its Hyperband
  pruner over the parts of a run (``bench/tune_peers.py``);
- ``random``: candidates drawn from the grid, each measured for a whole run.

Each keeps what it measured best; its true objective (the landscape's, without noise) is set
against the grid's true best. Written: ``bench/results/tune_search.json`` (every run;
``tune_search_<landscapes>.json`` for other landscapes, ``..._from_<N>.json`` for other seeds) and
the table of docs/benchmarks.md on stdout (per landscape, budget and search: the kept flags' share
of the true best, median and worst; the seeds within 5%; the tries, restarts and hours, and how
much of the whole benchmark the kept flags were measured for, median).

    .venv/bin/python bench/tune_search.py [--seeds 10] [--first-seed 0] [--hours 8,2] [--noise 4]
        [--landscapes seed_moe,...]

The hours are the landscapes' (simulated), not a GPU's; each search's own computing time is
measured (wall, this machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import tune_peers  # noqa: E402
import tune_sim  # noqa: E402
from landscape import Landscape  # noqa: E402

RESULTS = REPO / "bench" / "results"
SEED_CLASS = ("seed_moe", "cliff_peak", "two_peaks", "plateau", "defaults_best")


def ours(server: tune_sim.SimServer, budget_s: float, seed: int) -> dict:
    """The project's search through its real Drive, on SERVER's clock."""
    with tempfile.TemporaryDirectory() as folder:
        landscape = server.landscape
        bound = landscape.data["workload"].get("max_p99_ttft_ms")
        drive = tune_sim.Drive(landscape.space, landscape.start, budget_s,
                               Path(folder) / "bench.yml",
                               landscape.data["workload"]["concurrency"], bound,
                               clock=server.clock, start_s=landscape.costs["start_s"],
                               bench_s=landscape.costs["bench_s"])
        run = drive.run(server.server())
    return {"best": run.best, "tries": len(run.tries),
            "starts": sum(t.outcome.start_s > 0 for t in run.tries),
            "hours": server.clock.now / 3600, "weight": run.best_weight,
            "stopped": run.stopped}


SEARCHES = {"pve-sglang": ours, "optuna-tpe": tune_peers.optuna_search,
            "random": tune_peers.random_search}


def one(landscape: Landscape, search: str, budget_s: float, seed: int) -> dict:
    server = tune_sim.SimServer(landscape, seed)
    started = time.perf_counter()
    out = SEARCHES[search](server, budget_s, seed)
    out["compute_s"] = round(time.perf_counter() - started, 2)
    out["share"] = round(tune_sim.share(landscape, out["best"]), 4)
    out["seed"] = seed
    out["hours"] = round(out["hours"], 2)
    return out


def plot(landscape: Landscape, seed: int, budget_s: float, path: Path) -> None:
    """One search of the project's on LANDSCAPE: each part's measured objective (the first after
    a restart darker), the failures, the best taken (its true value), the grid's best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory() as folder:
        run, _ = tune_sim.search(landscape, Path(folder), seed, budget_s)
    best = tune_sim.best_of(landscape)[1]
    hours = []
    clock = 0.0
    for done in run.tries:
        clock += done.outcome.cost_s
        hours.append(clock / 3600)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for first, colour, label in ((True, "#08306b", "a part after a restart"),
                                 (False, "#9ecae1", "a part on the same start")):
        points = [(h, t.outcome.objective) for h, t in zip(hours, run.tries)
                  if t.outcome.ok and (t.outcome.start_s > 0) == first]
        if points:
            ax.scatter(*zip(*points), s=12, color=colour, label=label)
    failed = [h for h, t in zip(hours, run.tries) if not t.outcome.ok]
    ax.scatter(failed, [0] * len(failed), marker="x", color="#cb181d", s=20,
               label="failed (out of memory, no start, degenerate, hung, a bound)")
    steps = [(hours[made - 1] if made else 0.0, landscape.objective(c)) for made, c, _ in
             run.bests]
    xs, ys = [], []
    for (at, value), nxt in zip(steps, [*steps[1:], (hours[-1], None)]):
        xs += [at, nxt[0]]
        ys += [value, value]
    ax.plot(xs, ys, color="#238b45", label="the best taken (its true value)")
    ax.axhline(best, color="grey", ls="--", lw=0.8, label="the grid's best")
    ax.axhline(0.95 * best, color="grey", ls=":", lw=0.8, label="5% below it")
    ax.set_xlabel("hours (simulated)")
    ax.set_ylabel("output tok/s at the target concurrency")
    ax.set_title(f"the tuning search on {landscape.name} (seed {seed}, 4% noise): "
                 f"{len(run.tries)} parts, {sum(t.outcome.start_s > 0 for t in run.tries)} "
                 f"restarts, kept {tune_sim.share(landscape, run.best):.3f} of the best")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(runs: list[dict]) -> dict:
    shares = [r["share"] for r in runs]
    return {"median_share": round(statistics.median(shares), 3), "worst_share": min(shares),
            "within_5pct": sum(s >= 0.95 for s in shares), "seeds": len(runs),
            "median_tries": statistics.median(r["tries"] for r in runs),
            "median_starts": statistics.median(r["starts"] for r in runs),
            "median_hours": round(statistics.median(r["hours"] for r in runs), 1),
            "median_kept_length": statistics.median(r["weight"] for r in runs)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--hours", default="8,2", help="budgets, comma separated")
    parser.add_argument("--noise", type=float, default=4.0, help="percent, one whole run")
    parser.add_argument("--landscapes", default=",".join(SEED_CLASS))
    args = parser.parse_args()
    budgets = [float(h) for h in args.hours.split(",")]
    out: dict = {"seeds": args.seeds, "first_seed": args.first_seed, "noise_pct": args.noise,
                 "budgets_h": budgets,
                 "landscapes": {}}
    for name in args.landscapes.split(","):
        landscape = Landscape.read(REPO / "tests" / "landscapes" / f"{name}.yaml",
                                   noise_pct=args.noise)
        best, value = tune_sim.best_of(landscape)
        entry: dict = {"true_best": round(value, 1), "best": best,
                       "start_share": round(tune_sim.share(landscape, landscape.start), 3),
                       "runs": {}}
        for hours in budgets:
            for search in SEARCHES:
                runs = [one(landscape, search, hours * 3600, seed)
                        for seed in range(args.first_seed, args.first_seed + args.seeds)]
                entry["runs"][f"{search} {hours:g}h"] = {"summary": summary(runs), "runs": runs}
                print(f"{name} {search} {hours:g} h: {summary(runs)}", file=sys.stderr)
        out["landscapes"][name] = entry
    RESULTS.mkdir(parents=True, exist_ok=True)
    default = args.landscapes == ",".join(SEED_CLASS)
    name = "tune_search" + ("" if default else "_" + args.landscapes.replace(",", "_")) + (
        "" if args.first_seed == 0 else f"_from_{args.first_seed}")
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    if args.first_seed == 0 and default:
        plot(Landscape.read(REPO / "tests" / "landscapes" / "seed_moe.yaml", noise_pct=args.noise),
             0, budgets[0] * 3600, RESULTS / "tune_search.png")
    print("| landscape (start's share) | budget | search | kept / true best: median, worst | "
          "seeds within 5% | tries | restarts | hours | the kept measured over |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, entry in out["landscapes"].items():
        for label, figures in entry["runs"].items():
            search, hours = label.rsplit(" ", 1)
            s = figures["summary"]
            print(f"| {name} ({entry['start_share']:.2f}) | {hours} | {search} | "
                  f"{s['median_share']:.3f}, {s['worst_share']:.3f} | "
                  f"{s['within_5pct']} of {s['seeds']} | {s['median_tries']:g} | "
                  f"{s['median_starts']:g} | {s['median_hours']:g} | "
                  f"{s['median_kept_length']:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
