"""The peers the tuning search is set against in ``bench/tune_search.py``: Optuna's TPE sampler
(the failed tries as constraints, its Hyperband pruner over the parts of the benchmark) and a
random search, on the same simulated server and clock (``tests/tune_sim.py``), in the same
space, from the same start, within the same budget, with the same seeds.

Both follow the search's own rules of cost: a restart only when the flags change (not for a
move of the benchmark's side alone, ``space.same_server``); the
benchmark in parts of ``strategy.CHUNK`` of its length on one start; no part begun that could
not end within the budget. What each keeps is what it measured best (Optuna: its best trial
among those that kept the constraints; random: the best mean of a whole run).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pve_sglang.tuning.space import Candidate, grid, same_server
from pve_sglang.tuning.strategy import CHUNK

#: Parts of one whole benchmark.
PARTS = round(1 / CHUNK)


class OutOfBudget(Exception):
    pass


@dataclass
class Budgeted:
    """A simulated server (``tune_sim.SimServer``) spent within BUDGET_S: a restart only when the
    flags change; a part refused (``OutOfBudget``) when the clock says it could not end in the
    budget (the restart's and the part's times as the landscape's costs, which the peers are
    given, a restart back to what they keep held in reserve as the search holds it)."""

    server: Any
    budget_s: float
    running: Candidate | None = None
    tries: int = 0
    starts: int = 0
    kept: Candidate | None = None
    _failed: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.running = dict(self.server.landscape.start)

    @property
    def spent_s(self) -> float:
        return self.server.clock.now

    def part(self, candidate: Candidate) -> float | None:
        """One part of CANDIDATE's benchmark: its objective, or None (it failed)."""
        costs = self.server.landscape.costs
        restart = not same_server(self.running, candidate)
        back = costs["start_s"] if self.kept is not None and not same_server(self.kept, candidate) \
            else 0.0
        if self.spent_s + (costs["start_s"] if restart else 0) + CHUNK * costs["bench_s"] \
                + back > self.budget_s:
            raise OutOfBudget
        self.tries += 1
        if restart:
            self.starts += 1
            self.running = None
            if self.server.apply(candidate):
                return None
            self.running = dict(candidate)
        level = candidate.get("tune_concurrency") or \
            self.server.landscape.data["workload"]["concurrency"]
        row = self.server.measure(CHUNK, 2 * CHUNK * costs["bench_s"] + 120, level)
        value = row.get("gen_throughput_mean")
        bound = self.server.landscape.data["workload"].get("max_p99_ttft_ms")
        if not isinstance(value, (int, float)):
            self.running = None
            return None
        if bound is not None and row.get("p99_ttft_ms", 0) > bound:
            return None
        return float(value)


def _canonical(candidate: Candidate) -> Candidate:
    """A CUDA graph batch means nothing with graphs off (``space.valid``): SGLang's own then."""
    if candidate.get("disable_cuda_graph") is True and "cuda_graph_max_bs" in candidate:
        return {**candidate, "cuda_graph_max_bs": None}
    return candidate


def random_search(server: Any, budget_s: float, seed: int) -> dict[str, Any]:
    """Candidates drawn at random from the grid, the server as found first, each measured for
    a whole run (``PARTS`` parts on one start); the best mean kept."""
    landscape = server.landscape
    rng = random.Random(seed)
    candidates = grid(landscape.space)
    run = Budgeted(server, budget_s)
    best, best_value = None, -math.inf
    queue = [dict(landscape.start)]
    try:
        while True:
            candidate = queue.pop() if queue else rng.choice(candidates)
            values = []
            for _ in range(PARTS):
                value = run.part(candidate)
                if value is None:
                    break
                values.append(value)
            if len(values) == PARTS and sum(values) / PARTS > best_value:
                best, best_value = candidate, sum(values) / PARTS
                run.kept = best
    except OutOfBudget:
        pass
    return {"best": best, "tries": run.tries, "starts": run.starts,
            "hours": run.spent_s / 3600, "weight": 1.0}


def optuna_search(server: Any, budget_s: float, seed: int) -> dict[str, Any]:
    """Optuna's TPE sampler (seeded; the failed tries as constraints) and its Hyperband pruner
    over the parts of a run (a trial reports its mean after each part; a pruned one ends
    there), the server as found enqueued first; its best feasible complete trial kept."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    landscape = server.landscape
    space = landscape.space
    run = Budgeted(server, budget_s)
    # A trial's constraint (``Trial.set_constraint``): 1 when it failed, 0 when it ran; TPE
    # models the feasible and the infeasible apart.
    sampler = optuna.samplers.TPESampler(seed=seed)
    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=PARTS,
                                            reduction_factor=2)
    # A named study: Hyperband places trials in brackets by a hash of its name.
    study = optuna.create_study(study_name=f"bench-{landscape.name}-{seed}", direction="maximize",
                                sampler=sampler, pruner=pruner)
    study.enqueue_trial(dict(landscape.start))

    def objective(trial: optuna.trial.Trial) -> float:
        candidate = _canonical({name: trial.suggest_categorical(name, list(values))
                                for name, values in space.items()})
        values: list[float] = []
        for step in range(1, PARTS + 1):
            value = run.part(candidate)
            if value is None:
                trial.set_constraint("failed", 1.0)
                return 0.0
            values.append(value)
            trial.report(sum(values) / len(values), step)
            if step < PARTS and trial.should_prune():
                trial.set_constraint("failed", 0.0)
                raise optuna.TrialPruned
        trial.set_constraint("failed", 0.0)
        mean = sum(values) / len(values)
        if run.kept is None or mean > kept["value"]:
            run.kept, kept["value"] = candidate, mean
        return mean

    kept = {"value": -math.inf}

    try:
        study.optimize(objective, catch=(), callbacks=[], n_trials=10_000,
                       gc_after_trial=False)
    except OutOfBudget:
        pass
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
                and t.constraints.get("failed") == 0.0]
    best = _canonical(max(complete, key=lambda t: t.value).params) if complete else None
    return {"best": best, "tries": run.tries, "starts": run.starts,
            "hours": run.spent_s / 3600, "weight": 1.0}


PEERS: dict[str, Callable[[Any, float, int], dict[str, Any]]] = {
    "optuna_tpe_hyperband": optuna_search,
    "random": random_search,
}
