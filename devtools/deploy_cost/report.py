"""The benchmark's report: goals, statistics over the runs, the JSON document and the table."""

from __future__ import annotations

import statistics
from typing import Any

from devtools.deploy_cost.counting import summarise_commands

# Goals of issue 7.
GOAL_NOOP_COMMANDS = 40  # commands of a no-op run of one container, fewer than this
GOAL_NOOP_OVER_FIRST = 0.25  # no-op wall time / first-run wall time, less than this
GOAL_FOUR_OVER_ONE = 1.5  # no-op wall time of 4 containers / of 1, less than this
GOAL_FOUR_OVER_ONE_14 = 1.3  # issue 14: the same ratio, at most this


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and the range relative to the median."""
    med = statistics.median(values)
    return {
        "median": round(med, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "range_pct": round(100 * (max(values) - min(values)) / med, 1) if med else 0.0,
        "n": len(values),
    }


def public(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if not k.startswith("_")}


def noop_figures(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Statistics of the no-op runs RUNS of N containers."""
    return {
        "wall_s": spread([r["wall_s"] for r in runs]),
        "cpu_s": spread([r["cpu_s"] for r in runs]),
        "cpu_pyinfra_s": spread([r["cpu_pyinfra_s"] for r in runs]),
        "cpu_commands_s": spread([r["cpu_commands_s"] for r in runs]),
        "commands": spread([r["commands"] for r in runs]),
        "commands_per_container": round(statistics.median(r["commands"] for r in runs) / n, 1),
        "changes": [r["changes"] for r in runs],
        "restart_commands": sum(len(r["restart_commands"]) for r in runs),
        # the stages of the run with the median wall time (the lower one of two middles)
        "stage_s_median_run": sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2][
            "stage_s"],
        "prepare_overlap": statistics.median(r["prepare_overlap"] for r in runs),
        "execute_overlap": statistics.median(r["execute_overlap"] for r in runs),
        "runs": [public(r) for r in runs],
    }


def size_ratios(stats: dict[str, dict], sizes: list[int]) -> dict[str, float]:
    """Median no-op wall time of each larger size over the smallest's."""
    one = sizes[0]
    med = {n: stats[str(n)]["wall_s"]["median"] for n in sizes}
    return {f"noop_{n}_over_{one}": round(med[n] / med[one], 3) for n in sizes[1:]}


def comparison(noop_stats: dict[str, dict], old: dict[int, list[dict]], sizes: list[int],
               against: dict[str, Any]) -> dict[str, Any]:
    """The ``--against`` revision's no-op figures beside this checkout's, from runs interleaved
    with them (old 1, new 1, old 2, new 2, ... per rep)."""
    old_stats = {str(n): noop_figures(old[n], n) for n in sizes}
    summary = {}
    for name, stats in (("old", old_stats), ("new", noop_stats)):
        summary[name] = {
            "commands_per_container": {str(n): stats[str(n)]["commands_per_container"]
                                       for n in sizes},
            "wall_s_median": {str(n): stats[str(n)]["wall_s"]["median"] for n in sizes},
            "cpu_s_median": {str(n): stats[str(n)]["cpu_s"]["median"] for n in sizes},
            "ratios": size_ratios(stats, sizes),
            "changes": max(max(stats[str(n)]["changes"]) for n in sizes),
            "restart_commands": sum(stats[str(n)]["restart_commands"] for n in sizes),
        }
    profile = summarise_commands(old[sizes[0]][-1]["_commands"])
    return {**against, "summary": summary, "noop": old_stats,
            "profile_noop_1": {k: profile[k] for k in ("commands", "by_kind", "by_host")}
            | {"by_fact": profile["by_fact"][:25]}}


