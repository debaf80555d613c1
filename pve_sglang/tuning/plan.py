"""What a search of one container will do, before it does anything: its space, its budget, its
objective and bound, and the first candidates (``make tune ARGS=--dry`` prints it).

Pure: the container's settings in, lines out. Whether the model is MoE is read from its
``config.json`` (``is_moe``) where the search runs; before that, ``moe`` None says the MoE
backend is in the space only if the model turns out to be MoE.
"""

from __future__ import annotations

from typing import Any

from pve_sglang.config.settings import ContainerSettings
from pve_sglang.tuning.space import default_space, grid, key, start_of, user_space
from pve_sglang.tuning.strategy import REPEATS, RUNGS, coordinate_order

#: Keys of a model's config.json that only a mixture-of-experts model has (Hugging Face
#: transformers' configs: Mixtral/Qwen-MoE ``num_local_experts``/``num_experts``, DeepSeek
#: ``n_routed_experts``, GLM/Qwen3-MoE ``moe_intermediate_size``).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def is_moe(config: dict[str, Any]) -> bool:
    """Whether a model's config.json (CONFIG) describes a mixture-of-experts model; a
    multimodal model's text part (``text_config``) counts."""
    parts = [config, config.get("text_config") or {}]
    return any(isinstance(part, dict) and part.get(k) for part in parts for k in MOE_KEYS)


def space_for(settings: ContainerSettings, moe: bool | None,
              own: frozenset[str] = frozenset()) -> dict[str, tuple]:
    """The container's space: its ``tune_space``, else the default one less what its own
    entry sets (OWN: the user's, never moved); with MOE None, the MoE backend kept in."""
    if settings.tune_space is not None:
        return user_space(settings.tune_space, settings.sglang_version)
    space = default_space(settings.sglang_version, moe if moe is not None else True)
    return {name: values for name, values in space.items() if name not in own}


def objective_concurrency(settings: ContainerSettings) -> int:
    return settings.tune_concurrency or max(settings.bench_concurrencies)


def plan_lines(name: str, settings: ContainerSettings, moe: bool | None,
               own: frozenset[str] = frozenset(), first: int = 8) -> list[str]:
    """What ``--dry`` shows for container NAME."""
    space = space_for(settings, moe, own)
    start = start_of(settings, space)
    level = objective_concurrency(settings)
    bound = (f", p99 time to first token at most {settings.tune_max_p99_ttft_ms:g} ms"
             if settings.tune_max_p99_ttft_ms else "")
    lines = [
        f"{name}: tuning search on sglang {settings.sglang_version}",
        f"  objective: output tok/s at concurrency {level}{bound}; benchmark "
        f"{settings.bench_input_len} in / {settings.bench_output_len} out tokens, lengths "
        f"{', '.join(f'{r:g}' for r in RUNGS)} of the whole",
        f"  budget: {settings.tune_budget_s} s ({settings.tune_budget_s / 3600:.1f} h)",
        f"  space ({len(grid(space))} candidates in the grid):",
    ]
    for coordinate, values in space.items():
        note = " (only if the model is MoE: read from its config.json)" if (
            coordinate == "moe_runner_backend" and moe is None) else ""
        mark = [f"[{v!r}]" if v == start[coordinate] else repr(v) for v in values]
        lines.append(f"    {coordinate}: {', '.join(mark)}{note}")
    if own:
        lines.append(f"  kept as the container's own entry sets them: {', '.join(sorted(own))}")
    lines.append(f"  tuned file: {settings.tune_dir}/<host>-<container>.yml")
    lines.append("  first tries:")
    tries = [f"the server as found: {key(start)}",
             *[f"the server as found again (the noise, {n + 1} of {REPEATS - 1})"
               for n in range(REPEATS - 1)]]
    order = coordinate_order(space, {}, settings.bench_low_power_pct)
    if order:
        coordinate = order[0]
        tries.append(f"the best at {RUNGS[0]:g} ({coordinate} first: no figures yet)")
        tries += [f"{coordinate}={value!r} at {RUNGS[0]:g}" for value in space[coordinate]
                  if value != start[coordinate]]
    lines += [f"    {n}. {text}" for n, text in enumerate(tries[:first], 1)]
    return lines
