"""The tuning search run on a landscape (``landscape.py``) instead of a server: each try's
outcome is the landscape's figures with its noise, its cost the landscape's start (only when
the flags change: the same server measured again needs no restart) and benchmark length.
Used by tests/test_tune_search.py and bench/tune_search.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from landscape import Landscape
from pve_sglang.tuning.space import key
from pve_sglang.tuning.strategy import Outcome, Proposal, Search


@dataclass
class Simulated:
    """MEASURE for ``Search.run`` on LANDSCAPE; ``running`` is the flags the server has."""

    landscape: Landscape
    seed: int = 0
    running: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.running = dict(self.landscape.start)

    def __call__(self, proposal: Proposal) -> Outcome:
        ended, row, cost = self.landscape.measure(proposal.candidate, proposal.length, self.rng)
        if key(proposal.candidate) == key(self.running) and ended != "start":
            cost -= self.landscape.data.get("costs", {}).get("start_s", 300)  # no restart
        self.running = dict(proposal.candidate) if ended in ("measured", "constraint") else {}
        objective = row.get("output_token_throughput") if ended == "measured" else None
        return Outcome(ended, objective, row, max(cost, 0.0))


def search(landscape: Landscape, budget_s: float = 1e9, seed: int = 0) -> Search:
    return Search(landscape.space, landscape.start, budget_s).run(Simulated(landscape, seed))


def reached(landscape: Landscape, run: Search, share: float = 0.95) -> tuple[int, float] | None:
    """(tries, seconds) until the best the search had taken was truly within SHARE of the
    landscape's best (the grid's); None if it never was."""
    target = share * best_of(landscape)[1]
    for made, candidate, _ in run.bests:
        if (landscape.objective(candidate) or 0) >= target:
            return made, sum(t.outcome.cost_s for t in run.tries[:made])
    return None


def best_of(landscape: Landscape) -> tuple[dict[str, Any], float]:
    """The grid's best candidate and its true objective."""
    scored = [(c, landscape.objective(c)) for c in grid_of(landscape)]
    return max(((c, v) for c, v in scored if v is not None), key=lambda cv: cv[1])


def grid_of(landscape: Landscape) -> list[dict[str, Any]]:
    from pve_sglang.tuning.space import grid

    return grid(landscape.space)
