"""One container's search, driven: each try applied to its server and measured, written to the
record as it ends, and the server left serving the best flags measured, or those it was found
with, whatever happens.

The server comes as a ``Server``: ``apply`` puts a candidate's flags on it with one restart and
says how the start ended (the startup watch, the generation check); ``measure`` runs the
benchmark for a share of its length within a time limit and returns the target level's row
(``bench.metric_columns``, ``output_token_throughput``, ``p99_ttft_ms``). ``make tune`` gives
the deploy's own (``tuning.deployed``); the tests give a stand-in server or a simulated one on
a simulated clock (``tests/tune_sim.py``).

The rules of "never down or worse":

- a restart only when the flags change: parts of the benchmark on the same flags follow each
  other on one start, and so do tries that move only the benchmark's side (``space.CLIENT_SIDE``:
  the concurrency measured at), each measured at its own level;
- the objective is the server's own steady-state generation throughput over the benchmark's
  measured window (``gen_throughput_mean`` of its /metrics), where the row has it from at
  least ``MIN_SCRAPES`` reads, else the benchmark's output tok/s; one source for a whole search;
- a benchmark that fails or runs past its limit (a hung server) leaves the running flags
  unknown: the next try, or the end, restarts;
- the search ends, or is stopped (Ctrl-C, any exception): the server is put on the best (else
  the flags found) unless it runs them and its last part measured them; a start that fails
  there falls back to the flags found; the tuned file is written before ``run`` returns or
  raises;
- stopped or killed, the record has no end that says "finished": the next ``run`` replays it
  (no try measured twice) and goes on; a finished record starts a new search.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pve_sglang.server.startup_log import degenerate, diagnose
from pve_sglang.tuning import record
from pve_sglang.tuning.space import Candidate, changed, key, same_server, server_flags
from pve_sglang.tuning.strategy import (
    Costs,
    Outcome,
    Proposal,
    Replayed,
    Search,
    Try,
    default_low_power_pct,
)
from pve_sglang.tuning.tuned_file import render_tuned, write_tuned

#: A startup hint (``startup_log.HINTS``) -> how the try ended.
HINT_ENDINGS = {"cuda-oom": "oom", "sm120-autotune": "stall"}
#: The server's steady-state throughput is the objective where this many reads made it: its
#: gauge is SGLang's rate over its last decode log interval (40 steps by default), so a window
#: of a few reads (a benchmark of seconds) holds a handful of intervals and idle time; 30 reads
#: are 30 s at the default sampling (``bench_metrics_sample_ms`` 1000).
MIN_SCRAPES = 30
#: The objective's sources, first choice first.
OBJECTIVES = ("gen_throughput_mean", "output_token_throughput")
#: A benchmark part may run this many times its expected length (plus ``LIMIT_SLACK_S``)
#: before it counts as hung.
LIMIT_FACTOR = 2.0
LIMIT_SLACK_S = 120.0


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


def objective_source(row: dict[str, Any]) -> str:
    """Which figure of ROW is the search's objective: the server's steady-state throughput
    when enough reads of /metrics made it, else the benchmark's output tok/s."""
    scrapes = row.get("metrics_scrapes")
    if _figure(row.get(OBJECTIVES[0])) is not None and isinstance(scrapes, int) and \
            scrapes >= MIN_SCRAPES:
        return OBJECTIVES[0]
    return OBJECTIVES[1]


def within_bound(ttft: Any, bound: float | None) -> bool:
    """Whether a p99 time to first token of TTFT keeps the bound (at most BOUND ms)."""
    return bound is None or _figure(ttft) is None or float(ttft) <= bound


