"""The tuned file (``make tune``'s best flags for one container) and where the hosts file puts
it: under the container's own entry, over the host's container settings; read back as
untrusted input; and the server's unit rendered from it is the one the search left running (a
``make deploy`` right after a search changes nothing)."""

from __future__ import annotations

import pytest

from pve_sglang.config.settings import ContainerSettings, SettingsError
from pve_sglang.hosts_file import build_groups
from pve_sglang.project import load_defaults
from pve_sglang.server.command import server_argv
from pve_sglang.tuning.plan import (BENCH_2H, BENCH_8H, budget_lines, is_moe, plan_lines,
                                   space_for, start_seconds)
from pve_sglang.tuning.space import grid
from pve_sglang.tuning.tuned_file import (
    TunedFileError,
    read_tuned,
    render_tuned,
    tuned_path,
    write_tuned,
)

BEST = {"max_running_requests": None, "mem_fraction_static": 0.9, "disable_cuda_graph": False,
        "cuda_graph_max_bs": 256, "chunked_prefill_size": 4096, "schedule_policy": "lpm"}


def hosts(container: dict | None = None, host: dict | None = None) -> dict:
    return {"pve1": {"ssh_hostname": "192.0.2.10", **(host or {}),
                     "containers": [{"vmid": 105, "gpus": [0], **(container or {})}]}}


def container_data(doc: dict, override: dict | None = None) -> dict:
    [(_, data)] = build_groups(doc, override=override)[1]
    return data


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """The tuned file of pve1's container 105 in ./tuned (tune_dir's default), written."""
    monkeypatch.chdir(tmp_path)
    path = tuned_path("tuned", "pve1", "105")
    write_tuned(path, render_tuned(BEST, ["make tune, 2026-12-05: 3,740 tok/s (880 as found)"]))
    return path


def test_the_tuned_file_round_trips_with_its_notes(tuned):
    assert tuned.name == "pve1-105.yml" and tuned.read_text().startswith("# make tune, ")
    assert read_tuned(tuned) == BEST


def test_no_tuned_file_is_no_setting(tmp_path):
    assert read_tuned(tmp_path / "none.yml") == {}


@pytest.mark.parametrize("text, match", [
    ("- 1\n- 2\n", "a list; expected a mapping of settings"),
    ("tp_size: 2\n", "'tp_size' is not a coordinate"),
    ("mem_fraction_static: 1.5\n", "mem_fraction_static value 1.5"),
    ("schedule_policy: \"$(touch F)\"\n", "schedule_policy value '\\$\\(touch F\\)'"),
    ("max_running_requests: [\n", "not YAML"),
])
def test_a_tuned_file_not_as_the_search_writes_it_is_refused_naming_file_key_value(
        tmp_path, text, match):
    path = tmp_path / "t.yml"
    path.write_text(text)
    with pytest.raises(TunedFileError, match=match) as caught:
        read_tuned(path)
    assert str(path) in str(caught.value)


def test_the_tuned_file_sits_over_the_host_and_under_the_container_entry(tuned):
    data = container_data(hosts(host={"schedule_policy": "fcfs", "max_running_requests": 64}))
    assert data["schedule_policy"] == "lpm" and data["max_running_requests"] is None  # tuned
    assert data["cuda_graph_max_bs"] == 256
    mine = container_data(hosts({"mem_fraction_static": 0.85}))
    assert mine["mem_fraction_static"] == 0.85 and mine["chunked_prefill_size"] == 4096
    # --data wins: pyinfra gives its value; the tuned one is not in the container's data.
    assert "cuda_graph_max_bs" not in container_data(hosts(), {"cuda_graph_max_bs": 64})


def test_a_bad_tuned_file_stops_the_inventory_naming_host_and_container(tuned):
    tuned.write_text("chunked_prefill_size: 0\n")
    with pytest.raises(SettingsError, match="host pve1, container 105: tuned file .*"
                                            "chunked_prefill_size value 0"):
        build_groups(hosts())


def test_the_deploy_after_a_search_renders_the_flags_the_search_left(tuned):
    data = {**load_defaults(), **container_data(hosts())}  # pyinfra: group_data under host data
    fields = {k: v for k, v in data.items() if k in ContainerSettings.model_fields}
    settings = ContainerSettings.model_validate(fields)
    found = ContainerSettings.model_validate({**fields, **load_defaults_of(BEST)})
    searched = found.model_copy(update=BEST)  # what the search applied to the server it found
    args = (1, ["9.0"], None, 1, None, "/py")
    assert server_argv(settings, *args) == server_argv(searched, *args)
    assert "--cuda-graph-max-bs-decode" in server_argv(settings, *args)


def load_defaults_of(names) -> dict:
    """The defaults of NAMES: the server as the search found it (no tuned file)."""
    return {k: v for k, v in load_defaults().items() if k in names}


@pytest.mark.parametrize("space, match", [
    ({"tp_size": [1, 2]}, "'tp_size' is not a coordinate"),
    ({"max_running_requests": [0]}, "max_running_requests value 0"),
    ({"schedule_policy": ["hrrn"]}, "'hrrn' came in sglang 0.5.22; this container runs 0.5.9"),
])
def test_a_bad_tune_space_stops_the_inventory(space, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match=f"host pve1, container 105: field .*{match}"):
        build_groups(hosts({"tune_space": space, "sglang_version": "0.5.9"}))


