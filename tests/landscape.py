"""A tuning landscape: how a server's throughput, latency, memory and failures follow from its
flags, read from a file (``tests/landscapes/*.yaml``), so that a new landscape needs no code.

Read by the stand-in server (``standin_sglang.py --landscape FILE``: its load, its pace and its
failures follow from the flags it was started with) and by the simulator of the tuning search
(``simulate``: the tests and ``bench/tune_search.py``). Standard library and PyYAML only
(PyYAML is one of sglang's own requirements, so it is in every release's venv).

The model, per candidate (the settings the search moves; null: SGLang's own, the landscape's
``sglang_defaults``):

- the KV cache holds ``kv.tokens_per_fraction * (mem_fraction_static - kv.weights_fraction)``
  tokens, less ``kv.graph_fraction_per_bs * cuda_graph_max_bs`` of the fraction with CUDA graphs;
- the concurrency: the benchmark's (``tune_concurrency``, a coordinate of the benchmark's side
  that a space may move: no restart), else the workload's;
- running requests = min(concurrency, the cap: ``max_running_requests``, else SGLang's own
  ``sglang_defaults.cap``; the requests whose tokens fit in the KV cache);
- output tok/s = ``peak_tok_s * rate * running / (running + half_running)`` (the GPUs saturate),
  ``rate`` the product of ``effects[coordinate][value].rate``; the GPUs' power share grows the same
  way, times the effects' ``power``; p99 time to first token grows with the queue and the
  effects' ``ttft``;
- ``interactions``: rules (``when`` as below) whose ``rate``, ``power`` or ``ttft`` multiply in
  when every condition holds (CUDA graphs that stop short of the batch: no gain);
- ``failures``: the first rule whose ``when`` holds ends the try (``oom``, ``start``, ``stall``,
  ``degenerate`` at its start; ``hang``: it starts and answers, then hangs under the
  benchmark's load); ``when`` maps a coordinate to a value, a list of values, or bounds
  (``{ge: 0.94}``, ``gt``, ``le``, ``lt``);
- a measurement's noise: ``noise_pct`` of the objective (one standard deviation) for the whole
  benchmark, times 1/sqrt(length) for a shorter one (``read``'s NOISE_PCT in its place: the
  same landscape at another noise). The server's own steady-state figure
  (``gen_throughput_mean``, as its /metrics give it) is the measured throughput itself, with
  the same noise: the simulator does not make the server's figures better than the
  benchmark's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

COORDINATES = ("max_running_requests", "mem_fraction_static", "disable_cuda_graph",
               "cuda_graph_max_bs", "moe_runner_backend", "chunked_prefill_size",
               "schedule_policy", "tune_concurrency")
ENDS = ("oom", "start", "stall", "degenerate", "hang")
BOUNDS = {"ge": lambda a, b: a >= b, "gt": lambda a, b: a > b, "le": lambda a, b: a <= b,
          "lt": lambda a, b: a < b}


class LandscapeError(ValueError):
    """A landscape file that does not say what it must: names the file and the key."""


def _matches(value: Any, rule: Any) -> bool:
    if isinstance(rule, dict):
        return value is not None and all(BOUNDS[op](value, bound) for op, bound in rule.items())
    if isinstance(rule, list):
        return value in rule
    return value == rule


@dataclass
class Landscape:
    name: str
    data: dict[str, Any]

    @classmethod
    def read(cls, path: Path, noise_pct: float | None = None) -> Landscape:
        data = yaml.safe_load(Path(path).read_text())
        if noise_pct is not None:
            data["noise_pct"] = noise_pct
        for needed in ("space", "start", "workload", "peak_tok_s", "half_running", "kv",
                       "sglang_defaults"):
            if needed not in data:
                raise LandscapeError(f"{path}: no {needed!r}")
        for name in data["space"]:
            if name not in COORDINATES:
                raise LandscapeError(f"{path}: space: {name!r} is not one of {COORDINATES}")
        for rule in data.get("interactions", []):
            if not isinstance(rule.get("when"), dict):
                raise LandscapeError(f"{path}: interactions: {rule!r}: needs when: {{...}}")
        for rule in data.get("failures", []):
            if rule.get("ends") not in ENDS or not isinstance(rule.get("when"), dict):
                raise LandscapeError(f"{path}: failures: {rule!r}: needs when: {{...}} and "
                                     f"ends: one of {ENDS}")
            for op_rule in rule["when"].values():
                if isinstance(op_rule, dict) and not set(op_rule) <= set(BOUNDS):
                    raise LandscapeError(f"{path}: failures: bounds {op_rule!r}: allowed "
                                         f"{', '.join(BOUNDS)}")
        return cls(Path(path).stem, data)

    @property
    def space(self) -> dict[str, tuple]:
        return {name: tuple(values) for name, values in self.data["space"].items()}

    @property
    def start(self) -> dict[str, Any]:
        return dict(self.data["start"])

    def _value(self, candidate: dict[str, Any], name: str) -> Any:
        value = candidate.get(name)
        return self.data["sglang_defaults"].get(name) if value is None else value

    def _effect(self, candidate: dict[str, Any], what: str) -> float:
        factor = 1.0
        for name, table in self.data.get("effects", {}).items():
            entry = table.get(candidate.get(name), table.get(str(candidate.get(name)), {}))
            factor *= float(entry.get(what, 1.0)) if isinstance(entry, dict) else 1.0
        for rule in self.data.get("interactions", []):
            if all(_matches(candidate.get(name), r) for name, r in rule["when"].items()):
                factor *= float(rule.get(what, 1.0))
        return factor

    def rate(self, candidate: dict[str, Any]) -> float:
        """How much faster each running request goes than with the landscape's base flags."""
        return self._effect(candidate, "rate")

    def failure(self, candidate: dict[str, Any]) -> str | None:
        """How CANDIDATE's start or run ends, or None when it serves."""
        for rule in self.data.get("failures", []):
            if all(_matches(candidate.get(name), r) for name, r in rule["when"].items()):
                return rule["ends"]
        return None

    def kv_tokens(self, candidate: dict[str, Any]) -> int:
        kv = self.data["kv"]
        fraction = float(self._value(candidate, "mem_fraction_static")) - kv["weights_fraction"]
        if not candidate.get("disable_cuda_graph"):
            fraction -= kv.get("graph_fraction_per_bs", 0) * float(
                self._value(candidate, "cuda_graph_max_bs") or 0)
        return max(0, int(kv["tokens_per_fraction"] * fraction))

    def figures(self, candidate: dict[str, Any], concurrency: int | None = None) -> dict[str, Any]:
        """The true figures of CANDIDATE at CONCURRENCY (the workload's by default), as the
        benchmark's level row holds them (``bench.metric_columns``, ``gpu_power_pct``)."""
        work = self.data["workload"]
        level = concurrency or candidate.get("tune_concurrency") or work["concurrency"]
        per_request = work["input_len"] + work["output_len"]
        kv = self.kv_tokens(candidate)
        cap = candidate.get("max_running_requests") or self.data["sglang_defaults"]["cap"]
        running = max(0, min(level, cap, kv // per_request))
        rate = self._effect(candidate, "rate")
        half = self.data["half_running"]
        busy = running / (running + half) if running else 0.0
        queue = level - running
        ttft = (work.get("prefill_ms", 100) * self._effect(candidate, "ttft")
                * (1 + queue / max(running, 1)))
        return {
            "concurrency": level,
            "output_token_throughput": self.data["peak_tok_s"] * rate * busy,
            "p99_ttft_ms": ttft,
            "running_reqs_max": running, "running_reqs_mean": running,
            "queue_reqs_mean": queue, "queue_reqs_max": queue,
            "token_usage_max": running * per_request / kv if kv else 1,
            "gpu_power_pct": min(100.0, 15 + 80 * busy * self._effect(candidate, "power")),
            "kv_tokens": kv,
        }

    def measure(self, candidate: dict[str, Any], length: float, rng: random.Random
                ) -> tuple[str, dict[str, Any], float]:
        """One simulated try: (how it ended, its row, seconds it cost). A failed try costs its
        start (and the stall's wait); a measured one its start and LENGTH of the benchmark."""
        costs = self.data.get("costs", {"start_s": 300, "bench_s": 600})
        ended = self.failure(candidate)
        if ended == "hang":
            return ended, {"concurrency": self.data["workload"]["concurrency"]}, \
                costs["start_s"] + 2 * costs["bench_s"] * length
        if ended:
            return ended, {}, costs["start_s"] * (1.5 if ended == "stall" else 1)
        row = self.noisy(candidate, length, rng)
        bound = self.data["workload"].get("max_p99_ttft_ms")
        ended = "constraint" if bound is not None and row["p99_ttft_ms"] > bound else "measured"
        return ended, row, costs["start_s"] + costs["bench_s"] * length

    def noisy(self, candidate: dict[str, Any], length: float, rng: random.Random,
              concurrency: int | None = None) -> dict[str, Any]:
        """CANDIDATE's row measured over LENGTH of the benchmark at CONCURRENCY (its own
        ``tune_concurrency``, else the workload's, by default): the throughput with the
        landscape's noise, as the benchmark and the server's /metrics give it."""
        row = self.figures(candidate, concurrency)
        sd = self.data.get("noise_pct", 1.0) / 100 / math.sqrt(length)
        row["output_token_throughput"] *= max(0.0, rng.gauss(1.0, sd))
        row["gen_throughput_mean"] = row["output_token_throughput"]
        row["metrics_scrapes"] = max(1, int(length * self.costs["bench_s"]))
        return row

    @property
    def costs(self) -> dict[str, float]:
        return self.data.get("costs", {"start_s": 300, "bench_s": 600})

    def objective(self, candidate: dict[str, Any]) -> float | None:
        """The true objective of CANDIDATE: None where it fails (or hangs) or breaks a bound."""
        if self.failure(candidate):
            return None
        row = self.figures(candidate)
        bound = self.data["workload"].get("max_p99_ttft_ms")
        if bound is not None and row["p99_ttft_ms"] > bound:
            return None
        return row["output_token_throughput"]
