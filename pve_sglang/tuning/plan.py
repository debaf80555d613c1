"""What a search of one container will do, before it does anything: its space, its budget and
what the budget buys at the container's measured start time, its objective and bound, and the
first tries (``make tune ARGS=--dry`` prints it).

Pure: the container's tuning settings in (``TuningView``), lines out. Whether the model is MoE
is read from its ``config.json`` (``is_moe``) where the search runs; before that, ``moe`` None
says the MoE backend is in the space only if the model turns out to be MoE. The start time is the server's
last start as its journal shows it (``start_seconds``), where there is one.
"""

from __future__ import annotations

import re
from typing import Any

from pve_sglang.config.settings import TuningView
from pve_sglang.server.startup_log import READY_LINE
from pve_sglang.tuning.space import default_space, grid, key, start_of, user_space, valid
from pve_sglang.tuning.strategy import CHUNK, START_WEIGHT, coordinate_order, value_order

#: A start assumed where none was measured (the seed's: 420 s), and a whole benchmark until
#: one is measured (the seed's: 600 s).
ASSUMED_START_S = 420.0
ASSUMED_BENCH_S = 600.0
#: What the search kept on the simulated landscapes of the seed's class at 4% noise
#: (docs/benchmarks.md, ``make bench-tune``), by its budget in whole tries (a restart and a
#: whole benchmark): (at least that many, the words).
EXPECTED = (
    (0, "less than 2 h at the seed's costs: the large steps the figures point at, likely "
        "not the last percent"),
    (7, "like 2 h at the seed's costs (7 whole tries): {two}"),
    (28, "like 8 h at the seed's costs (28 whole tries): {eight}"),
)
#: The figures the bench gave for those budgets (five landscapes, seeds 0-9; 30-69 too at 8 h).
BENCH_2H = ("within 5% of the best in 20 of 50 simulated searches: those found near it; "
            "0.66-0.90 of it (median) where found far below")
BENCH_8H = ("within 5% of the best in 46 of 50 simulated searches (181 of 200 on other "
            "seeds), never below the flags found beyond the noise")

#: Keys of a model's config.json that only a mixture-of-experts model has (Hugging Face
#: transformers' configs: Mixtral/Qwen-MoE ``num_local_experts``/``num_experts``, DeepSeek
#: ``n_routed_experts``, GLM/Qwen3-MoE ``moe_intermediate_size``).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def is_moe(config: dict[str, Any]) -> bool:
    """Whether a model's config.json (CONFIG) describes a mixture-of-experts model; a
    multimodal model's text part (``text_config``) counts."""
    parts = [config, config.get("text_config") or {}]
    return any(isinstance(part, dict) and part.get(k) for part in parts for k in MOE_KEYS)


def space_for(tuning: TuningView, moe: bool | None,
              own: frozenset[str] = frozenset()) -> dict[str, tuple]:
    """The container's space: its ``tune_space``, else the default one less what its own
    entry sets (OWN: the user's, never moved); with MOE None, the MoE backend kept in."""
    if tuning.tune_space is not None:
        return user_space(tuning.tune_space, tuning.sglang_version)
    space = default_space(tuning.sglang_version, moe if moe is not None else True)
    return {name: values for name, values in space.items() if name not in own}


def objective_concurrency(tuning: TuningView) -> int:
    return tuning.tune_concurrency or max(tuning.bench_concurrencies)


#: A journal line of ``journalctl -o short-unix``: its time, then the rest.
_JOURNAL = re.compile(r"^(\d+(?:\.\d+)?) (.*)$")


def start_seconds(lines: list[str]) -> float | None:
    """The seconds of the server's last start that reached its ready line, from its unit's
    journal (``journalctl -o short-unix``: systemd's ``Started`` line, then the server's
    ``READY_LINE``); None where the journal shows none."""
    began: float | None = None
    took: float | None = None
    for line in lines:
        match = _JOURNAL.match(line.strip())
        if not match:
            continue
        when, text = float(match[1]), match[2]
        if ": Started " in text or text.startswith("Started "):
            began = when
        elif READY_LINE in text and began is not None:
            took, began = when - began, None
    return took


def budget_lines(budget_s: int, start_s: float | None) -> list[str]:
    """What BUDGET_S buys at a start of START_S (None: not measured, ``ASSUMED_START_S``)."""
    start = start_s if start_s is not None else ASSUMED_START_S
    bench = ASSUMED_BENCH_S
    first = START_WEIGHT * bench
    restarts = max(0, int((budget_s - first - start) // (start + CHUNK * bench)))
    whole = budget_s / (start + bench)
    said = next(words for least, words in reversed(EXPECTED) if whole >= least)
    source = ("measured: the server's last start" if start_s is not None
              else "assumed: no start measured")
    return [
        f"  budget: {budget_s} s ({budget_s / 3600:.1f} h), the restart back to the best "
        "included",
        f"    at a start of {start:.0f} s ({source}) "
        f"and a whole benchmark of about {bench:.0f} s (until measured): at most {restarts} "
        f"restarts with a part ({CHUNK:g} of the benchmark) each, {whole:.0f} whole tries",
        "    expected: " + said.format(two=BENCH_2H, eight=BENCH_8H),
    ]


def plan_lines(name: str, tuning: TuningView, moe: bool | None,
               own: frozenset[str] = frozenset(), first: int = 8,
               start_s: float | None = None) -> list[str]:
    """What ``--dry`` shows for container NAME; START_S, its server's measured start time."""
    space = space_for(tuning, moe, own)
    start = start_of(tuning, space)
    level = objective_concurrency(tuning)
    bound = (f", p99 time to first token at most {tuning.tune_max_p99_ttft_ms:g} ms"
             if tuning.tune_max_p99_ttft_ms else "")
    lines = [
        f"{name}: tuning search on sglang {tuning.sglang_version}",
        f"  objective: output tok/s at concurrency {level}{bound} (the server's own steady "
        f"state over the benchmark's window, where its /metrics give it); benchmark "
        f"{tuning.bench_input_len} in / {tuning.bench_output_len} out tokens, in parts of "
        f"{CHUNK:g} of the whole",
        *budget_lines(tuning.tune_budget_s, start_s),
        f"  space ({len(grid(space))} candidates in the grid):",
    ]
    for coordinate, values in space.items():
        note = " (only if the model is MoE: read from its config.json)" if (
            coordinate == "moe_runner_backend" and moe is None) else ""
        mark = [f"[{v!r}]" if v == start[coordinate] else repr(v) for v in values]
        lines.append(f"    {coordinate}: {', '.join(mark)}{note}")
    if own:
        lines.append(f"  kept as the container's own entry sets them: {', '.join(sorted(own))}")
    lines.append(f"  tuned file: {tuning.tune_dir}/<host>-<container>.yml")
    lines.append("  first tries:")
    tries = [f"the server as found, where it runs (no restart): {START_WEIGHT:g} of the "
             f"benchmark in parts: {key(start)}"]
    order = coordinate_order(space, {}, tuning.bench_low_power_pct)
    for coordinate in order:
        tries += [f"{coordinate}={value!r} (one start, parts until a verdict)"
                  for value in value_order(coordinate, space[coordinate], start[coordinate],
                                           {}, tuning.bench_low_power_pct)
                  if valid({**start, coordinate: value})]
    lines += [f"    {n}. {text}" for n, text in enumerate(tries[:first], 1)]
    lines.append("    ... the moves in the order the server's figures ask once it is measured "
                 "(with none yet, the order above)")
    return lines
