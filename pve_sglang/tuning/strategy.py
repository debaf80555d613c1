"""The guided search: which candidate to try next, from what the tries so far measured.

A restart of a large model costs minutes (the seed's: 7), a whole benchmark ten; run-to-run
noise is a few percent, the size of the last steps to the best. So the search spends its
restarts on the moves the server's figures point at, and its benchmark time on telling the
close ones apart:

1. **The server as found**, measured where it runs (no restart) in ``CHUNK``-long parts of the
   benchmark up to ``START_WEIGHT``: the first best, and the first estimate of the noise (the
   spread of every candidate's parts, pooled, never below ``NOISE_FLOOR``: ``noise_of``).
2. **Moves in the order the figures ask** (``server.bench_hints``' rules on the best's row):
   running requests flat at a cap with a queue -> the cap (none first); token usage near 1
   with a queue -> more ``mem_fraction_static`` (nearest first), a smaller prefill chunk; GPUs
   under their power limit with a queue -> CUDA graphs, their batch, the MoE backend; then
   ``PRIOR_ORDER``. What the figures say cannot change anything is left out (``no_op``): a cap
   that would not bind, more KV memory when no request waited.
3. **One start a move, measured until decided.** A move is started once and measured part
   after part while it runs, each part set against the best (``verdict``, in logs): above by
   ``Z_BETTER`` standard errors it takes the best's place and is measured on for
   ``FRESH_WEIGHT`` while it runs, and that repeat must still beat the best it replaced, or
   that one comes back; ``Z_WORSE`` below ``MIN_GAIN`` it drops; otherwise another part, up to
   ``MAX_WEIGHT``: within the noise.
4. **A try that fails** (no start, out of memory, a stall, degenerate text, a benchmark that
   fails or hangs, the p99 time-to-first-token bound) is never the best; a value that fails
   by itself is not tried again; a candidate that asks at least the memory of one that ran out
   of it is not tried (``more_memory``); out of memory is tried again with the memory given
   back (``relief``), as SGLang's guide says.
5. **What was measured elsewhere counts.** After a new best, moves tried from an earlier one
   come back in the order an additive model of every part (``additive``: each value's effect
   on the log throughput, pooled over the flags it ran with) says they could gain; the moves
   each within the noise are tried together; the close ones are measured on.
6. **The best and the flags found in alternation**: at the end, unless the best is clearly
   above them (``clearly_above``), the two are measured in turn, a restart each (``_duel``);
   the flags found come back unless the best beats them.
7. **What one start can measure, it measures.** Where the space moves the benchmark's side
   (``space.CLIENT_SIDE``: the concurrency), its moves come first from each best (the running
   server, no restart), nearest level first; a challenger that did not take the best's place
   is measured at the levels next to its own while it runs (``_other_levels``), where the
   measures so far say a level could make up the difference; flags whose start failed are not
   started again at another level.
8. **Stop** when no move is left, or when the next part could not end within the budget with a
   restart in reserve (a win cut before its repeat is kept at its length only when clearly
   above the best it replaced).

``Search.run(measure)`` drives it; MEASURE applies a proposal and measures it (``drive.Drive``:
a restart only when the flags change, then the benchmark; the simulator of the tests and of
``bench/tune_search.py``). The decisions depend only on the outcomes, so a stopped or killed
search is replayed from its record (each recorded outcome handed back for the same proposal)
and goes on where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pve_sglang.project import load_defaults
from pve_sglang.server import bench_hints
from pve_sglang.tuning.space import (CLIENT_SIDE, COORDINATES, ORDERED, Candidate, key,
                                     same_server, server_flags, valid)

#: The share of the whole benchmark measured at a time.
CHUNK = 0.25
#: The least noise assumed, as a share of the objective (one whole run's standard deviation).
NOISE_FLOOR = 0.01
#: The noise assumed before any repeat, and how many degrees of freedom that guess weighs.
NOISE_PRIOR = 0.03
PRIOR_DF = 2
#: How many standard errors a challenger must be above the best to take its place.
Z_BETTER = 0.75
#: How many standard errors above the best it replaced a new best must be to stay when the
#: budget ends before its repeat (kept at the length it reached).
Z_CLEAR = 3.0
#: The best and the flags found measured in alternation at the end: how much of the benchmark
#: each time, how many times at most.
DUEL_WEIGHT = 0.5
DUEL_ROUNDS = 3
#: How many standard errors below the best plus ``MIN_GAIN`` drop a challenger.
Z_WORSE = 1.5
#: A gain too small to look for (a share of the objective).
MIN_GAIN = 0.01
#: The most of the benchmark one challenger is measured for before it is within the noise.
MAX_WEIGHT = 1.5
#: How much of the benchmark a new best is measured for while it runs, after it won.
FRESH_WEIGHT = 1.5
#: How much of the benchmark the server as found is measured for, where it runs.
START_WEIGHT = 1.5
#: How much of the benchmark a close challenger (above the best, within the noise) is
#: measured for at most, once no move is left.
RESOLVE_WEIGHT = 3.0
#: How many candidates with memory given back a value that ran out of memory is tried with.
RELIEF_STEPS = 3
#: A move measured this many times the noise below the best is not tried again in a later
#: pass (from another best): what lost that much loses again.
CLEARLY_WORSE = 3.0
#: Coordinates that do not change what the GPUs' memory holds (the queue's order, the
#: benchmark's side).
MEMORY_NEUTRAL = ("schedule_policy", *CLIENT_SIDE)
#: How a start ends when it fails: the flags' own, whatever the benchmark's side measures.
START_ENDINGS = ("start", "oom", "stall", "degenerate")
#: How much an additive effect is shrunk toward none (in whole runs' weight).
RIDGE = 0.1
#: Coordinates that free memory for a larger ``mem_fraction_static`` (SGLang's tuning guide).
RELIEF = ("chunked_prefill_size", "cuda_graph_max_bs")
#: Coordinates each signal puts first.
SIGNAL_ORDER = {
    "capped": ("max_running_requests",),
    "kv_bound": ("mem_fraction_static", "chunked_prefill_size"),
    "idle_with_queue": ("disable_cuda_graph", "cuda_graph_max_bs", "moe_runner_backend"),
}
#: The coordinates' order where the figures say nothing: the large steps of the seed's tuning
#: and SGLang's guide first (CUDA graphs, the MoE kernels), then what the batch holds (the cap,
#: KV memory), then the finer ones.
PRIOR_ORDER = ("disable_cuda_graph", "moe_runner_backend", "max_running_requests",
               "mem_fraction_static", "cuda_graph_max_bs", "chunked_prefill_size",
               "schedule_policy")
#: Running requests at least this share of the concurrency, with no queue: the batch is whole.
FULL_SHARE = 0.9


@dataclass(frozen=True)
class Proposal:
    """One try: CANDIDATE (the whole set of the space's settings) for LENGTH of the benchmark."""

    candidate: Candidate
    length: float
    why: str


@dataclass
class Outcome:
    """What a try measured. ``ended``: ``measured``, or why it failed (``start``, ``oom``,
    ``stall``, ``degenerate``, ``bench``: the benchmark gave no figures or hung,
    ``constraint``: measured but outside a bound). ``start_s``: the restart's seconds, of
    ``cost_s`` in all (0: the server already ran these flags)."""

    ended: str
    objective: float | None = None
    row: dict[str, Any] = field(default_factory=dict)
    cost_s: float = 0.0
    start_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.ended == "measured" and self.objective is not None and self.objective > 0


@dataclass
class Try:
    proposal: Proposal
    outcome: Outcome


# --- the decisions, pure ------------------------------------------------------------------


def signals(row: Mapping[str, Any], low_power_pct: float) -> list[str]:
    """The ``bench_hints`` rules ROW meets, in ``SIGNAL_ORDER``'s order."""
    met = {"capped": bench_hints.capped(dict(row)), "kv_bound": bench_hints.kv_bound(dict(row)),
           "idle_with_queue": bench_hints.idle_with_queue(dict(row), low_power_pct)}
    return [name for name in SIGNAL_ORDER if met[name]]


def coordinate_order(space: Mapping[str, tuple], row: Mapping[str, Any],
                     low_power_pct: float) -> list[str]:
    """The space's coordinates: those of the benchmark's side first (a move of theirs is
    measured on the running server, no restart), then those the figures point at, then
    ``PRIOR_ORDER``."""
    client = [c for c in CLIENT_SIDE if c in space]
    first = [c for s in signals(row, low_power_pct) for c in SIGNAL_ORDER[s] if c in space]
    rest = [c for c in (*PRIOR_ORDER, *COORDINATES) if c in space]
    return list(dict.fromkeys([*client, *first, *rest]))


def _number(row: Mapping[str, Any], *names: str) -> float | None:
    for name in names:
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def no_op(coordinate: str, value: Any, best: Candidate, row: Mapping[str, Any]) -> bool:
    """Whether the best's figures (ROW) say that VALUE of COORDINATE cannot change the
    throughput. A cap: when the best's own cap did not hold requests back (none, or the
    running requests below ``FULL_SHARE`` of it, or no request ever waiting), one that would
    not either (none, the concurrency or more, or at least the running requests over
    ``FULL_SHARE``). More KV memory: when no request ever waited (the cache held every request
    sent). Another level of the benchmark's side (``CLIENT_SIDE``), when requests waited: a
    higher one only adds to the queue, a lower one that is at least the running requests
    only takes from it (the same throughput). A request waited when the most queued over the
    level (else the mean) is 1 or more: the mean of a short run may sit below 1 while
    requests did wait."""
    running = _number(row, "running_reqs_max")
    queue = _number(row, "queue_reqs_max", "queue_reqs_mean")
    level = _number(row, "concurrency")
    if running is None or queue is None:
        return False
    if coordinate in CLIENT_SIDE:
        return queue >= 1 and value is not None and (
            value >= running or (level is not None and value > level))
    if coordinate == "max_running_requests":
        cap = best.get(coordinate)
        if cap is not None and running >= FULL_SHARE * cap and queue >= 1:
            return False  # it holds requests back
        return value is None or value * FULL_SHARE >= running or (
            level is not None and value >= level)
    if coordinate == "mem_fraction_static":
        now = best.get(coordinate)
        return queue < 1 and now is not None and value > now
    return False


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


def more_memory(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether candidate A asks the GPUs for at least the memory B does: the same flags but
    for a ``mem_fraction_static``, prefill chunk, CUDA graph batch or cap as large or larger
    (SGLang's own, null, compared only with itself), CUDA graphs on where B has them on. One
    that asks at least what ran out of memory runs out too."""
    for name in set(a) | set(b):
        x, y = a.get(name), b.get(name)
        if x == y:
            continue
        if name == "disable_cuda_graph":
            if x is not False:  # A has graphs off where B has them on: less memory
                return False
        elif name == "max_running_requests":
            if x is not None and (y is None or x < y):
                return False
        elif name in ORDERED:
            if x is None or y is None or x < y:
                return False
        elif name not in MEMORY_NEUTRAL:
            return False
    return True


def value_order(coordinate: str, values: tuple, current: Any, row: Mapping[str, Any],
                low_power_pct: float) -> list:
    """COORDINATE's VALUES other than CURRENT, in the order to try them: a cap that binds
    (``capped``) from none (SGLang's own: the largest step, one restart) down; more KV memory
    first when the cache is full (``kv_bound``), nearest first; a coordinate of the
    benchmark's side nearest first, the higher first; otherwise the space's order
    (conservative first)."""
    others = [v for v in values if v != current]
    if coordinate in CLIENT_SIDE:
        return neighbours(values, current)
    met = signals(row, low_power_pct)
    if coordinate == "max_running_requests" and "capped" in met:
        return sorted(others, key=lambda v: (v is not None, -(v or 0)))
    if coordinate == "mem_fraction_static" and "kv_bound" in met and current is not None:
        up = sorted(v for v in others if v > current)
        down = sorted((v for v in others if v < current), reverse=True)
        return [*up, *down]
    return others


def neighbours(values: tuple, current: Any) -> list:
    """VALUES other than CURRENT, the nearest in their order first, the higher of two as near
    first; CURRENT not in VALUES: from the start of them."""
    order = list(values)
    here = order.index(current) if current in order else -1
    near = sorted((i for i in range(len(order)) if i != here),
                  key=lambda i: (abs(i - here), -i))
    return [order[i] for i in near]


def adjacent(values: tuple, current: Any) -> list:
    """The values next to CURRENT in VALUES' order, the higher first (none where CURRENT is
    not one of them)."""
    order = list(values)
    if current not in order:
        return []
    here = order.index(current)
    return [order[i] for i in (here + 1, here - 1) if 0 <= i < len(order)]


def noise_of(sum_squares: float, df: int) -> float:
    """One whole run's relative noise from the length-weighted squares of the parts about
    their candidate's mean (SUM_SQUARES, logs) over DF degrees of freedom, pooled with the
    prior guess (``NOISE_PRIOR`` over ``PRIOR_DF``); never below ``NOISE_FLOOR``."""
    spread = math.sqrt((PRIOR_DF * NOISE_PRIOR ** 2 + sum_squares) / (PRIOR_DF + df))
    return max(NOISE_FLOOR, spread)


def verdict(diff: float, se: float) -> str:
    """A challenger set against the best: DIFF the log of their ratio, SE its standard error.
    ``better`` above the best by more than ``Z_BETTER`` standard errors; ``worse`` when even
    ``Z_WORSE`` standard errors up it stays below ``MIN_GAIN``; else ``undecided``."""
    if diff > Z_BETTER * se:
        return "better"
    if diff + Z_WORSE * se < math.log1p(MIN_GAIN):
        return "worse"
    return "undecided"


def clearly_above(diff: float, se: float) -> bool:
    """Whether a log ratio DIFF of standard error SE is clearly above (``Z_CLEAR``): a new best
    kept when the budget ends before its repeat, a best kept without a duel with the flags
    found."""
    return diff > Z_CLEAR * se


def relief(coordinate: str, oom: Any, best: Candidate, space: Mapping[str, tuple]
           ) -> list[Candidate]:
    """Candidates that give back the memory COORDINATE's value OOM ran out of, as SGLang's
    tuning guide says, ``RELIEF_STEPS`` at most: a larger ``mem_fraction_static`` with a
    smaller prefill chunk or CUDA graph batch (``RELIEF``: each set value below the best's,
    largest first); any other value with less ``mem_fraction_static``, one step at a time."""
    out: list[Candidate] = []
    if coordinate == "mem_fraction_static":
        for name in RELIEF:
            values = sorted((v for v in space.get(name, ()) if v is not None and v > 0),
                            reverse=True)
            current = best.get(name)
            out += [{**best, coordinate: oom, name: v} for v in values
                    if current is None or v < current]
    elif "mem_fraction_static" in space and best.get("mem_fraction_static") is not None:
        fractions = sorted((v for v in space["mem_fraction_static"]
                            if v < best["mem_fraction_static"]), reverse=True)
        out = [{**best, coordinate: oom, "mem_fraction_static": f} for f in fractions]
    return [c for c in out if valid(c)][:RELIEF_STEPS]


def additive(parts: list[tuple[Candidate, float, float]], rounds: int = 50,
             ridge: float | None = None) -> dict[tuple[str, Any], float]:
    """Each (coordinate, value)'s effect on the log throughput, fitted to PARTS (candidate,
    length, log objective) as a sum over the coordinates (backfitting, each effect shrunk
    toward 0 by RIDGE of a whole run's weight): what a value did under other flags, pooled."""
    ridge = RIDGE if ridge is None else ridge
    rows: dict[str, list] = {}
    for candidate, length, z in parts:
        row = rows.setdefault(key(candidate), [sorted(candidate.items(), key=lambda i: i[0]),
                                               0.0, 0.0])
        row[1] += length
        row[2] += length * z
    if not rows:
        return {}
    table = [(dict(items), weight, total / weight) for items, weight, total in rows.values()]
    mean = sum(w * z for _, w, z in table) / sum(w for _, w, _ in table)
    groups: dict[tuple[str, Any], list[int]] = {}
    for i, (values, _, _) in enumerate(table):
        for item in values.items():
            groups.setdefault(item, []).append(i)
    effects = {item: 0.0 for item in groups}
    fitted = [0.0] * len(table)
    for _ in range(rounds):
        moved = 0.0
        for item, members in sorted(groups.items(), key=lambda g: repr(g[0])):
            residual = sum(table[i][1] * (table[i][2] - mean - fitted[i]) for i in members)
            weight = sum(table[i][1] for i in members)
            new = (residual + weight * effects[item]) / (weight + ridge)
            change = new - effects[item]
            if change:
                moved = max(moved, abs(change))
                effects[item] = new
                for i in members:
                    fitted[i] += change
        if moved < 1e-7:
            break
    return effects


class Stop(Exception):
    """The budget cannot hold the next part."""


# --- the search ---------------------------------------------------------------------------


@dataclass
class Costs:
    """What a restart and a whole benchmark cost, in seconds: the guesses until tries measure
    them, then the largest measured."""

    start_s: float
    bench_s: float
    #: Whether a try has measured each yet (until then the guess above stands).
    _started: bool = field(default=False, init=False, repr=False, compare=False)
    _benched: bool = field(default=False, init=False, repr=False, compare=False)

    def learn(self, proposal: Proposal, outcome: Outcome) -> None:
        if outcome.start_s > 0:
            self.start_s = max(self.start_s, outcome.start_s) if self._started else \
                outcome.start_s
            self._started = True
        if outcome.ok and proposal.length > 0:
            bench = (outcome.cost_s - outcome.start_s) / proposal.length
            self.bench_s = max(self.bench_s, bench) if self._benched else bench
            self._benched = True


def default_low_power_pct() -> float:
    """``bench_low_power_pct``'s default, read where the defaults live (``group_data/all.py``):
    the share of the power limit under which a queued run is idle GPUs."""
    return float(load_defaults()["bench_low_power_pct"])


@dataclass
class Search:
    """One search over SPACE from START (the server's own values, running when it begins)."""

    space: Mapping[str, tuple]
    start: Candidate
    budget_s: float
    low_power_pct: float = field(default_factory=default_low_power_pct)
    costs: Costs = field(default_factory=lambda: Costs(600.0, 600.0))
    tries: list[Try] = field(default_factory=list)
    spent_s: float = 0.0
    best: Candidate | None = None
    best_row: dict[str, Any] = field(default_factory=dict)
    stopped: str = ""
    #: Each best as it was taken: (tries made by then, the candidate, its score).
    bests: list[tuple[int, Candidate, float]] = field(default_factory=list)
    #: The flags the server runs (None: unknown, after a failure).
    running: Candidate | None = None
    _parts: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    _failed: dict[str, str] = field(default_factory=dict)
    _verdicts: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Moves (coordinate, value) not tried again: they lost clearly, or failed by themselves.
    _lost: set = field(default_factory=set)
    #: A new best measured on before its repeat: (the best before it, that one's bar).
    _unconfirmed: tuple[Candidate, float | None] | None = None
    #: Each candidate measured, by its key.
    _candidates: dict[str, Candidate] = field(default_factory=dict)
    #: Per candidate taken as the best: how many of its parts were measured before.
    _taken: dict[str, int] = field(default_factory=dict)
    #: Flags whose start failed (``START_ENDINGS``), by the key of their server flags: not
    #: started again at another level of the benchmark's side.
    _start_failed: dict[str, str] = field(default_factory=dict)
    #: Each move's last log ratio to the best it was tried from.
    _history: dict[tuple[str, Any], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.running = dict(self.start)

    # -- what was measured

    def score(self, candidate: Candidate) -> float | None:
        """CANDIDATE's throughput from all its parts (a geometric mean weighted by length)."""
        mean, _ = self._mean(key(candidate))
        return None if mean is None else math.exp(mean)

    def weight(self, candidate: Candidate) -> float:
        """How much of the whole benchmark CANDIDATE was measured for, its parts together."""
        return self._mean(key(candidate))[1]

    @property
    def best_score(self) -> float | None:
        return None if self.best is None else self.score(self.best)

    @property
    def best_weight(self) -> float:
        return 0.0 if self.best is None else self.weight(self.best)

    def _mean(self, k: str) -> tuple[float | None, float]:
        parts = self._parts.get(k, [])
        weight = sum(length for length, _ in parts)
        if not weight:
            return None, 0.0
        return sum(length * z for length, z in parts) / weight, weight

    @property
    def noise(self) -> float:
        """One whole run's relative noise, from the repeats of every candidate."""
        squares, df = 0.0, 0
        for k, parts in self._parts.items():
            mean, _ = self._mean(k)
            if mean is None:  # no part: nothing to add
                continue
            squares += sum(length * (z - mean) ** 2 for length, z in parts)
            df += len(parts) - 1
        return noise_of(squares, df)

    def _bar(self) -> tuple[float | None, float]:
        """The best's score and weight as the bar for challengers: from the parts measured
        after it was taken, once they weigh ``FRESH_WEIGHT`` (those before made it win, and a
        winner of noisy measures is lucky on average), else from all."""
        assert self.best is not None
        k = key(self.best)
        fresh = self._parts.get(k, [])[self._taken.get(k, 0):]
        weight = sum(length for length, _ in fresh)
        if weight >= FRESH_WEIGHT - 1e-9:
            return sum(length * z for length, z in fresh) / weight, weight
        return self._mean(k)

    def compare(self, candidate: Candidate) -> tuple[str, float]:
        """CANDIDATE against the best: the verdict and the log ratio of their scores."""
        assert self.best is not None
        mine, weight = self._mean(key(candidate))
        theirs, best_weight = self._bar()
        if mine is None or theirs is None:
            return "undecided", 0.0
        diff = mine - theirs
        return verdict(diff, self.noise * math.sqrt(1 / weight + 1 / best_weight)), diff

    # -- measuring

    def _measure(self, measure: Callable[[Proposal], Outcome], proposal: Proposal) -> Outcome:
        if isinstance(measure, Replayed):  # a resumed search: the server as the stop left it
            self.running = measure.running_before(proposal, self.running)
        restart = not same_server(self.running, proposal.candidate)
        expected = (self.costs.start_s if restart else 0.0) + proposal.length * self.costs.bench_s
        # A restart is kept in reserve: the search ends on the best, started again if the
        # part did not end well (a hang), within the budget.
        if self.spent_s + expected + self.costs.start_s > self.budget_s:
            raise Stop
        outcome = measure(proposal)
        self._candidates.setdefault(key(proposal.candidate), dict(proposal.candidate))
        self.spent_s += outcome.cost_s
        self.tries.append(Try(proposal, outcome))
        self.costs.learn(proposal, outcome)
        k = key(proposal.candidate)
        if outcome.ok and outcome.objective is not None:  # ok: the objective is there
            self.running = dict(proposal.candidate)
            self._parts.setdefault(k, []).append((proposal.length, math.log(outcome.objective)))
            self._rows[k] = outcome.row
        else:
            # A part outside a bound leaves the server serving; a failed start, or a benchmark
            # that hung, leaves what it runs unknown.
            self.running = dict(proposal.candidate) if outcome.ended == "constraint" else None
            self._failed[k] = outcome.ended
            if outcome.ended in START_ENDINGS and outcome.start_s > 0:
                self._start_failed[key(server_flags(proposal.candidate))] = outcome.ended
        return outcome

    def run(self, measure: Callable[[Proposal], Outcome]) -> Search:
        """Search until no move is left or the budget ends; the best is in ``best``."""
        try:
            self._search(measure)
        except Stop:
            self.stopped = (f"budget: {self.spent_s:.0f} of {self.budget_s:.0f} s spent; the "
                            "next part would not end within it")
            self._unconfirmed_back()
        return self

    def _unconfirmed_back(self) -> None:
        """The budget ended while a new best was measured on, before its repeat: it is kept
        at the length it reached only when it is clearly above the best it replaced (more
        than ``Z_CLEAR`` standard errors); else that one comes back."""
        if self._unconfirmed is None or self.best is None:
            return
        before, old = self._unconfirmed
        mine, weight = self._mean(key(self.best))
        if mine is None or old is None:
            return
        se = self.noise * math.sqrt(1 / weight + 1 / max(self._mean(key(before))[1], CHUNK))
        if not clearly_above(mine - old, se):
            self._back(before)

    def _take(self, candidate: Candidate) -> None:
        self.best = dict(candidate)
        self._taken[key(candidate)] = len(self._parts.get(key(candidate), []))
        self.best_row = self._rows.get(key(candidate), {})
        self.bests.append((len(self.tries), dict(candidate), self.score(candidate) or 0.0))

    def _measure_on(self, measure: Callable[[Proposal], Outcome], candidate: Candidate,
                    until: float, why: str) -> bool:
        """CANDIDATE measured part after part up to UNTIL of the benchmark (no restart once it
        runs); False when a part failed."""
        while self.weight(candidate) < until - 1e-9:
            if not self._measure(measure, Proposal(candidate, CHUNK, why)).ok:
                return False
        return True

    def _challenge(self, measure: Callable[[Proposal], Outcome], candidate: Candidate,
                   why: str, until: float | None = None) -> str:
        """CANDIDATE started once and measured part after part against the best until a
        verdict: ``worse`` drops it at once; ``better`` (or ``MAX_WEIGHT`` reached) ends the
        measuring. ``better`` takes its place, and it is measured on to ``BEST_WEIGHT`` while
        it runs: its repeat must still beat the best it replaced, or that one comes back.
        Returns the verdict, or how it failed; one measured before is not measured again."""
        k = key(candidate)
        until = MAX_WEIGHT if until is None else until
        if k in self._failed:
            return self._failed[k]
        if key(server_flags(candidate)) in self._start_failed:
            return self._start_failed[key(server_flags(candidate))]
        if k in self._verdicts and until <= MAX_WEIGHT:
            return self._verdicts[k][0]
        if self._runs_out(candidate):
            return "oom"  # asks at least the memory of one that ran out: not tried
        seen = "undecided"
        while self.weight(candidate) < until - 1e-9:
            outcome = self._measure(measure, Proposal(candidate, CHUNK, why))
            if not outcome.ok:
                return outcome.ended
            seen, _ = self.compare(candidate)
            if seen != "undecided":
                break
        self._verdicts[k] = self.compare(candidate)
        if seen != "better":
            return seen
        before = self.best
        old = self._bar()[0] if before is not None else None
        self._take(candidate)
        if before is None:
            return seen
        self._unconfirmed = (before, old)
        if not self._measure_on(measure, candidate, self.weight(candidate) + FRESH_WEIGHT,
                                f"{why}: the new best, measured on while it runs"):
            self._unconfirmed = None
            self._back(before)
            return self._failed.get(k, "bench")
        self._unconfirmed = None
        repeat = self._bar()[0]
        if repeat is not None and old is not None and repeat <= old:
            self._back(before)
            self._verdicts[k] = ("undecided", repeat - old)
            return "undecided"
        return seen

    def _back(self, before: Candidate) -> None:
        """The best before the last one comes back (its repeat did not beat it)."""
        self._take(before)

    def _search(self, measure: Callable[[Proposal], Outcome]) -> None:
        start = dict(self.start)
        if not self._measure_on(measure, start, START_WEIGHT, "the server as found"):
            if not self.weight(start):
                self.stopped = f"the server as found did not measure ({self._failed[key(start)]})"
                return
        self._take(start)
        while True:
            moves = self.moves()
            if moves:
                self._move(measure, *moves[0])
                continue
            taken = len(self.bests)
            self._together(measure)
            if len(self.bests) == taken:
                self._resolve(measure)
            if len(self.bests) == taken:
                self._duel(measure)
                self.stopped = (f"no move left that could beat the best by more than the "
                                f"noise ({self.noise:.1%} a whole run)")
                return

    def _against_found(self) -> tuple[float, float]:
        """The best's log ratio to the flags found and its standard error: the best's parts
        since it was taken (those before made it win), the flags found's all."""
        assert self.best is not None
        k = key(self.best)
        fresh = self._parts.get(k, [])[self._taken.get(k, 0):] or self._parts.get(k, [])
        weight = sum(length for length, _ in fresh)
        mine = sum(length * z for length, z in fresh) / weight
        theirs, found_weight = self._mean(key(self.start))
        assert theirs is not None
        return mine - theirs, self.noise * math.sqrt(1 / weight + 1 / found_weight)

    def _duel(self, measure: Callable[[Proposal], Outcome]) -> None:
        """The best against the flags found when it is not clearly above them (``Z_CLEAR``):
        the two measured in alternation (a restart each, ``DUEL_WEIGHT`` each time, at most
        ``DUEL_ROUNDS``), so that drift and a lucky run do not decide; the flags found come
        back unless the best is above them as a challenger must be (``Z_BETTER``)."""
        if self.best is None or key(self.best) == key(self.start):
            return
        best = dict(self.best)
        for _ in range(DUEL_ROUNDS):
            diff, se = self._against_found()
            if clearly_above(diff, se):
                return
            if diff + Z_WORSE * se < 0:
                break
            self._measure_on(measure, self.start, self.weight(self.start) + DUEL_WEIGHT,
                             "the flags found, in alternation with the best")
            if not self._measure_on(measure, best, self.weight(best) + DUEL_WEIGHT,
                                    "the best, in alternation with the flags found"):
                break
        if verdict(*self._against_found()) != "better" or key(best) in self._failed:
            self._take(self.start)

    def moves(self) -> list[tuple[Candidate, str]]:
        """The moves from the best not yet tried from it, as (candidate, why), in the order to
        try them: those the figures point at, then those never tried from any best; then
        those tried from an earlier best, by how much they could gain by the measures so far
        (``additive``: their effect there and elsewhere, plus ``Z_WORSE`` standard errors),
        while that is more than ``MIN_GAIN``. A move that asks at least the memory of a
        candidate that ran out of it comes with memory given back (``relief``). Left out:
        what the figures say changes nothing (``no_op``), what failed by itself."""
        assert self.best is not None
        pointed = {c for s in signals(self.best_row, self.low_power_pct)
                   for c in SIGNAL_ORDER[s]}
        effects, weights = self._effects()
        fresh: list[tuple[int, Candidate, str]] = []
        again: list[tuple[float, Candidate, str]] = []
        for coordinate in coordinate_order(self.space, self.best_row, self.low_power_pct):
            order = value_order(coordinate, self.space[coordinate], self.best[coordinate],
                                self.best_row, self.low_power_pct)
            for value in order:
                candidate = {**self.best, coordinate: value}
                if not valid(candidate) or (coordinate, value) in self._lost or \
                        no_op(coordinate, value, self.best, self.best_row):
                    continue
                why = f"{coordinate}={value!r}"
                if self._runs_out(candidate) or self._failed.get(key(candidate)) == "oom":
                    given = [c for c in relief(coordinate, value, self.best, self.space)
                             if key(c) not in self._failed and not self._runs_out(c)]
                    if not given:
                        continue
                    candidate = given[0]
                    why += " ran out of memory: again with " + ", ".join(
                        f"{n}={v!r}" for n, v in candidate.items()
                        if self.best.get(n) != v and n != coordinate)
                if key(candidate) in self._verdicts or key(candidate) in self._failed or \
                        key(server_flags(candidate)) in self._start_failed:
                    continue
                moved = [(n, v) for n, v in candidate.items() if self.best.get(n) != v]
                if any(item not in effects for item in moved):
                    # The benchmark's side first: measured on the running server.
                    tier = -1 if coordinate in CLIENT_SIDE else 0 if coordinate in pointed \
                        else 1
                    why += ": " + (", ".join(signals(self.best_row, self.low_power_pct))
                                   if tier == 0 else "not tried yet")
                    fresh.append((tier, candidate, why))
                    continue
                here = [(n, self.best[n]) for n, _ in moved]
                gain = sum(effects[m] for m in moved) - sum(effects.get(h, 0.0) for h in here)
                se = self.noise * math.sqrt(sum(1 / (weights.get(m, 0.0) + RIDGE)
                                                for m in [*moved, *here]))
                if gain + Z_WORSE * se > math.log1p(MIN_GAIN):
                    again.append((gain + Z_WORSE * se, candidate,
                                  f"{why}: {math.expm1(gain):+.1%} by the measures so far"))
        fresh.sort(key=lambda m: m[0])
        again.sort(key=lambda m: -m[0])
        return [m[1:] for m in fresh] + [m[1:] for m in again]

    def _effects(self) -> tuple[dict[tuple[str, Any], float], dict[tuple[str, Any], float]]:
        """The additive effects of every measured value, and the weight of their parts."""
        parts = [(self._candidate_of(k), length, z) for k, all_parts in self._parts.items()
                 for length, z in all_parts]
        weights: dict[tuple[str, Any], float] = {}
        for candidate, length, _ in parts:
            for item in candidate.items():
                weights[item] = weights.get(item, 0.0) + length
        return additive(parts), weights

    def _runs_out(self, candidate: Candidate) -> bool:
        """Whether CANDIDATE asks at least the memory of one that ran out of it."""
        return any(more_memory(candidate, self._candidate_of(f))
                   for f, ended in self._failed.items() if ended == "oom")

    def _move(self, measure: Callable[[Proposal], Outcome], candidate: Candidate,
              why: str) -> None:
        """CANDIDATE, a move from the best, challenged; a failure of its own (not memory)
        rules its value out for good."""
        assert self.best is not None
        ended = self._challenge(measure, candidate, why)
        moved = [(n, v) for n, v in candidate.items() if self.best.get(n) != v]
        if ended not in ("better", "worse", "undecided", "oom") and len(moved) == 1 and \
                moved[0][0] not in CLIENT_SIDE:
            self._lost.add(moved[0])  # its failure is its own
        if ended in ("worse", "undecided") and same_server(self.running, candidate):
            self._other_levels(measure, candidate)

    def _other_levels(self, measure: Callable[[Proposal], Outcome], candidate: Candidate
                      ) -> None:
        """CANDIDATE, a challenger that did not take the best's place, measured at the levels
        of the benchmark's side next to its own (``adjacent``) while it runs (no restart),
        each challenged as a move: where the measures so far say the level could make up the
        difference (``additive``: its effect against the level measured, plus ``Z_WORSE``
        standard errors, above ``MIN_GAIN``), or, where no level's effect is known yet, when
        the challenger came within the noise. One start measures what it can."""
        effects, _ = self._effects()
        for coordinate in (c for c in CLIENT_SIDE if c in self.space):
            here = candidate[coordinate]
            for value in adjacent(self.space[coordinate], here):
                other = {**candidate, coordinate: value}
                if self.best is None or key(other) in self._verdicts or \
                        key(other) in self._failed or not same_server(self.running, other):
                    continue
                seen, diff = self.compare(candidate)
                known = (coordinate, value) in effects and (coordinate, here) in effects
                if known:
                    gain = diff + effects[(coordinate, value)] - effects[(coordinate, here)]
                    if gain + Z_WORSE * self._se(other) <= math.log1p(MIN_GAIN):
                        continue
                elif seen == "worse":
                    continue
                self._challenge(measure, other, f"{coordinate}={value!r} on the same start as "
                                f"{coordinate}={here!r}")

    def _resolve(self, measure: Callable[[Proposal], Outcome]) -> None:
        """The challengers still undecided against the best, those on the running server
        first (no restart: another level of the benchmark's side), then the one that could
        beat it most (its score plus ``Z_WORSE`` standard errors), each measured on (one more
        start) until a verdict or ``RESOLVE_WEIGHT``, until one is better or none is left."""
        while True:
            close = []
            for k in self._verdicts:
                candidate = self._candidate_of(k)
                if k == key(self.best or {}) or self.weight(candidate) >= RESOLVE_WEIGHT - 1e-9:
                    continue
                seen, diff = self.compare(candidate)
                if seen == "undecided":
                    close.append((diff + Z_WORSE * self._se(candidate), k, candidate))
            if not close:
                return
            _, _, candidate = max(close, key=lambda c: (same_server(self.running, c[2]),
                                                        *c[:2]))
            if self._challenge(measure, candidate, "close to the best: measured on",
                               RESOLVE_WEIGHT) == "better":
                return

    def _se(self, candidate: Candidate) -> float:
        """The standard error of CANDIDATE's log ratio to the best."""
        return self.noise * math.sqrt(1 / max(self.weight(candidate), CHUNK)
                                      + 1 / max(self.best_weight, CHUNK))

    def _together(self, measure: Callable[[Proposal], Outcome]) -> None:
        """The moves of every coordinate at once that the measures so far, pooled as a sum of
        each value's effect (``additive``), say is best: small gains each within the noise
        add up to one that shows. Only values measured somewhere, from the best's flags."""
        assert self.best is not None
        best = self.best  # narrowed for the key below
        effects, _ = self._effects()
        together = dict(best)
        for name, values in self.space.items():
            known = [v for v in values if (name, v) in effects]
            if known:
                together[name] = max(known, key=lambda v: (effects[(name, v)],
                                                           v == best[name]))
        moved = {n: v for n, v in together.items() if self.best.get(n) != v}
        if not moved or not valid(together) or self._runs_out(together) or \
                key(together) in self._failed or key(together) in self._verdicts:
            return
        self._challenge(measure, together, "together: " + ", ".join(
            f"{n}={v!r}" for n, v in moved.items()) + " (the measures so far, pooled)")

    def _candidate_of(self, k: str) -> Candidate:
        return self._candidates[k]


@dataclass
class Replayed:
    """MEASURE that hands back RECORDED outcomes (a search's record, in order) while the search
    proposes the same tries, then measures with LIVE: a stopped or killed search, run again,
    goes on where it stopped without a restart or a benchmark for what it had measured.
    SERVING: what the server runs when the record is spent (the best a stop left it on; None,
    unknown, after a kill), not what the record's last try ran."""

    recorded: list[Try]
    live: Callable[[Proposal], Outcome]
    serving: Candidate | None = None
    replayed: int = 0
    went_live: bool = False

    def _recorded(self, proposal: Proposal) -> Try | None:
        """The recorded try PROPOSAL is, if the record holds it next."""
        if self.went_live or self.replayed >= len(self.recorded):
            return None
        done = self.recorded[self.replayed]
        same = (key(done.proposal.candidate), done.proposal.length) == (
            key(proposal.candidate), proposal.length)
        return done if same else None

    def running_before(self, proposal: Proposal, running: Candidate | None
                       ) -> Candidate | None:
        """What the server runs before PROPOSAL: RUNNING (the search's own account, from the
        outcomes) while the record hands them back; at the first part measured live,
        ``serving``."""
        return running if self.went_live or self._recorded(proposal) else self.serving

    def __call__(self, proposal: Proposal) -> Outcome:
        done = self._recorded(proposal)
        if done is not None:
            self.replayed += 1
            return done.outcome
        self.went_live = True  # the record spent, or another path: measured from here
        return self.live(proposal)
