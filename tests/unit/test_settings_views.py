"""The settings' views (``ContainerSettings.server``, ``.stack``, ...): each holds the values of
the one validated ContainerSettings under their names, and only the fields of its area, so a
function given one cannot read another area's settings; a view cannot be changed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pve_sglang.config.settings import (
    CONTAINER_FIELDS,
    VIEWS,
    BenchView,
    ContainerSettings,
    LxcView,
    ModelView,
    ServerView,
    StackView,
    TuningView,
)
from pve_sglang.project import load_defaults

#: Settings whose optional fields are set, so that no value compares as a None with a None.
OVERRIDES = {
    "hostname": "gpu-1",
    "model_download": "org/model",
    "model_revision": "main",
    "model_store": "/tank/models",
    "served_model_name": "model",
    "api_key": "key-1",
    "hf_token": "token-1",
    "tp_size": 1,
    "gpus": [0],
    "max_running_requests": 8,
    "cuda_graph_max_bs": 8,
    "chunked_prefill_size": -1,
    "schedule_policy": "lpm",
    "extra_server_args": ["--log-level", "info"],
    "mounts": [{"host_path": "/tank/data", "path": "/data", "read_only": True}],
    "nodes": [],
    "tune_concurrency": 4,
    "tune_max_p99_ttft_ms": 500.0,
}


@pytest.fixture(scope="module")
def cs() -> ContainerSettings:
    defaults = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**defaults, **OVERRIDES})


def derived(name: str) -> bool:
    """Whether NAME is a value ContainerSettings derives from its fields (a property)."""
    return isinstance(getattr(ContainerSettings, name, None), property)


@pytest.mark.parametrize("prop, view", VIEWS.items())
def test_a_view_holds_the_settings_values_under_their_names(cs, prop, view):
    got = getattr(cs, prop)
    assert type(got) is view
    for name in view.model_fields:
        assert name in CONTAINER_FIELDS or derived(name), f"{view.__name__}.{name}: no setting"
        assert getattr(got, name) == getattr(cs, name), f"{view.__name__}.{name}"


@pytest.mark.parametrize("prop, view", VIEWS.items())
def test_a_view_is_built_anew_from_the_settings_it_is_read_from(cs, prop, view):
    """A copy with another value gives a view with that value: nothing is cached."""
    name = next(name for name in view.model_fields
                if name in CONTAINER_FIELDS and type(getattr(cs, name)) in (int, str, bool))
    other = {int: 7, str: "/other", bool: not getattr(cs, name)}[type(getattr(cs, name))]
    assert getattr(getattr(cs, prop), name) != other
    changed = cs.model_copy(update={name: other})
    assert getattr(getattr(changed, prop), name) == other


# Each view against a field of another area (read: AttributeError) and a field of its own at
# the edge of its area (read), e.g. the server's port beside the benchmark's levels.
AREAS = [
    ("server", "model_store", False),
    ("server", "model_download", False),
    ("server", "tune_budget_s", False),
    ("server", "bench_concurrencies", False),
    ("server", "hf_token", False),
    ("server", "wheel_store", False),
    ("server", "server_port", True),
    ("server", "model_path", True),
    ("stack", "server_port", False),
    ("stack", "model_store", False),
    ("stack", "wheel_store", True),
    ("model", "api_key", False),
    ("model", "venv_path", False),
    ("model", "model_store", True),
    ("benchmark", "hf_token", False),
    ("benchmark", "tune_concurrency", False),
    ("benchmark", "server_port", True),
    ("tuning", "model_path", False),
    ("tuning", "api_key", False),
    ("tuning", "venv_path", False),
    ("tuning", "bench_history_dir", False),
    ("tuning", "tune_budget_s", True),
    ("tuning", "sglang_version", True),
    ("tuning", "mem_fraction_static", True),
    ("tuning", "bench_concurrencies", True),
    ("lxc", "sglang_version", False),
    ("lxc", "mounts", False),
    ("lxc", "all_mounts", True),
]


@pytest.mark.parametrize("prop, name, readable", AREAS)
def test_a_view_exposes_only_its_own_fields(cs, prop, name, readable):
    view = getattr(cs, prop)
    if readable:
        assert getattr(view, name) == getattr(cs, name)
    else:
        with pytest.raises(AttributeError):
            getattr(view, name)


@pytest.mark.parametrize("prop", VIEWS)
def test_a_view_cannot_be_changed(cs, prop):
    view = getattr(cs, prop)
    name = next(iter(type(view).model_fields))
    with pytest.raises(ValidationError, match="frozen"):
        setattr(view, name, getattr(view, name))


def test_the_server_views_secrets_are_not_shown(cs):
    shown = repr(cs.server) + str(cs.server)
    assert cs.server.secrets == {"HF_TOKEN": "token-1", "SGLANG_API_KEY": "key-1"}
    assert "token-1" not in shown and "key-1" not in shown


def test_the_tuning_view_holds_every_coordinate_the_search_may_move(cs):
    """A search starts from the container's own value of each coordinate of its space
    (``tuning.space.start_of``), a user's ``tune_space`` coordinate included."""
    from pve_sglang.tuning.space import CLIENT_SIDE, COORDINATES, start_of

    space = {name: () for name in (*COORDINATES, *CLIENT_SIDE)}
    assert start_of(cs.tuning, space) == {name: getattr(cs, name) for name in space}


def test_every_view_is_listed():
    assert set(VIEWS.values()) == {StackView, ServerView, ModelView, BenchView, TuningView,
                                   LxcView}
