"""What a search shows its user: a table of every try and a plot of them, from its record
(``tuning.record``), beside the tuned file."""

from __future__ import annotations

from pathlib import Path

from pve_sglang.tuning.record import Record
from pve_sglang.tuning.space import changed

#: The plot's colours: a part of a restart's first measure, a part measured on the same start.
COLOURS = {"first": "#08306b", "on": "#9ecae1"}


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def summary_table(record: Record) -> str:
    """Every try of RECORD as a Markdown table: what it changed from the flags found, its length,
    how it ended, its objective, and why it was tried."""
    found = record.found or {}
    lines = ["| try | changed from the server as found | length | restart s | ended | "
             "output tok/s | why |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for number, done in enumerate(record.tries, 1):
        moved = changed(found, done.proposal.candidate)
        text = ", ".join(f"{k}={v!r}" for k, v in moved.items()) or "(none)"
        lines.append(f"| {number} | {text} | {done.proposal.length:g} | "
                     f"{done.outcome.start_s:.0f} | {done.outcome.ended} | "
                     f"{_shown(done.outcome.objective)} | {done.proposal.why.replace('|', '/')} |")
    if record.ended:
        best = record.ended.get("best") or {}
        moved = changed(found, best)
        lines.append("")
        weight = record.ended.get("weight")
        over = f", measured over {weight:g} of the benchmark" if isinstance(
            weight, (int, float)) and weight else ""
        lines.append(f"best: {', '.join(f'{k}={v!r}' for k, v in moved.items()) or 'as found'} "
                     f"({_shown(record.ended.get('score'))} tok/s{over}); "
                     f"{record.ended.get('stopped')}"
                     + ("" if record.finished else " (the next run goes on from here)"))
    return "\n".join(lines) + "\n"


def plot(record: Record, path: Path, title: str) -> None:
    """Each part's objective (after a restart or on the same start), the failures at 0, the
    best's score, into the PNG at PATH."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for kind, label in (("first", "the first part after a restart"),
                        ("on", "a part on the same start")):
        points = [(n, t.outcome.objective) for n, t in enumerate(record.tries, 1)
                  if t.outcome.ok and (t.outcome.start_s > 0) == (kind == "first")]
        if points:
            tries, objectives = zip(*points)
            ax.scatter(tries, objectives, s=14, color=COLOURS[kind], label=label)
    failed = [n for n, t in enumerate(record.tries, 1) if not t.outcome.ok]
    if failed:
        ax.scatter(failed, [0] * len(failed), marker="x", color="#cb181d", s=20,
                   label="failed (no start, out of memory, stall, degenerate, a bound)")
    score = (record.ended or {}).get("score")
    if isinstance(score, (int, float)):
        ax.axhline(score, color="#238b45", lw=0.8, label="the best's score")
    ax.set_xlabel("try")
    ax.set_ylabel("output tok/s at the target concurrency")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
