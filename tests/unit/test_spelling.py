"""The spelling table (pve_sglang/server/spelling.py): each setting's flag, the attention backend's
name and the schedule policies as each release takes them, and our rendered command spelled for
its release. The table against each release's real argument parser and sources:
tests/network/test_server_args_parser.py.
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from pve_sglang.config.settings import ContainerSettings
from pve_sglang.project import load_defaults
from pve_sglang.server import spelling
from pve_sglang.server.command import server_argv

PY = "/opt/sglang/venv/bin/python"
H100 = ["9.0"] * 8
NEW_SPELLINGS = Version("0.5.14")


def settings(release: str, **overrides) -> ContainerSettings:
    """The defaults with OVERRIDES, for sglang RELEASE (set after validation: offline)."""
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    validated = ContainerSettings.model_validate({**data, **overrides})
    return validated.model_copy(update={"sglang_version": release})


def full_settings(release: str, **overrides) -> ContainerSettings:
    """Every flag we render: cuda graph off, allreduce fusion on, the request cap, a served
    name, the API key and two nodes."""
    return settings(release, **{
        "disable_cuda_graph": True, "enable_flashinfer_allreduce_fusion": True,
        "max_running_requests": 64, "served_model_name": "glm-5", "api_key": "sk-test",
        "nodes": ["a", "b"], "cuda_graph_max_bs": 160, "chunked_prefill_size": 4096,
        "schedule_policy": "lpm", **overrides})


def full_argv(release: str, **overrides) -> list[str]:
    return server_argv(full_settings(release, **overrides), 8, H100, 1, 2, "10.0.0.1:50000", PY)


# --- the table ----------------------------------------------------------------------------


@pytest.mark.parametrize("release, cuda_graph, fusion, dsa", [
    ("0.5.9", ["--disable-cuda-graph"], ["--enable-flashinfer-allreduce-fusion"], "nsa"),
    ("0.5.12.post1", ["--disable-cuda-graph"], ["--enable-flashinfer-allreduce-fusion"], "nsa"),
    ("0.5.13", ["--disable-cuda-graph"], ["--enable-flashinfer-allreduce-fusion"], "dsa"),
    ("0.5.13.post1", ["--disable-cuda-graph"], ["--enable-flashinfer-allreduce-fusion"], "dsa"),
    ("0.5.14", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill",
                "disabled"], ["--flashinfer-allreduce-fusion-backend", "auto"], "dsa"),
    ("0.5.23", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill",
                "disabled"], ["--flashinfer-allreduce-fusion-backend", "auto"], "dsa"),
    ("0.6.0rc1", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill",
                  "disabled"], ["--flashinfer-allreduce-fusion-backend", "auto"], "dsa"),
])
def test_spelling_per_release(release, cuda_graph, fusion, dsa):
    assert spelling.flag("disable_cuda_graph", release) == cuda_graph
    assert spelling.flag("flashinfer_allreduce_fusion", release) == fusion
    assert spelling.attention_backend("nsa", release) == dsa
    assert spelling.attention_backend("dsa", release) == dsa
    assert spelling.attention_backend("flashinfer", release) == "flashinfer"


@pytest.mark.parametrize("release, graph_bs", [
    ("0.5.9", "--cuda-graph-max-bs"), ("0.5.13.post1", "--cuda-graph-max-bs"),
    ("0.5.14", "--cuda-graph-max-bs-decode"), ("0.5.23", "--cuda-graph-max-bs-decode"),
])
def test_cuda_graph_max_bs_per_release(release, graph_bs):
    assert spelling.flag("cuda_graph_max_bs", release) == [graph_bs]


@pytest.mark.parametrize("release, policy, refused", [
    ("0.5.9", "lpm", False), ("0.5.9", "hrrn", True), ("0.5.18", "shortest-prefill-first", True),
    ("0.5.22", "hrrn", False), ("0.5.23", "shortest-prefill-first", False), ("0.5.9", None, False),
])
def test_schedule_policy_per_release(release, policy, refused):
    assert (spelling.schedule_policy_problem(policy, release) is not None) is refused


def test_unknown_spelling_names_the_known():
    with pytest.raises(KeyError, match="disable_cuda_graph"):
        spelling.flag("disable_radix_cache", "0.5.23")


@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_argv_spells_for_the_release(release):
    argv = full_argv(release, attention_backend="nsa")
    new = Version(release) >= NEW_SPELLINGS
    assert ("--disable-cuda-graph" in argv) is not new
    assert ("--enable-flashinfer-allreduce-fusion" in argv) is not new
    assert ("--cuda-graph-backend-decode" in argv) is new
    assert argv[argv.index("--attention-backend") + 1] == ("dsa" if new else "nsa")
