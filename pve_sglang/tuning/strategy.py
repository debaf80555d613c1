"""The guided search: which candidate to try next, from what the tries so far measured.

The strategy is coordinate descent, guided and cut short:

1. **The server as found, three times** (``REPEATS``): their mean is the first best, and their
   standard deviation (as a share of the mean) the noise, at least ``NOISE_FLOOR``.
2. **Coordinates in the order the figures ask** (``server.bench_hints``' rules on the best's
   row at the target concurrency): running requests flat below the concurrency with a queue
   (``capped``) -> the running-request cap first; token usage near 1 with a queue
   (``kv_bound``) -> ``mem_fraction_static`` and the chunked prefill; GPUs under their power
   limit with a queue (``idle_with_queue``) -> CUDA graphs, their batch size, the MoE backend.
   The others follow in ``space.COORDINATES``' order.
3. **Successive halving of the benchmark's length** along one coordinate: every value of it
   (the others at the best's) runs a short benchmark (``RUNGS``: a quarter, a half, the whole),
   beside the best at that length; the better half goes on to the next length (and any value
   within the noise of the leader), and a value that falls below the best by more than twice
   the noise (wider for a shorter run) drops.
   A candidate's score pools all its runs, each weighted by its length (so the short runs are
   not thrown away); only after a whole-length run can it become the best, and only when its
   score beats the best's by more than the noise of their difference; the winner is then
   measured once more (no restart: it is running) and must still beat it, so that a lucky
   run does not stand as the bar for the rest.
4. **A try that fails** (no start, out of memory, a stall, degenerate text, a constraint such as
   a p99 time-to-first-token bound broken) drops out; on an ordered coordinate it rules out the
   values beyond it (more memory than what ran out of memory). A value that ran out of memory
   is tried again, at the whole length, with the memory given back elsewhere, as SGLang's
   guide says: a larger ``mem_fraction_static`` with a smaller prefill chunk or CUDA graph
   batch (``RELIEF``), any other value with a smaller ``mem_fraction_static``.
5. **Stop** when the budget is spent, or when a whole pass over the coordinates made no new
   best: no candidate is left that could beat the best by more than the noise.

``Search.run(measure)`` drives it; MEASURE applies a proposal and measures it (``tune.py``: a
restart through the startup watch and the benchmark; a simulator in the tests and in
``bench/tune_search.py``). The decisions depend only on the outcomes, so a killed search is
replayed from its record (each recorded outcome handed back for the same proposal) and goes
on where it stopped.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pve_sglang.server import bench_hints
from pve_sglang.tuning.space import COORDINATES, ORDERED, Candidate, key, valid

#: The benchmark lengths of successive halving, as shares of the whole.
RUNGS = (0.25, 0.5, 1.0)
#: Measurements of the server as found (the first best): their spread is the noise.
REPEATS = 3
#: The least noise assumed, as a share of the objective.
NOISE_FLOOR = 0.01
#: Coordinates that free memory for a larger ``mem_fraction_static`` (SGLang's tuning guide).
RELIEF = ("chunked_prefill_size", "cuda_graph_max_bs")
#: Coordinates each signal puts first.
SIGNAL_ORDER = {
    "capped": ("max_running_requests",),
    "kv_bound": ("mem_fraction_static", "chunked_prefill_size"),
    "idle_with_queue": ("disable_cuda_graph", "cuda_graph_max_bs", "moe_runner_backend"),
}


@dataclass(frozen=True)
class Proposal:
    """One try: CANDIDATE (the whole set of the space's settings) for LENGTH of the benchmark."""

    candidate: Candidate
    length: float
    why: str


@dataclass
class Outcome:
    """What a try measured. ``ended``: ``measured``, or why it failed (``start``, ``oom``,
    ``stall``, ``degenerate``, ``constraint``: measured but outside a bound)."""

    ended: str
    objective: float | None = None
    row: dict[str, Any] = field(default_factory=dict)
    cost_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.ended == "measured" and self.objective is not None


@dataclass
class Try:
    proposal: Proposal
    outcome: Outcome


def signals(row: Mapping[str, Any], low_power_pct: float) -> list[str]:
    """The ``bench_hints`` rules ROW meets, in ``SIGNAL_ORDER``'s order."""
    met = {"capped": bench_hints.capped(dict(row)), "kv_bound": bench_hints.kv_bound(dict(row)),
           "idle_with_queue": bench_hints.idle_with_queue(dict(row), low_power_pct)}
    return [name for name in SIGNAL_ORDER if met[name]]


def coordinate_order(space: Mapping[str, tuple], row: Mapping[str, Any],
                     low_power_pct: float) -> list[str]:
    """The space's coordinates, those the figures point at first."""
    first = [c for s in signals(row, low_power_pct) for c in SIGNAL_ORDER[s] if c in space]
    rest = [c for c in COORDINATES if c in space]
    return list(dict.fromkeys([*first, *rest]))


def ruled_out(values: tuple, failed: set, current: Any) -> set:
    """Values of an ordered coordinate beyond one that failed, away from CURRENT (its index)."""
    out = set(failed)
    index = {v: i for i, v in enumerate(values)}
    here = index.get(current, 0)
    for value in failed:
        i = index.get(value)
        if i is None:
            continue
        beyond = values[i + 1:] if i > here else values[:i]
        out |= set(beyond)
    return out


def keep(scores: dict[str, float], best: float, noise: float, length: float) -> list[str]:
    """Of the candidates' SCORES at LENGTH, those going on: the better half (rounded up) and
    any within the noise at that length of the leader (noise grows as the length shrinks:
    1/sqrt), less any below BEST by more than twice that noise."""
    margin = noise / math.sqrt(length)
    ranked = sorted(scores, key=lambda k: -scores[k])
    leader = scores[ranked[0]] if ranked else 0.0
    going = [k for n, k in enumerate(ranked)
             if n < math.ceil(len(ranked) / 2) or scores[k] >= leader * (1 - margin)]
    return [k for k in going if scores[k] >= best * (1 - 2 * margin)]


class Stop(Exception):
    """The budget is spent."""


@dataclass
class Search:
    """One search over SPACE from START (the server's own values)."""

    space: Mapping[str, tuple]
    start: Candidate
    budget_s: float
    low_power_pct: float = 60.0
    rungs: tuple[float, ...] = RUNGS
    tries: list[Try] = field(default_factory=list)
    spent_s: float = 0.0
    noise: float = NOISE_FLOOR
    best: Candidate | None = None
    best_score: float | None = None
    best_row: dict[str, Any] = field(default_factory=dict)
    stopped: str = ""
    #: Each best as it was taken: (tries made by then, the candidate, its score).
    bests: list[tuple[int, Candidate, float]] = field(default_factory=list)
    _seen: dict[tuple[str, float], Outcome] = field(default_factory=dict)
    _pool: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def _measure(self, measure: Callable[[Proposal], Outcome], proposal: Proposal) -> Outcome:
        cached = self._seen.get((key(proposal.candidate), proposal.length))
        if cached is not None and not proposal.why.startswith("repeat"):
            return cached
        if self.spent_s >= self.budget_s:
            raise Stop
        outcome = measure(proposal)
        self.spent_s += outcome.cost_s
        self.tries.append(Try(proposal, outcome))
        self._seen[(key(proposal.candidate), proposal.length)] = outcome
        if outcome.ok:
            self._pool.setdefault(key(proposal.candidate), []).append(
                (proposal.length, outcome.objective))
        return outcome

    def run(self, measure: Callable[[Proposal], Outcome]) -> Search:
        """Search until the budget ends or no candidate is left; the best is in ``best``."""
        try:
            self._search(measure)
        except Stop:
            self.stopped = f"budget: {self.spent_s:.0f} of {self.budget_s:.0f} s spent"
        return self

    def pooled(self, candidate: Candidate) -> tuple[float | None, float]:
        """CANDIDATE's score from every measurement of it, each weighted by its length (a
        quarter-length run counts a quarter), and the lengths' sum."""
        runs = self._pool.get(key(candidate), [])
        weight = sum(length for length, _ in runs)
        return (sum(length * v for length, v in runs) / weight if weight else None), weight

    def _beats(self, candidate: Candidate) -> bool:
        """CANDIDATE's pooled score beats the best's by more than the noise of their
        difference (the noise of one whole run, shrinking with the lengths pooled)."""
        assert self.best is not None
        score, weight = self.pooled(candidate)
        best, best_weight = self.pooled(self.best)
        if score is None or best is None:
            return False
        margin = self.noise * math.sqrt(1 / weight + 1 / best_weight)
        return score > best * (1 + margin)

    def _take(self, candidate: Candidate) -> None:
        self.best = candidate
        self.best_score = self.pooled(candidate)[0]
        self.best_row = self._seen[(key(candidate), 1.0)].row
        self.bests.append((len(self.tries), candidate, self.best_score or 0.0))

    def _search(self, measure: Callable[[Proposal], Outcome]) -> None:
        start = dict(self.start)
        first = self._measure(measure, Proposal(start, 1.0, "the server as found"))
        if not first.ok:
            self.stopped = f"the server as found did not measure ({first.ended})"
            return
        scores = [first.objective]
        for n in range(1, REPEATS):
            again = self._measure(measure, Proposal(start, 1.0, f"repeat {n} of the server as "
                                                                "found: the noise"))
            scores += [again.objective] if again.ok else []
        mean = statistics.fmean(scores)
        spread = statistics.stdev(scores) / mean if len(scores) > 1 and mean else 0.0
        self.noise = max(NOISE_FLOOR, spread)
        self._take(start)
        settled: set[str] = set()
        while True:
            order = [c for c in coordinate_order(self.space, self.best_row, self.low_power_pct)
                     if c not in settled]
            if not order:
                self.stopped = (f"no candidate left that could beat the best by more than the "
                                f"noise ({self.noise:.1%})")
                return
            coordinate = order[0]
            if self._descend(measure, coordinate):
                # A new best: every coordinate may move again (this one too: the best may have
                # moved another with it); what was measured already costs nothing again.
                settled = set()
            else:
                settled.add(coordinate)

    def _relief(self, coordinate: str, oom: list) -> list[Candidate]:
        """Candidates that give back the memory COORDINATE's values OOM ran out of, as SGLang's
        tuning guide says: a larger ``mem_fraction_static`` with a smaller prefill chunk or
        CUDA graph batch (``RELIEF``: each of the smaller half of their set values); any other
        value with the next two smaller ``mem_fraction_static`` (more room for activations)."""
        assert self.best is not None
        out = []
        if coordinate == "mem_fraction_static":
            for name in RELIEF:
                values = sorted(v for v in self.space.get(name, ()) if v is not None and v > 0)
                for smaller in values[:math.ceil(len(values) / 2)]:
                    candidate = {**self.best, coordinate: min(oom), name: smaller}
                    current = self.best.get(name)
                    if current is None or smaller < current:
                        out.append(candidate)
        elif "mem_fraction_static" in self.space:
            fractions = sorted(v for v in self.space["mem_fraction_static"]
                               if v < self.best["mem_fraction_static"])
            for value in oom:
                out += [{**self.best, coordinate: value, "mem_fraction_static": fraction}
                        for fraction in fractions[-2:][::-1]]
        return [c for c in out if valid(c)]

    def _descend(self, measure: Callable[[Proposal], Outcome], coordinate: str) -> bool:
        """Try COORDINATE's values around the best; True when one became the best."""
        assert self.best is not None
        values = self.space[coordinate]
        failed: set = set()
        oom: list = []
        candidates = {}
        for value in values:
            candidate = {**self.best, coordinate: value}
            if value == self.best[coordinate] or not valid(candidate):
                continue
            candidates[key(candidate)] = (value, candidate)
        why = f"{coordinate}: {', '.join(signals(self.best_row, self.low_power_pct)) or 'next'}"
        alive = list(candidates)
        for length in self.rungs:
            if coordinate in ORDERED:
                out = ruled_out(values, failed, self.best[coordinate])
                alive = [k for k in alive if candidates[k][0] not in out]
            if not alive:
                break
            if length < 1.0:
                self._measure(measure, Proposal(self.best, length, f"{why}: the best at "
                                                                   f"{length:g}"))
            for k in alive:
                value, candidate = candidates[k]
                outcome = self._measure(measure, Proposal(
                    candidate, length, f"{why}: {coordinate}={value!r} at {length:g}"))
                if not outcome.ok:
                    failed.add(value)
                    if outcome.ended == "oom":
                        oom.append(value)
            alive = [k for k in alive if candidates[k][0] not in failed]
            if length < 1.0:
                scores = {k: self.pooled(candidates[k][1])[0] for k in alive}
                alive = keep(scores, self.pooled(self.best)[0] or 0.0,  # type: ignore[arg-type]
                             self.noise, sum(r for r in self.rungs if r <= length))
        alive = [k for k in alive if (k, 1.0) in self._seen and self._seen[(k, 1.0)].ok]
        if oom:
            for relief in self._relief(coordinate, oom):
                k = key(relief)
                candidates[k] = (relief[coordinate], relief)
                less = ", ".join(f"{n}={v!r}" for n, v in relief.items()
                                 if self.best.get(n) != v and n != coordinate)
                if self._measure(measure, Proposal(
                        relief, 1.0, f"{why}: {coordinate}={relief[coordinate]!r} ran out "
                                     f"of memory: again with {less}")).ok:
                    alive.append(k)
        ranked = sorted(alive, key=lambda k: -(self.pooled(candidates[k][1])[0] or 0.0))
        if not ranked or not self._beats(candidates[ranked[0]][1]):
            return False
        # The winner of many noisy tries is lucky on average: measured again (no restart:
        # it is running), and it must still beat the best.
        winner = candidates[ranked[0]][1]
        if not self._measure(measure, Proposal(
                winner, 1.0, f"repeat of {coordinate}={candidates[ranked[0]][0]!r}: its own "
                             "noise")).ok or not self._beats(winner):
            return False
        self._take(winner)
        return True


@dataclass
class Replayed:
    """MEASURE that hands back RECORDED outcomes (a search's record, in order) while the search
    proposes the same tries, then measures with LIVE: a killed search, run again, goes on where
    it stopped without a restart or a benchmark for what it had measured."""

    recorded: list[Try]
    live: Callable[[Proposal], Outcome]
    replayed: int = 0

    def __call__(self, proposal: Proposal) -> Outcome:
        if self.replayed < len(self.recorded):
            done = self.recorded[self.replayed]
            if (key(done.proposal.candidate), done.proposal.length) == (
                    key(proposal.candidate), proposal.length):
                self.replayed += 1
                return done.outcome
            self.recorded = self.recorded[:self.replayed]  # another path: measure from here
        return self.live(proposal)
