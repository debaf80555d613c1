"""Tests for the server argv: what each setting renders, for one node and for several, and the
launcher's command. The flag check against the real sglang wheels:
tests/network/test_server_command_flags.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pve_sglang.server.command import (
    API_KEY_VAR,
    EnvRef,
    server_argv,
    venv_python,
)
from pve_sglang.server.unit_text import LAUNCHER, launch_argv, systemd_quote
from pve_sglang.server.render import dist_init_addr, node_rank_for
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings

REPO = Path(__file__).resolve().parents[2]
PY = "/opt/sglang/venv/bin/python"
H100 = ["9.0"] * 8
RTX_PRO_6000 = ["12.0"] * 8
RELEASES = ["0.5.9", "0.5.23"]


def settings(**overrides) -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**data, **overrides})


def argv_for(s=None, gpus=8, caps=RTX_PRO_6000, rank=None, nnodes=1, addr=None):
    return server_argv(s or settings(), gpus, caps, rank, nnodes, addr, PY)


def pairs(argv) -> dict[str, str]:
    """flag -> following word (or True for a flag followed by another flag)."""
    out = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[arg] = True if nxt is None or nxt.startswith("--") else nxt
    return out


# --- argv ---------------------------------------------------------------------------------


def test_default_argv_is_the_tuned_set():
    argv = argv_for(settings().model_copy(update={"sglang_version": "0.5.9"}))
    assert argv == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "/models/model",
        "--host", "127.0.0.1", "--port", "30000",
        "--tp-size", "8",
        "--moe-runner-backend", "flashinfer_cutlass",
        "--attention-backend", "flashinfer",
        "--mem-fraction-static", "0.92",
        "--enable-metrics",
        "--disable-cuda-graph",
    ]
    assert argv.warnings == []
    assert "--max-running-requests" not in argv


def test_default_argv_of_0_5_23_in_its_spelling():
    argv = argv_for(settings().model_copy(update={"sglang_version": "0.5.23"}))
    assert argv[-4:] == ["--cuda-graph-backend-decode", "disabled",
                         "--cuda-graph-backend-prefill", "disabled"]
    assert "--disable-cuda-graph" not in argv


def test_running_request_cap_when_set():
    assert pairs(argv_for(settings(max_running_requests=64)))["--max-running-requests"] == "64"


def test_metrics_on_by_default_and_off_by_the_setting():
    assert "--enable-metrics" in argv_for()
    assert "--enable-metrics" not in argv_for(settings(enable_metrics=False))


def test_cuda_graph_kept_when_not_disabled():
    argv = argv_for(settings(disable_cuda_graph=False))
    assert not {"--disable-cuda-graph", "--cuda-graph-backend-decode"} & set(argv)


def test_tuning_flags_rendered_only_when_set():
    plain = argv_for()
    assert not {"--cuda-graph-max-bs", "--chunked-prefill-size", "--schedule-policy"} & set(plain)
    tuned = settings(cuda_graph_max_bs=160, chunked_prefill_size=8192, schedule_policy="lpm")
    old = pairs(argv_for(tuned.model_copy(update={"sglang_version": "0.5.9"})))
    assert old["--cuda-graph-max-bs"] == "160" and old["--chunked-prefill-size"] == "8192"
    assert old["--schedule-policy"] == "lpm"
    new = pairs(argv_for(tuned.model_copy(update={"sglang_version": "0.5.23"})))
    assert new["--cuda-graph-max-bs-decode"] == "160" and "--cuda-graph-max-bs" not in new


def test_schedule_policy_of_a_newer_release_refused_on_the_older():
    s = settings(schedule_policy="hrrn").model_copy(update={"sglang_version": "0.5.9"})
    with pytest.raises(ValueError, match="schedule_policy.*'hrrn' came in sglang 0.5.22.*0.5.9"):
        argv_for(s)
    assert "hrrn" in argv_for(s.model_copy(update={"sglang_version": "0.5.23"}))


@pytest.mark.parametrize("field, value", [
    ("cuda_graph_max_bs", 0), ("chunked_prefill_size", 0), ("chunked_prefill_size", -2),
    ("schedule_policy", "fifo"), ("cuda_graph_max_bs", True),
])
def test_bad_tuning_settings_refused(field, value):
    with pytest.raises(ValidationError, match=field):
        settings(**{field: value})


def test_tp_override():
    assert pairs(argv_for(settings(tp_size=4)))["--tp-size"] == "4"


def test_tp_too_large_names_the_field():
    with pytest.raises(ValueError, match=r"tp_size 16 is larger than the 8 GPUs"):
        argv_for(settings(tp_size=16))


def test_no_gpu():
    with pytest.raises(ValueError, match="gpu_count 0"):
        argv_for(gpus=0)


FUSION = {"0.5.9": "--enable-flashinfer-allreduce-fusion",
          "0.5.23": "--flashinfer-allreduce-fusion-backend"}


def fusion_settings(release):
    return settings(enable_flashinfer_allreduce_fusion=True).model_copy(
        update={"sglang_version": release})


@pytest.mark.parametrize("release", RELEASES)
def test_allreduce_fusion_kept_on_sm90(release):
    argv = argv_for(fusion_settings(release), caps=H100)
    assert FUSION[release] in argv and set(FUSION.values()) & set(argv) == {FUSION[release]}
    assert argv.warnings == []


@pytest.mark.parametrize("release", RELEASES)
def test_allreduce_fusion_dropped_on_sm120_with_a_warning(release):
    argv = argv_for(fusion_settings(release), caps=RTX_PRO_6000)
    assert not set(FUSION.values()) & set(argv)
    assert len(argv.warnings) == 1
    assert "12.0" in argv.warnings[0] and FUSION[release] in argv.warnings[0]


@pytest.mark.parametrize("release", RELEASES)
def test_allreduce_fusion_with_unknown_capability_kept_with_a_warning(release):
    argv = argv_for(fusion_settings(release), caps=[])
    assert FUSION[release] in argv
    assert "unknown" in argv.warnings[0]


def test_bad_compute_capability():
    with pytest.raises(ValueError, match="compute capability"):
        argv_for(settings(enable_flashinfer_allreduce_fusion=True), caps=["[N/A]"])


def test_served_model_name_and_extra_args_last():
    argv = argv_for(settings(served_model_name="glm-5", extra_server_args=["--disable-shared-experts-fusion"]))
    assert pairs(argv)["--served-model-name"] == "glm-5"
    assert argv[-1] == "--disable-shared-experts-fusion"


def test_api_key_is_a_variable_reference():
    argv = argv_for(settings(api_key="sk-very-secret", hf_token="hf_secret"))
    index = argv.index("--api-key")
    assert isinstance(argv[index + 1], EnvRef) and argv[index + 1] == "${SGLANG_API_KEY}"
    assert argv[index + 1].name == API_KEY_VAR
    assert not any("secret" in arg for arg in argv)


def test_launch_argv_hands_the_key_reference_to_the_launcher():
    argv = argv_for(settings(api_key="sk-very-secret", hf_token="hf_secret",
                             extra_server_args=["--enable-metrics"]))
    start = launch_argv(argv, ["HF_TOKEN", API_KEY_VAR])
    assert start[:4] == [PY, LAUNCHER, "--arg-from-env=--api-key=SGLANG_API_KEY", "--mask-env=HF_TOKEN"]
    server = argv[1:argv.index("--api-key")] + argv[argv.index("--api-key") + 2:]
    assert start[4:] == server and server[:2] == ["-m", "sglang.launch_server"]
    assert server[-1] == "--enable-metrics"
    assert not any(isinstance(arg, EnvRef) for arg in start)
    assert launch_argv(argv_for(), ["HF_TOKEN"])[2:4] == ["--mask-env=HF_TOKEN", "-m"]


@pytest.mark.parametrize("bad", [
    [PY, "sglang.launch_server"],
    [PY, "-m"],
    [PY, "-m", "sglang.launch_server", EnvRef("X")],
    [PY, "-m", "sglang.launch_server", "--a", "value", EnvRef("X")],
    [PY, "-m", "sglang.launch_server", "--a", EnvRef("X"), EnvRef("Y")],
])
def test_launch_argv_refuses_what_it_cannot_start(bad):
    with pytest.raises(ValueError):
        launch_argv(bad)


def test_an_environment_reference_is_never_left_for_systemd_to_expand():
    with pytest.raises(ValueError, match="launch_argv"):
        systemd_quote(EnvRef(API_KEY_VAR))


@pytest.mark.parametrize("extra", [["--api-key", "x"], ["--api-key=x"], ["--admin-api-key", "y"]])
def test_secret_flags_refused_in_extra_args(extra):
    with pytest.raises(ValueError, match="extra_server_args"):
        argv_for(settings(extra_server_args=extra))


# --- several nodes ------------------------------------------------------------------------


def test_three_nodes():
    nodes = ["pve1/105", "pve2/105", "pve3/105"]
    addr = dist_init_addr("10.0.0.11", settings().dist_init_port)
    seen = []
    for name in nodes:
        rank, nnodes = node_rank_for(name, nodes)
        argv = argv_for(settings(nodes=nodes), rank=rank, nnodes=nnodes, addr=addr)
        p = pairs(argv)
        seen.append((p["--node-rank"], p["--nnodes"], p["--dist-init-addr"], p["--tp-size"]))
    assert seen == [
        ("0", "3", "10.0.0.11:50000", "24"),
        ("1", "3", "10.0.0.11:50000", "24"),
        ("2", "3", "10.0.0.11:50000", "24"),
    ]


def test_single_node_has_no_multi_node_flags():
    assert node_rank_for("pve1/105", []) == (None, 1)
    argv = argv_for()
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(argv)


def test_node_rank_errors():
    with pytest.raises(ValueError, match="does not list this container"):
        node_rank_for("pve9/1", ["pve1/105", "pve2/105"])
    # A name listed twice is refused where the rule lives: validation.
    with pytest.raises(ValidationError, match="more than once"):
        settings(nodes=["a", "b", "a"])


def test_multi_node_needs_rank_and_address():
    with pytest.raises(ValueError, match="dist_init_addr"):
        argv_for(rank=1, nnodes=2, addr=None)
    with pytest.raises(ValueError, match="node_rank"):
        argv_for(rank=None, nnodes=2, addr="10.0.0.1:50000")
    with pytest.raises(ValueError, match="tp_size 8 does not split evenly over 3 nodes"):
        argv_for(settings(tp_size=8), rank=0, nnodes=3, addr="10.0.0.1:50000")


def test_dist_init_addr():
    assert dist_init_addr("10.0.0.1", 50000) == "10.0.0.1:50000"
    assert dist_init_addr("fd00::1", 50000) == "[fd00::1]:50000"
    assert dist_init_addr("node0.lan", 1234) == "node0.lan:1234"


def test_venv_python():
    assert venv_python(settings(venv_path="/opt/sglang/venv/")) == "/opt/sglang/venv/bin/python"