def _figure(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return float(value)
    return None


class NotServing(RuntimeError):
    """The search ended and neither the best nor the flags found started again."""


@dataclass
class Server:
    """What a search needs of a container's server."""

    #: Put CANDIDATE's flags on the server (one restart); "" when it serves, else how it ended.
    apply: Callable[[Candidate], str]
    #: The benchmark for LENGTH of its whole at concurrency LEVEL, ended after LIMIT_S seconds:
    #: that level's row (no objective in it: it failed or ran past its limit).
    measure: Callable[[float, float, int], dict[str, Any]]


@dataclass
class Drive:
    """The search of one container: its space, where it started, its bounds and files.
    START_S and BENCH_S: what a restart and a whole benchmark are expected to cost until the
    search measures them (the container's measured start time, in ``make tune``)."""

    space: dict[str, tuple]
    found: Candidate
    budget_s: float
    tuned: Path
    objective_level: int
    max_p99_ttft_ms: float | None = None
    low_power_pct: float = field(default_factory=default_low_power_pct)
    clock: Callable[[], float] = time.monotonic
    start_s: float = 600.0
    bench_s: float = 600.0

    def run(self, server: Server) -> Search:
        """Search, the record kept; the server left serving the best (else the flags found)."""
        path = record.record_path(self.tuned)
        before = record.read_search(path)
        resumed = before.found is not None and not before.finished
        found = before.found if resumed and before.found is not None else self.found
        if not resumed:
            record.begin(path, found)
        # What the server runs: unknown after a kill, the best after a stop.
        running: dict[str, Any] = {"flags": None}
        if not resumed:
            running["flags"] = dict(found)
        elif before.ended is not None and isinstance(before.ended.get("serving"), dict):
            running["flags"] = before.ended["serving"]
        source = {"key": next((t.outcome.row.get("objective_from") for t in before.tries
                               if t.outcome.row.get("objective_from")), None) if resumed else None}

        def measure(proposal: Proposal) -> Outcome:
            began = self.clock()
            start_s = 0.0
            if not same_server(running["flags"], proposal.candidate):
                running["flags"] = None
                ended = server.apply(proposal.candidate)
                start_s = self.clock() - began
                if ended:
                    outcome = Outcome(ended, cost_s=start_s, start_s=start_s)
                    record.add(path, Try(proposal, outcome))
                    return outcome
            # What it runs is unknown until the part ends.
            flags, running["flags"] = server_flags(proposal.candidate), None
            row = server.measure(proposal.length, self._limit(search, proposal, began),
                                 self.level_of(proposal.candidate))
            outcome = self._outcome(row, source)
            outcome.cost_s, outcome.start_s = self.clock() - began, start_s
            if outcome.ended in ("measured", "constraint"):
                running["flags"] = flags
            record.add(path, Try(proposal, outcome))
            return outcome

        search = Search(self.space, found, self.budget_s, low_power_pct=self.low_power_pct,
                        costs=Costs(self.start_s, self.bench_s))
        stopped, finished = "stopped before its end", False
        try:
            search.run(Replayed(before.tries, measure, running["flags"]) if resumed
                       else measure)
            stopped, finished = search.stopped, True
        finally:
            serving = self._finish(server, search, found, running["flags"])
            best = search.best or found
            notes = [f"make tune: {stopped}",
                     f"best: {_text(changed(found, best)) or 'the flags found'} "
                     f"({search.best_score or 0:,.1f} output tok/s at concurrency "
                     f"{self.level_of(best)}, measured over {search.best_weight:g} of the "
                     f"benchmark), {len(search.tries)} tries",
                     f"record: {path.name}; the container's own entry wins over these lines"]
            write_tuned(self.tuned, render_tuned(best, notes))
            record.end(path, best, search.best_score, stopped, finished=finished,
                       weight=search.best_weight, serving=serving)
        if serving is None:
            raise NotServing(f"make tune: neither the best ({_text(changed(found, best))}) nor "
                             "the flags found started at the end; the server serves nothing; "
                             f"the record is in {path}")
        return search

    def level_of(self, candidate: Candidate) -> int:
        """The concurrency CANDIDATE is measured at: its ``tune_concurrency`` where the space
        moves it, else the objective's level."""
        return candidate.get("tune_concurrency") or self.objective_level

    def _limit(self, search: Search, proposal: Proposal, began: float) -> float:
        """How long PROPOSAL's part may run before it counts as hung: ``LIMIT_FACTOR`` times
        its expected length and ``LIMIT_SLACK_S``, but never past the budget less a restart
        (the search ends on the best, started again, within it)."""
        expected = proposal.length * search.costs.bench_s
        spent = search.spent_s + (self.clock() - began)
        return max(expected, min(LIMIT_FACTOR * expected + LIMIT_SLACK_S,
                                 self.budget_s - spent - search.costs.start_s))

    def _finish(self, server: Server, search: Search, found: Candidate,
                running: Candidate | None) -> Candidate | None:
        """Put the server on the best (else FOUND) unless it runs them (RUNNING, known only
        after a part that measured): the flags it serves, checked by their start; None when
        neither started."""
        best = search.best or found
        if same_server(running, best):
            return best
        for flags in (best, found):
            if not server.apply(flags):
                return dict(flags)
            if key(flags) == key(found):
                break
        return None

    def _outcome(self, row: dict[str, Any], source: dict[str, str | None]) -> Outcome:
        if source["key"] is None and _figure(row.get(OBJECTIVES[1])) is not None:
            source["key"] = objective_source(row)
        objective = _figure(row.get(source["key"] or OBJECTIVES[1]))
        row = {**row, "objective_from": source["key"]}
        if objective is None or objective <= 0:
            return Outcome("bench", None, row)
        if not within_bound(row.get("p99_ttft_ms"), self.max_p99_ttft_ms):
            return Outcome("constraint", None, row)
        return Outcome("measured", objective, row)


def _text(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in values.items())
