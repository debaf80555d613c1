"""The benchmark's figure: first-run time, no-op wall time by stage with CPU time, commands by kind."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from devtools.deploy_cost.report import (
    GOAL_FOUR_OVER_ONE,
    GOAL_NOOP_COMMANDS,
    GOAL_NOOP_OVER_FIRST,
)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(n) for n in report["first_run"])
    one = sizes[0]
    noop = [report["noop"][str(n)] for n in sizes]
    med = [s["wall_s"]["median"] for s in noop]
    low = [s["wall_s"]["median"] - s["wall_s"]["min"] for s in noop]
    high = [s["wall_s"]["max"] - s["wall_s"]["median"] for s in noop]
    first = [report["first_run"][str(n)]["wall_s"] for n in sizes]

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.8))
    ax1.bar([str(n) for n in sizes], first, color="#c9a26b")
    for i, v in enumerate(first):
        ax1.text(i, v, f"{v:.1f}s", ha="center", va="bottom")
    ax1.set_title("First run (sets the containers up)")
    ax1.set_xlabel("containers")
    ax1.set_ylabel("wall time [s]")

    x = [str(n) for n in sizes]
    groups = {
        "start: python, imports, inventory, connect": ("Startup", "Setup", "Connect"),
        "prepare (deploy code, facts)": ("Prepare",),
        "execute (operations, facts)": ("Execute",),
        "disconnect, exit": ("Disconnect", "Exit"),
    }
    shades = ["#bee3f8", "#63b3ed", "#2b6cb0", "#a0aec0"]
    bottom = [0.0] * len(sizes)
    for (label, names), color in zip(groups.items(), shades):
        values = [sum((s.get("stage_s_median_run") or s.get("stage_s_median", {})).get(k, 0)
                      for k in names) for s in noop]
        ax2.bar(x, values, bottom=bottom, color=color, label=label, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax2.errorbar(x, med, yerr=[low, high], fmt="o", capsize=5, color="black",
                 label=f"wall time: median, min-max of {noop[0]['wall_s']['n']}")
    ax2.plot(x, [s["cpu_s"]["median"] for s in noop], "x--", color="#9b2c2c", lw=1,
             label="CPU time (pyinfra + its processes), median")
    # Each goal line over the bar it is for.
    if 4 in sizes:
        i4 = sizes.index(4)
        ax2.hlines(GOAL_FOUR_OVER_ONE * med[0], i4 - 0.4, i4 + 0.4, color="#c53030", ls="--",
                   lw=1.5, label=f"goal: 4 containers < {GOAL_FOUR_OVER_ONE} x {one}")
    ax2.hlines(GOAL_NOOP_OVER_FIRST * first[0], -0.4, 0.4, color="#dd6b20", ls=":", lw=2,
               label=f"goal: {one} container < {GOAL_NOOP_OVER_FIRST} x its first run")
    for i, v in enumerate(med):
        ax2.annotate(f"{v:.2f}s", (i, v + high[i]), textcoords="offset points", xytext=(0, 4),
                     ha="center")
    if "against" in report:  # the old revision's medians, from the interleaved runs
        old = report["against"]["summary"]["old"]["wall_s_median"]
        ax2.plot(range(len(sizes)), [old[str(n)] for n in sizes], "kx", ms=9, mew=2,
                 label=f"no-op median, {report['against']['rev']} (old)")
    top = max(max(m + h for m, h in zip(med, high)), GOAL_FOUR_OVER_ONE * med[0],
              max(s["cpu_s"]["median"] for s in noop),
              GOAL_NOOP_OVER_FIRST * first[0],
              *report.get("against", {}).get("summary", {}).get("old", {}).get(
                  "wall_s_median", {}).values())
    ax2.set_ylim(0, top * 1.75)
    ax2.set_title("No-op re-run: wall time (stages: median run)")
    ax2.set_xlabel("containers")
    ax2.set_ylabel("wall time [s]")
    ax2.legend(fontsize=7.5, loc="upper left")

    kinds = ["fact", "op", "connector", "transfer", "other"]
    colors = {"fact": "#2f855a", "op": "#805ad5", "connector": "#718096", "transfer": "#d69e2e",
              "other": "#e53e3e"}
    bottom = [0.0] * len(sizes)
    for kind in kinds:
        values = [statistics.median(r["commands_by_kind"].get(kind, 0) for r in s["runs"]) for s in noop]
        if any(values):
            ax3.bar(x, values, bottom=bottom, color=colors[kind], label=kind)
            bottom = [b + v for b, v in zip(bottom, values)]
    for i, v in enumerate(bottom):  # above the goal line where that is near
        ax3.text(i, max(v, GOAL_NOOP_COMMANDS if i == 0 else 0) * 1.02, f"{v:.0f}", ha="center",
                 va="bottom")
    ax3.hlines(GOAL_NOOP_COMMANDS, -0.4, 0.4, color="#c53030", ls="--", lw=1.5,
               label=f"goal for {one}: < {GOAL_NOOP_COMMANDS}")
    for i, n in enumerate(sizes):
        ax3.text(i, bottom[i] / 2, f"{bottom[i] / n:.0f}\nper\ncontainer", ha="center",
                 va="center", color="white", fontsize=8)
    ax3.set_ylim(0, max(max(bottom), GOAL_NOOP_COMMANDS) * 1.3)
    ax3.set_title("No-op re-run: commands sent (median run)")
    ax3.set_xlabel("containers")
    ax3.set_ylabel("commands (processes)")
    ax3.legend(fontsize=8, loc="upper left")

    fig.suptitle(f"pve-sglang deploy cost on real LXC containers (commit "
                 f"{report['meta'].get('git_commit') or '?'}; {report['meta']['machine']})",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

