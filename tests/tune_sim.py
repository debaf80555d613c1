"""A server on a landscape (``landscape.py``) and a simulated clock, for the real ``Drive``: each
restart and each part of the benchmark moves the clock by the landscape's costs, and each
part's figures are the landscape's with its noise. Used by tests/unit/test_tune_search.py and
bench/tune_search.py (where the peers run on the same server and clock).

The server holds state as a real one does: it runs the flags it was last started with, or none
after a failed start; a candidate that hangs (``ends: hang``) starts and answers, then hangs
in the benchmark until its time limit, and serves nothing until the next restart. A part
is measured at the level the drive asks (``tune_concurrency``, the benchmark's side) on the
flags the server runs; ``starts`` counts its restarts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape import Landscape
from pve_sglang.tuning.drive import Drive, Server
from pve_sglang.tuning.space import Candidate, grid, key
from pve_sglang.tuning.strategy import Search

#: The seed's model and machine: a restart and a whole benchmark (tests/landscapes/seed_moe.yaml).
SEED_COSTS = {"start_s": 420, "bench_s": 600}
#: The default budget of ``make tune`` (settings' ``tune_budget_s``).
BUDGET_S = 8 * 3600


@dataclass
class Clock:
    """Seconds since the search began, moved by the simulated server only."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class SimServer:
    """A ``Server`` on LANDSCAPE whose noise comes from SEED; CLOCK moves with each restart
    (``costs.start_s``; a stall half as long again) and each part (``costs.bench_s`` times its
    length). ``serving``: the flags it serves, None after a failed start or a hang."""

    landscape: Landscape
    seed: int
    clock: Clock = field(default_factory=Clock)
    serving: Candidate | None = None
    hung: bool = False
    starts: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.serving = dict(self.landscape.start)

    def apply(self, candidate: Candidate) -> str:
        self.starts += 1
        ended = self.landscape.failure(candidate)
        start_s = self.landscape.costs["start_s"]
        self.clock.now += start_s * (1.5 if ended == "stall" else 1)
        self.hung = False
        if ended and ended != "hang":
            self.serving = None
            return ended
        self.serving = dict(candidate)
        return ""

    def measure(self, length: float, limit_s: float, level: int) -> dict[str, Any]:
        bench_s = self.landscape.costs["bench_s"] * length
        if self.serving is None or self.hung:
            self.clock.now += 10  # the benchmark's first request fails at once
            return {"concurrency": level}
        if self.landscape.failure(self.serving) == "hang":
            self.hung = True
            self.clock.now += limit_s
            return {"concurrency": level}
        self.clock.now += bench_s
        return self.landscape.noisy(self.serving, length, self.rng, level)

    def server(self) -> Server:
        return Server(self.apply, self.measure)


def drive(landscape: Landscape, tmp: Path, seed: int = 0, budget_s: float = BUDGET_S,
          name: str = "sim") -> tuple[Drive, SimServer]:
    """The real ``Drive`` of a search on LANDSCAPE, its files under TMP, and its server."""
    server = SimServer(landscape, seed)
    bound = landscape.data["workload"].get("max_p99_ttft_ms")
    costs = landscape.costs
    return Drive(landscape.space, landscape.start, budget_s, tmp / f"{name}-{seed}.yml",
                 landscape.data["workload"]["concurrency"], bound, clock=server.clock,
                 start_s=costs["start_s"], bench_s=costs["bench_s"]), server


def search(landscape: Landscape, tmp: Path, seed: int = 0, budget_s: float = BUDGET_S
           ) -> tuple[Search, SimServer]:
    """One whole search through the real ``Drive``, its record under TMP."""
    run, server = drive(landscape, tmp, seed, budget_s)
    return run.run(server.server()), server


_BEST: dict[str, tuple[dict[str, Any], float]] = {}


def best_of(landscape: Landscape) -> tuple[dict[str, Any], float]:
    """The grid's best candidate and its true objective."""
    if landscape.name not in _BEST:
        scored = [(c, landscape.objective(c)) for c in grid(landscape.space)]
        _BEST[landscape.name] = max(((c, v) for c, v in scored if v is not None),
                                    key=lambda cv: cv[1])
    return _BEST[landscape.name]


def share(landscape: Landscape, candidate: Candidate | None) -> float:
    """CANDIDATE's true objective as a share of the grid's best (0 where it fails)."""
    if candidate is None:
        return 0.0
    return (landscape.objective(candidate) or 0.0) / best_of(landscape)[1]


def same(a: Candidate | None, b: Candidate | None) -> bool:
    return a is not None and b is not None and key(a) == key(b)