def build_report(first: dict[int, dict], noop: dict[int, list[dict]], snapshots_ok: dict[int, bool],
                 meta: dict[str, Any], old: dict[int, list[dict]] | None = None,
                 against: dict[str, Any] | None = None) -> dict[str, Any]:
    sizes = sorted(first)
    one = sizes[0]
    noop_stats = {}
    for n in sizes:
        noop_stats[str(n)] = noop_figures(noop[n], n) | {"state_unchanged": snapshots_ok[n]}
    med = {n: noop_stats[str(n)]["wall_s"]["median"] for n in sizes}
    ratios = {
        f"noop_over_first_{n}": round(med[n] / first[n]["wall_s"], 3) for n in sizes
    }
    for n in sizes[1:]:
        ratios[f"noop_{n}_over_{one}"] = round(med[n] / med[one], 3)
        ratios[f"first_{n}_over_{one}"] = round(first[n]["wall_s"] / first[one]["wall_s"], 3)
    one_cmds = noop_stats[str(one)]["commands"]["median"]
    goals = {
        "noop_commands_1": {"goal": f"< {GOAL_NOOP_COMMANDS}", "value": one_cmds,
                            "met": one_cmds < GOAL_NOOP_COMMANDS},
        "noop_over_first_1": {"goal": f"< {GOAL_NOOP_OVER_FIRST}",
                              "value": ratios[f"noop_over_first_{one}"],
                              "met": ratios[f"noop_over_first_{one}"] < GOAL_NOOP_OVER_FIRST},
        "noop_changes": {"goal": "0", "value": max(max(s["changes"]) for s in noop_stats.values()),
                         "met": all(max(s["changes"]) == 0 for s in noop_stats.values())},
        "noop_restarts": {
            "goal": "0",
            "value": sum(s["restart_commands"] for s in noop_stats.values()),
            "met": all(s["restart_commands"] == 0 and s["state_unchanged"]
                       for s in noop_stats.values()),
        },
    }
    if 4 in sizes and 1 in sizes:
        goals["noop_4_over_1"] = {"goal": f"< {GOAL_FOUR_OVER_ONE}", "value": ratios["noop_4_over_1"],
                                  "met": ratios["noop_4_over_1"] < GOAL_FOUR_OVER_ONE}
        goals["noop_4_over_1_issue_14"] = {
            "goal": f"<= {GOAL_FOUR_OVER_ONE_14}", "value": ratios["noop_4_over_1"],
            "met": ratios["noop_4_over_1"] <= GOAL_FOUR_OVER_ONE_14}
    profiles = {}
    for n in (sizes[0], sizes[-1]):
        summary = summarise_commands(noop[n][-1]["_commands"])
        summary["by_fact"] = summary["by_fact"][:25]
        summary["by_operation"] = summary["by_operation"][:25]
        summary["repeated_facts"] = summary["repeated_facts"][:25]
        profiles[f"noop_{n}"] = summary
    first_profile = summarise_commands(first[one]["_commands"])
    report = {
        "meta": meta,
        "first_run": {str(n): public(first[n]) for n in sizes},
        "noop": noop_stats,
        "ratios": ratios,
        "goals": goals,
        "profile": profiles,
        "first_run_profile_1": {
            "commands": first_profile["commands"],
            "by_kind": first_profile["by_kind"],
            "by_operation": sorted(first_profile["by_operation"], key=lambda r: -r["seconds"])[:12],
        },
    }
    if old and against:
        report["against"] = comparison(noop_stats, old, sizes, against)
    return report


def print_table(report: dict[str, Any]) -> None:
    sizes = sorted(int(n) for n in report["first_run"])
    head = (f"{'containers':>10} | {'first run':>9} | {'no-op median (min-max)':>24} | "
            f"{'no-op CPU':>9} | {'commands':>8} | {'per ct':>6} | {'changes':>7} | "
            f"{'restarts':>8} | {'no-op/first':>11}")
    print()
    print(head)
    print("-" * len(head))
    for n in sizes:
        f = report["first_run"][str(n)]
        s = report["noop"][str(n)]
        w = s["wall_s"]
        timing = f"{w['median']:.2f}s ({w['min']:.2f}-{w['max']:.2f})"
        print(f"{n:>10} | {f['wall_s']:>8.1f}s | {timing:>24} | {s['cpu_s']['median']:>8.2f}s | "
              f"{s['commands']['median']:>8.0f} | {s['commands_per_container']:>6.1f} | "
              f"{max(s['changes']):>7} | {s['restart_commands']:>8} | "
              f"{report['ratios'][f'noop_over_first_{n}']:>11.3f}")
    print(f"  ({report['meta']['reps']} no-op runs per size, interleaved; CPU: pyinfra and every "
          "process it waited for)")
    print()
    for key, value in report["ratios"].items():
        print(f"  {key}: {value}")
    print()
    for key, goal in report["goals"].items():
        print(f"  goal {key} {goal['goal']}: {goal['value']} -> {'met' if goal['met'] else 'MISSED'}")
    if "against" in report:
        print_comparison(report["against"], sizes)
    prof = report["profile"][f"noop_{sizes[0]}"]
    print(f"\n  no-op run, {sizes[0]} container: {prof['commands']} commands {prof['by_kind']}, "
          f"by host {prof['by_host']}")
    for row in prof["by_fact"][:10]:
        print(f"    fact {row['name']}: {row['commands']} commands, {row['seconds']:.2f}s")
    print()



def print_comparison(against: dict[str, Any], sizes: list[int]) -> None:
    """Old (``--against``) and new side by side: commands per container, median wall and CPU
    per size, the size ratios."""
    summary = against["summary"]
    print(f"  no-op, {against['rev']} ({against['commit']}) against this checkout "
          f"({against['new_commit']}), runs interleaved:")
    ratio_names = [k.removeprefix("noop_").replace("_over_", "/") for k in summary["new"]["ratios"]]
    print(f"    {'':>4} | {'cmds/ct':>7} | "
          + " | ".join(f"{f'wall {n} (CPU)':>15}" for n in sizes)
          + " | " + " | ".join(f"{r:>5}" for r in ratio_names))
    for name in ("old", "new"):
        s = summary[name]
        walls = [f"{s['wall_s_median'][str(n)]:.2f}s ({s['cpu_s_median'][str(n)]:.2f}s)"
                 for n in sizes]
        print(f"    {name:>4} | {s['commands_per_container'][str(sizes[0])]:>7.1f} | "
              + " | ".join(f"{w:>15}" for w in walls)
              + " | " + " | ".join(f"{v:>5.2f}" for v in s["ratios"].values()))
    print()
