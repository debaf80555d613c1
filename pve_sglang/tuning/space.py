"""The tuning search's space: which server settings it moves, and the values each may take.

A coordinate is a container setting the deploy already renders into the server's command line
(``server.command.server_argv``), so a try is a settings change like any other and the best is
kept as settings (``tuning.tuned_file``). Each value is checked by the setting's own field rule
(``config.settings.ContainerSettings``) and spelled for the container's release when rendered;
a value the release does not have (a schedule policy newer than it) is left out of the default
space, and the release's own parser checks every candidate before any restart (``tune.py``).

The default space is the one the seed's days of hand tuning moved (880 -> 3,740 tok/s): the
running-request cap, CUDA graphs and their largest batch, ``mem_fraction_static``, the chunked
prefill size, the MoE runner backend (only where the model is MoE) and the schedule policy.
A coordinate of the benchmark's side (``CLIENT_SIDE``: ``tune_concurrency``, the level the
benchmark measures at) changes no flag: a try that moves only it is measured on the server as
it runs, no restart (``server_flags``). It is never in the default space: a user's
``tune_space`` lists it (``{tune_concurrency: [64, 128, 256]}``) to search the load too, with
``tune_max_p99_ttft_ms`` as its bound.

Values are listed from the most conservative (SGLang's own default first where it has one) so
that, for an ordered coordinate, a value that fails (out of memory) rules out those after it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from packaging.version import Version
from pydantic import TypeAdapter, ValidationError

from pve_sglang.config.settings import ContainerSettings, TuningView
from pve_sglang.server.spelling import SCHEDULE_POLICY_SINCE

#: A candidate: setting name -> value (None: the setting's null, SGLang's own choice).
Candidate = dict[str, Any]

#: The coordinates the search may move, in the order it tries them when no figure says more.
COORDINATES = ("max_running_requests", "mem_fraction_static", "disable_cuda_graph",
               "cuda_graph_max_bs", "moe_runner_backend", "chunked_prefill_size",
               "schedule_policy")
#: Coordinates of the benchmark's side: settings the server's command line does not hold (the
#: concurrency measured at; null: the objective's own level, ``plan.objective_concurrency``).
CLIENT_SIDE = ("tune_concurrency",)
#: Coordinates whose values are ordered: a value that runs out of memory rules out the larger.
ORDERED = ("mem_fraction_static", "cuda_graph_max_bs", "chunked_prefill_size")
#: The default values, conservative first (None: SGLang's own).
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "max_running_requests": (None, 64, 128, 256, 512, 1024),
    "mem_fraction_static": (0.8, 0.85, 0.88, 0.9, 0.92, 0.94),
    "disable_cuda_graph": (True, False),
    "cuda_graph_max_bs": (None, 64, 160, 256, 512),
    "moe_runner_backend": ("auto", "triton", "flashinfer_cutlass", "flashinfer_trtllm"),
    "chunked_prefill_size": (None, 2048, 4096, 8192, 16384),
    "schedule_policy": (None, "lpm", "hrrn"),  # None: SGLang's own, fcfs
}
#: A schedule policy newer than 0.5.9 -> the first release with it.
POLICY_SINCE = SCHEDULE_POLICY_SINCE


class SpaceError(ValueError):
    """A search space the settings cannot take: names the coordinate, the value, what is allowed."""


def _field_adapter(name: str) -> TypeAdapter:
    field = ContainerSettings.model_fields[name]
    annotation = field.annotation
    assert annotation is not None, f"{name}: every ContainerSettings field is annotated"
    if not field.metadata:
        return TypeAdapter(annotation)
    # ignored: an Annotated built at run time from the field's parts has no static form.
    return TypeAdapter(Annotated[(annotation, *field.metadata)])  # type: ignore[arg-type]


def check_value(name: str, value: Any) -> Any:
    """VALUE as setting NAME's own rule takes it; SpaceError naming both otherwise."""
    if name not in COORDINATES and name not in CLIENT_SIDE:
        raise SpaceError(f"tune_space: {name!r} is not a coordinate; allowed: "
                         f"{', '.join((*COORDINATES, *CLIENT_SIDE))}")
    try:
        return _field_adapter(name).validate_python(value)
    except ValidationError as error:
        why = "; ".join(e["msg"] for e in error.errors())
        raise SpaceError(f"tune_space: {name} value {value!r}: {why}") from None


def default_space(release: str, moe: bool) -> dict[str, tuple[Any, ...]]:
    """The default space for a container on sglang RELEASE; the MoE backend only where the
    model is MoE (the flag does nothing for a dense model, and each try costs a restart)."""
    space = {}
    for name in COORDINATES:
        if name == "moe_runner_backend" and not moe:
            continue
        values = DEFAULTS[name]
        if name == "schedule_policy":
            values = tuple(v for v in values
                           if Version(release) >= Version(POLICY_SINCE.get(v, "0")))
        space[name] = values
    return space


def user_space(given: Mapping[str, Iterable[Any]], release: str) -> dict[str, tuple[Any, ...]]:
    """A space of the user's (coordinate -> values), each value checked by its setting's rule
    and by the release (SpaceError before anything runs)."""
    space = {}
    for name, values in given.items():
        checked = tuple(check_value(name, v) for v in values)
        if not checked:
            raise SpaceError(f"tune_space: {name} lists no value; allowed: one or more")
        for value in checked:
            since = POLICY_SINCE.get(value) if name == "schedule_policy" else None
            if since and Version(release) < Version(since):
                raise SpaceError(f"tune_space: schedule_policy value {value!r} came in sglang "
                                 f"{since}; this container runs {release}")
        space[name] = tuple(dict.fromkeys(checked))  # each value once, in the user's order
    return space


def start_of(tuning: TuningView, space: Mapping[str, tuple[Any, ...]]) -> Candidate:
    """The container's own values of the space's coordinates: where the search starts."""
    return {name: getattr(tuning, name) for name in space}


def valid(candidate: Mapping[str, Any]) -> bool:
    """Whether CANDIDATE means something: a CUDA graph batch size only with graphs on (with
    graphs off it would be a second try of the same server)."""
    return not (candidate.get("disable_cuda_graph") is True
                and candidate.get("cuda_graph_max_bs") is not None)


def grid(space: Mapping[str, tuple[Any, ...]]) -> list[Candidate]:
    """Every meaningful candidate of SPACE: what a grid search would try."""
    names = list(space)
    return [dict(zip(names, combo)) for combo in itertools.product(*space.values())
            if valid(dict(zip(names, combo)))]


def grid_size(space: Mapping[str, tuple[Any, ...]]) -> int:
    return len(grid(space)) if math.prod(len(v) for v in space.values()) < 200_000 else \
        math.prod(len(v) for v in space.values())


def key(candidate: Mapping[str, Any]) -> str:
    """One stable text of CANDIDATE (the history's and the replay's key)."""
    return ", ".join(f"{name}={candidate[name]!r}" for name in sorted(candidate))


def server_flags(candidate: Mapping[str, Any]) -> Candidate:
    """CANDIDATE less its coordinates of the benchmark's side: what a restart puts on the
    server. Two candidates with the same are measured on one start."""
    return {name: value for name, value in candidate.items() if name not in CLIENT_SIDE}


def same_server(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether A and B run the same server (the same flags, whatever the benchmark's side)."""
    return a is not None and b is not None and key(server_flags(a)) == key(server_flags(b))


def changed(base: Mapping[str, Any], candidate: Mapping[str, Any]) -> dict[str, Any]:
    """What CANDIDATE sets otherwise than BASE."""
    return {name: value for name, value in candidate.items() if base.get(name) != value}