def test_tune_space_may_not_move_what_the_container_entry_sets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match="tune_space names max_running_requests, which the "
                                            "container's own entry sets"):
        build_groups(hosts({"tune_space": {"max_running_requests": [None, 256]},
                            "max_running_requests": 64}))
    build_groups(hosts({"tune_space": {"max_running_requests": [None, 256]}}))


# --- the plan (make tune ARGS=--dry) ------------------------------------------------------


def container_settings(doc: dict) -> tuple[ContainerSettings, frozenset]:
    data = {**load_defaults(), **container_data(doc)}
    fields = {k: v for k, v in data.items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate(fields), frozenset(data["tune_pinned"])


@pytest.mark.parametrize("config, moe", [
    ({"num_local_experts": 8}, True), ({"n_routed_experts": 256}, True),
    ({"moe_intermediate_size": 1536}, True), ({"text_config": {"num_experts": 128}}, True),
    ({"num_hidden_layers": 32, "num_local_experts": 0}, False), ({}, False),
])
def test_a_moe_model_is_told_by_its_config(config, moe):
    assert is_moe(config) is moe


READY = "sglang[812]: [2026-12-01 10:00:00] The server is fired up and ready to roll!"


@pytest.mark.parametrize("lines, seconds", [
    ([], None),
    (["1700000000.000000 ct systemd[1]: Started sglang.service - SGLang."], None),  # not ready
    (["1700000000.000000 ct systemd[1]: Started sglang.service - SGLang.",
      f"1700000095.500000 ct {READY}"], 95.5),
    (["1700000000.000000 ct systemd[1]: Started sglang.service - SGLang.",
      f"1700000095.500000 ct {READY}",
      "1700001000.000000 ct systemd[1]: Started sglang.service - SGLang.",
      f"1700001420.000000 ct {READY}"], 420.0),                  # the last start
    (["1700000000.000000 ct systemd[1]: Started sglang.service - SGLang.",
      f"1700000095.500000 ct {READY}",
      "1700001000.000000 ct systemd[1]: Started sglang.service - SGLang."], 95.5),
    ([f"1700000095.500000 ct {READY}"], None),                   # no start before it
    (["garbage", "-- No entries --"], None),
])
def test_the_servers_start_time_from_its_journal(lines, seconds):
    assert start_seconds(lines) == seconds


def test_the_plan_lists_space_budget_objective_and_first_tries(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings, pinned = container_settings(hosts({"max_running_requests": 64,
                                                 "tune_max_p99_ttft_ms": 900}))
    assert pinned == {"max_running_requests"}
    text = "\n".join(plan_lines("@pct/pve1/105", settings.tuning, None, pinned))
    assert "output tok/s at concurrency 1024, p99 time to first token at most 900 ms" in text
    assert "budget: 28800 s (8.0 h)" in text
    assert "at a start of 420 s (assumed: no start measured)" in text
    assert "at most 48 restarts with a part (0.25 of the benchmark) each, 28 whole tries" in text
    assert "max_running_requests:" not in text  # the container's own: kept
    assert "kept as the container's own entry sets them: max_running_requests" in text
    assert "mem_fraction_static: 0.8, 0.85, 0.88, 0.9, [0.92], 0.94" in text
    assert ("moe_runner_backend: 'auto', 'triton', ['flashinfer_cutlass'], 'flashinfer_trtllm' "
            "(only if the model is MoE") in text
    assert "schedule_policy: [None], 'lpm', 'hrrn'" in text  # None: SGLang's own (fcfs)
    assert ("1. the server as found, where it runs (no restart): 1.5 of the benchmark in parts: "
            "chunked_prefill_size=None, ") in text
    assert "2. disable_cuda_graph=False (one start, parts until a verdict)" in text
    assert "3. moe_runner_backend='auto' (one start" in text
    assert "cuda_graph_max_bs=64" not in text  # graphs are off in the flags found
    # The container's measured start time: what the budget buys follows.
    measured = "\n".join(plan_lines("@pct/pve1/105", settings.tuning, None, pinned, start_s=95.5))
    assert "at a start of 96 s (measured: the server's last start)" in measured
    assert "at most 113 restarts" in measured
    grid_size = len(grid(space_for(settings.tuning, None, pinned)))
    assert f"space ({grid_size} candidates in the grid)" in text


@pytest.mark.parametrize("budget_s, start_s, expected", [
    (7 * 1020 - 1, None, "less than 2 h at the seed's costs"),    # 420 s a start, 600 a whole
    (7 * 1020, None, f"like 2 h at the seed's costs (7 whole tries): {BENCH_2H}"),
    (28 * 1020 - 1, None, "like 2 h at the seed's costs"),
    (28 * 1020, None, f"like 8 h at the seed's costs (28 whole tries): {BENCH_8H}"),
    (7 * 700, 100.0, "like 2 h at the seed's costs"),             # a short start buys more
    (7 * 700 - 1, 100.0, "less than 2 h"),
])
def test_the_plan_says_what_the_budget_buys_at_the_containers_start_time(
        budget_s, start_s, expected):
    assert budget_lines(budget_s, start_s)[-1].startswith(f"    expected: {expected}")


def test_the_plan_of_a_user_space_and_a_dense_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings, pinned = container_settings(hosts({"tune_space": {
        "max_running_requests": [None, 256], "disable_cuda_graph": [True, False]}}))
    assert space_for(settings.tuning, False, pinned) == {"max_running_requests": (None, 256),
                                                         "disable_cuda_graph": (True, False)}
    assert "moe_runner_backend" not in space_for(
        settings.model_copy(update={"tune_space": None}).tuning, False, pinned)
