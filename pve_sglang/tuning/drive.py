"""One container's search, driven: each try applied to its server and measured, written to the
record as it ends, and the server left on the best flags measured, or on those it was found
with, whatever happens.

The server comes as a ``Server``: ``apply`` puts a candidate's flags on it with one restart and
says how the start ended, ``measure`` runs the benchmark for a share of its length and returns
the target level's row (``bench.metric_columns``, ``output_token_throughput``,
``p99_ttft_ms``). ``make tune`` is to give the deploy's own (the tuned file written, the
container phase's restart through the startup watch and the generation check, the benchmark
record and samplers); the tests give a stand-in server.

The rules of "never down or worse":

- the search ends, or is stopped (Ctrl-C, any exception): the best measured (else the flags
  found) are applied and written to the tuned file before ``drive`` returns or raises;
- it is killed (no chance to clean up): its record has no end; the next ``drive`` replays the
  record (no try measured twice), goes on, and ends as above.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pve_sglang.server.startup_log import degenerate, diagnose
from pve_sglang.tuning import record
from pve_sglang.tuning.space import Candidate, changed, key
from pve_sglang.tuning.strategy import Outcome, Proposal, Replayed, Search, Try
from pve_sglang.tuning.tuned_file import render_tuned, write_tuned

#: A startup hint (``startup_log.HINTS``) -> how the try ended.
HINT_ENDINGS = {"cuda-oom": "oom", "sm120-autotune": "stall"}


def ending_of(log_lines: list[str], stalled: bool, answer: str | None) -> str:
    """How a start ended, from the server's log lines (the startup watch's hints), whether it
    fell silent (the watch's stall), and its first answer (the generation check): ``""`` when
    it serves, else ``oom``, ``stall``, ``degenerate`` or ``start``."""
    hints = [hint.name for hint, _ in diagnose(log_lines)]
    for name in hints:
        if name in HINT_ENDINGS and (name != "sm120-autotune" or stalled):
            return HINT_ENDINGS[name]
    if stalled:
        return "stall"
    if answer is None:
        return "start"
    return "degenerate" if degenerate(answer) else ""


@dataclass
class Server:
    """What a search needs of a container's server."""

    #: Put CANDIDATE's flags on the server (one restart); "" when it serves, else how it ended.
    apply: Callable[[Candidate], str]
    #: The benchmark for LENGTH of its whole: the target level's row.
    measure: Callable[[float], dict[str, Any]]


@dataclass
class Drive:
    """The search of one container: its space, where it started, its bounds and files."""

    space: dict[str, tuple]
    found: Candidate
    budget_s: float
    tuned: Path
    objective_level: int
    max_p99_ttft_ms: float | None = None
    low_power_pct: float = 60.0
    clock: Callable[[], float] = time.monotonic

    def run(self, server: Server) -> Search:
        """Search, the record kept; the server left on the best (else the flags found)."""
        path = record.record_path(self.tuned)
        before = record.read(path)
        resumed = before.found is not None and before.ended is None
        found = before.found if resumed else self.found
        if not resumed:
            record.begin(path, found)
        running = {"flags": None if resumed else dict(found)}  # unknown after a kill

        def measure(proposal: Proposal) -> Outcome:
            started = self.clock()
            ended = ""
            if running["flags"] is None or key(running["flags"]) != key(proposal.candidate):
                running["flags"] = None
                ended = server.apply(proposal.candidate)
                running["flags"] = dict(proposal.candidate)
            outcome = Outcome(ended or "start") if ended else self._outcome(
                server.measure(proposal.length))
            outcome.cost_s = self.clock() - started
            record.add(path, Try(proposal, outcome))
            return outcome

        search = Search(self.space, found, self.budget_s, low_power_pct=self.low_power_pct)
        if resumed:
            search.spent_s = 0.0  # the replayed tries' costs add up again as they are handed back
        stopped = "stopped before its end"
        try:
            search.run(Replayed(before.tries, measure) if resumed else measure)
            stopped = search.stopped
        finally:
            best = search.best or found
            if running["flags"] is None or key(running["flags"]) != key(best):
                server.apply(best)
            notes = [f"make tune: {stopped}",
                     f"best: {_text(changed(found, best)) or 'the flags found'} "
                     f"({search.best_score or 0:,.1f} output tok/s at concurrency "
                     f"{self.objective_level}), {len(search.tries)} tries",
                     f"record: {path.name}; the container's own entry wins over these lines"]
            write_tuned(self.tuned, render_tuned(best, notes))
            record.end(path, best, search.best_score, stopped)
        return search

    def _outcome(self, row: dict[str, Any]) -> Outcome:
        objective = row.get("output_token_throughput")
        if not isinstance(objective, (int, float)) or isinstance(objective, bool):
            return Outcome("start", None, row)
        ttft = row.get("p99_ttft_ms")
        if (self.max_p99_ttft_ms is not None and isinstance(ttft, (int, float))
                and ttft > self.max_p99_ttft_ms):
            return Outcome("constraint", None, row)
        return Outcome("measured", float(objective), row)


def _text(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in values.items())
