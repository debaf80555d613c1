"""The gateway's decisions on tables (fast tier): which servers it fronts and at which URLs, the
key rule, what its answer says of each worker, its settings and hosts-file errors, and what its
unit holds. Its command line parsed by the pinned smg's own parser (network tier):
tests/network/test_gateway_smg_parser.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pve_sglang.config.gateway import validate_gateway
from pve_sglang.config.settings import SettingsError
from pve_sglang.gateway import render
from pve_sglang.gateway.workers import (
    Serving,
    Worker,
    choose_workers,
    judge,
    key_problem,
    strays,
    verdict,
)
from pve_sglang.hosts_file import build_inventory
from pve_sglang.project import load_defaults

DEFAULTS = load_defaults()
W = "host h, gateway g"


def serving(name: str, host: str = "0.0.0.0", model: str = "m", nodes: tuple = (),
            port: int = 30000) -> Serving:
    return Serving(name=name, hostname=f"sglang-{name[-1]}", server_host=host, server_port=port,
                   model=model, nodes=nodes)


@pytest.mark.parametrize("wanted, containers, urls", [
    # Default: every serving container of the one model, by hostname on a wildcard bind.
    (None, [serving("@lxc/a"), serving("@lxc/b")], ["http://sglang-a:30000", "http://sglang-b:30000"]),
    # A server bound to its address is reached there (IPv6 in brackets).
    (None, [serving("@lxc/a", "10.0.0.5"), serving("@lxc/b", "fd00::7", port=31000)],
     ["http://10.0.0.5:30000", "http://[fd00::7]:31000"]),
    # A multi-node group is one worker: its first node.
    (None, [serving("@lxc/a", nodes=("@lxc/a", "@lxc/b")), serving("@lxc/b", nodes=("@lxc/a", "@lxc/b")),
            serving("@lxc/c")], ["http://sglang-a:30000", "http://sglang-c:30000"]),
    # Named ones only, in the order named.
    (["@lxc/c", "@lxc/a"], [serving("@lxc/a"), serving("@lxc/b", model="other"), serving("@lxc/c")],
     ["http://sglang-c:30000", "http://sglang-a:30000"]),
])
def test_workers_chosen(wanted, containers, urls):
    assert [w.url for w in choose_workers(W, wanted, containers)] == urls


@pytest.mark.parametrize("wanted, containers, words", [
    (None, [serving("@lxc/a"), serving("@lxc/b", model="other")],
     ["gateway_workers", "2 models", "m, other", "@lxc/a, @lxc/b"]),
    (["@lxc/x"], [serving("@lxc/a")], ["'@lxc/x'", "not a serving container", "allowed: @lxc/a"]),
    (["@lxc/b"], [serving("@lxc/a", nodes=("@lxc/a", "@lxc/b")),
                  serving("@lxc/b", nodes=("@lxc/a", "@lxc/b"))], ["first node '@lxc/a'"]),
    (None, [serving("@lxc/a", "127.0.0.1")], ["worker @lxc/a", "'server_host' = '127.0.0.1'",
                                              "0.0.0.0"]),
    (None, [], ["no serving container"]),
    (["@lxc/a", "@lxc/b"], [serving("@lxc/a"), serving("@lxc/b", model="n")], ["mixes 2 models"]),
])
def test_bad_worker_choices_are_named(wanted, containers, words):
    with pytest.raises(SettingsError) as raised:
        choose_workers(W, wanted, containers)
    assert str(raised.value).startswith(W)
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("gateway_key, worker_keys, problem", [
    (None, {"a": "k", "b": None}, None),        # each worker gets its own key from the gateway
    ("k", {"a": "k", "b": None}, None),          # the client's key is the workers' key
    ("k", {"a": "k", "b": "other"}, "b"),       # passed on to b, which refuses it
])
def test_key_rule(gateway_key, worker_keys, problem):
    found = key_problem(W, gateway_key, worker_keys)
    if problem is None:
        assert found is None
    else:
        assert found and f"api_key of {problem}" in found and "k" not in found.split(": ", 1)[0]
        assert "other" not in found  # no key value in the message


WORKERS = [Worker("@lxc/a", "http://a:1", False), Worker("@lxc/b", "http://b:1", True),
           Worker("@lxc/c", "http://c:1", False)]


@pytest.mark.parametrize("listed, lines, problems", [
    ([{"url": "http://a:1/", "is_healthy": True, "status": "ready"},
      {"url": "http://b:1", "is_healthy": True}, {"url": "http://c:1", "is_healthy": True}],
     ["healthy (ready)", "healthy (no status)", "healthy"], []),
    ([{"url": "http://a:1", "is_healthy": False, "status": "not_ready"},
      {"url": "http://c:1", "is_healthy": True}, {"url": "http://z:1", "is_healthy": True}],
     ["unhealthy (not_ready)", "not in the gateway's list (removed)", "healthy"],
     ["@lxc/a (http://a:1) is unhealthy in the gateway",
      "@lxc/b (http://b:1) was removed by the gateway"]),
    (["not a worker", {"url": 5}], ["removed", "removed", "removed"],
     ["@lxc/a (http://a:1) was removed", "@lxc/b (http://b:1) was removed",
      "@lxc/c (http://c:1) was removed"]),
])
def test_the_gateways_answer_judged(listed, lines, problems):
    said, found = verdict(judge(WORKERS, listed))
    assert all(word in line for word, line in zip(lines, said)), said
    assert [p for p in found] == [p for p in found if any(p.startswith(q) for q in problems)]
    assert len(found) == len(problems)


HEALTHY = [{"url": w.url, "is_healthy": True, "status": "ready"} for w in WORKERS]


def ok(url: str, elapsed: float = 0.2) -> dict:
    return {"url": url, "ok": True, "why": None, "elapsed_s": elapsed}


@pytest.mark.parametrize("listed, pending, answers, lines, problems", [
    # each listed healthy and answering
    (HEALTHY, [], [ok("http://a:1"), ok("http://b:1/"), ok("http://c:1")],
     ["healthy (ready, answered in 0.20s)"] * 3, []),
    # listed healthy, but its generation fails or hangs: /health is not an answer
    (HEALTHY, [], [ok("http://a:1"),
                   {"url": "http://b:1", "ok": False, "why": "HTTP 500: Internal server error"},
                   {"url": "http://c:1", "ok": False, "why": "HTTP 200, then nothing for 5s"}],
     ["healthy", "fails a generation: HTTP 500: Internal server error",
      "fails a generation: HTTP 200, then nothing for 5s"],
     ["@lxc/b (http://b:1) fails a generation asked as the gateway asks it: HTTP 500",
      "@lxc/c (http://c:1) fails a generation asked as the gateway asks it: HTTP 200, then"]),
    # a worker the check did not answer for is not taken as answering
    (HEALTHY, [], [ok("http://a:1"), ok("http://b:1")], ["healthy", "healthy", "not asked"],
     ["@lxc/c (http://c:1) fails a generation asked as the gateway asks it: not asked"]),
    # not listed, but pending in smg: not up, not "removed"
    (HEALTHY[:2], ["http://c:1/"], [ok("http://a:1"), ok("http://b:1")],
     ["healthy", "healthy", "not up (the gateway holds its registration"],
     ["@lxc/c (http://c:1) is not up: the gateway waits for its server"]),
    # unhealthy in the gateway comes first: its answer is not asked about
    ([{**HEALTHY[0], "is_healthy": False}, *HEALTHY[1:]], [],
     [{"url": "http://a:1", "ok": False, "why": "x"}, ok("http://b:1"), ok("http://c:1")],
     ["unhealthy (ready)", "healthy", "healthy"], ["@lxc/a (http://a:1) is unhealthy"]),
    # a registration the deploy made, pending for a worker no longer in the inventory
    (HEALTHY, ["http://old:1"], [ok(w.url) for w in WORKERS],
     ["healthy", "healthy", "healthy", "http://old:1: no longer a worker, registration pending"],
     ["http://old:1 is no longer a worker of this gateway, but the gateway still holds"]),
])
def test_each_worker_judged_by_its_listing_and_its_answer(listed, pending, answers, lines,
                                                         problems):
    said, found = verdict(judge(WORKERS, listed, pending, answers), strays(WORKERS, pending))
    assert len(said) == len(lines) and all(word in line for word, line in zip(lines, said)), said
    assert len(found) == len(problems)
    assert all(p.startswith(q) for p, q in zip(found, problems)), found


@pytest.mark.parametrize("data, words", [
    ({"gateway_policy": "fastest"}, ["gateway_policy", "'fastest'", "cache_aware"]),
    ({"smg_version": "1.12.0"}, ["smg_version", "1.12.0", "allowed: 1.13.0 for Python 3.11"]),
    ({"gateway_python": "3.13"}, ["smg-1.13.0-py3.13.txt", "allowed: 1.13.0 for Python 3.11"]),
    ({"gateway_prometheus_port": 30000}, ["gateway_prometheus_port 30000 is gateway_port"]),
    ({"gateway_api_key": "env:PVE_SGLANG_NO_SUCH_VARIABLE"}, ["PVE_SGLANG_NO_SUCH_VARIABLE is not set"]),
    ({"gateway_api_key": "a key"}, ["gateway_api_key", "<secret>", "whitespace"]),
    ({"gateway_workers": []}, ["gateway_workers", "empty list"]),
    ({"gateway_host": "gateway.local"}, ["gateway_host", "gateway.local"]),
    # The roll's batch and drain bound, at their edges.
    ({"gateway_roll_batch": 0}, ["gateway_roll_batch", "greater than or equal to 1"]),
    ({"gateway_roll_batch": 1001}, ["gateway_roll_batch", "less than or equal to 1000"]),
    ({"gateway_roll_batch": "two"}, ["gateway_roll_batch", "'two'"]),
    ({"gateway_drain_timeout_s": 0}, ["gateway_drain_timeout_s", "greater than or equal to 1"]),
    ({"gateway_drain_timeout_s": 86401}, ["gateway_drain_timeout_s", "less than or equal to 86400"]),
    ({"gateway_roll_failure": "rollback"}, ["gateway_roll_failure", "'rollback'", "'keep' or 'back'"]),
])
def test_bad_gateway_settings_are_named(data, words):
    with pytest.raises(SettingsError) as raised:
        validate_gateway(W, data, DEFAULTS)
    for word in words:
        assert word in str(raised.value)
    assert "a key" not in str(raised.value)


def hosts(gateway: dict, **host) -> dict:
    return {"h": {"platform": "lxc", "server_host": "0.0.0.0", "stack_install": "sglang-no-deps",
                  **host, "containers": [{"name": "w1"}, {"name": "w2"}],
                  "gateways": [{"name": "gw", **gateway}]}}


def test_a_hosts_files_gateway_fronts_its_containers_and_hides_its_key():
    pve_hosts, _, gateways = build_inventory(hosts({"gateway_api_key": "s3cret"}), DEFAULTS)
    assert pve_hosts[0][1]["gateways"] == ["@lxc/h/gw"]
    [(name, data)] = gateways
    assert name == "@lxc/h/gw" and data["lxc_name"] == "gw" and data["pve_host"] == "h"
    assert [w["url"] for w in data["gateway_worker_list"]] == ["http://sglang-w1:30000",
                                                               "http://sglang-w2:30000"]
    assert "s3cret" not in repr(data) and data["gateway_api_key"].to_json() == "<secret>"


@pytest.mark.parametrize("gateway, host, words", [
    ({"gateway_polcy": "random"}, {}, ["gateway gw", "unknown field 'gateway_polcy'",
                                       "did you mean 'gateway_policy'"]),
    ({"model_path": "/m"}, {}, ["unknown field 'model_path'"]),  # a serving container's
    ({"cores": 0}, {}, ["container gw", "field 'cores' = 0"]),  # its container's, checked too
    ({}, {"server_host": "127.0.0.1"}, ["worker @lxc/h/w1", "server_host"]),
    ({"gateway_workers": ["@lxc/h/w9"]}, {}, ["'@lxc/h/w9'", "allowed: @lxc/h/w1, @lxc/h/w2"]),
])
def test_bad_gateway_entries_are_named_with_their_line(gateway, host, words):
    with pytest.raises(SettingsError) as raised:
        build_inventory(hosts(gateway, **host), DEFAULTS)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_a_gateways_container_takes_its_own_and_its_hosts_container_settings():
    _, _, [(_, data)] = build_inventory(hosts({"cores": 2, "hostname": "gw-1"}, memory_mib=2048,
                                              net0="name=eth0,bridge=br9,ip=dhcp"), DEFAULTS)
    assert (data["cores"], data["hostname"], data["net0"]) == (2, "gw-1", "name=eth0,bridge=br9,ip=dhcp")
    # The host's size is its GPU containers': a gateway's own unless its entry says otherwise.
    assert data["memory_mib"] == 4096
    assert "model_path" not in data


def test_a_gateway_cannot_be_a_serving_container():
    data = hosts({})
    data["h"]["gateways"][0]["name"] = "w1"
    with pytest.raises(SettingsError, match="a container of its own"):
        build_inventory(data, DEFAULTS)


def gateway(**data):
    return validate_gateway(W, data, DEFAULTS)


def test_the_unit_holds_no_key_and_no_worker():
    gs = gateway(gateway_api_key="k3y-Value")
    unit = render.render_unit(gs)
    assert "k3y-Value" not in unit and "--arg-from-env=--api-key=SGLANG_API_KEY" in unit
    assert "--worker-urls" not in unit and "http://sglang" not in unit
    # The key goes to its own file; the workers' keys to another, which systemd never reads.
    assert 'SGLANG_API_KEY="k3y-Value"' in render.render_env(gs)
    keys = render.render_keys(gs, ["wk", None, "wk2"])
    assert 'SMG_WORKER_KEY_0="wk"' in keys and "SMG_WORKER_KEY_1" not in keys
    assert f"EnvironmentFile={render.env_file_path(gs)}" in unit
    assert render.keys_path(gs) not in unit.split("[Service]")[1].split("ExecStart=")[0]


def test_the_unit_bounds_a_pending_registration_and_its_start_survives_a_worker_down():
    gs = gateway(gateway_worker_startup_timeout_s=900, gateway_health_check_interval_s=7)
    assert " --worker-startup-timeout-secs 900 --worker-startup-check-interval 7 " in " ".join(
        map(str, render.smg_argv(gs)))
    post = render.render_unit(gs).split("ExecStartPost=")[1].split("\nRestart=")[0]
    assert post.rstrip().endswith("--not-up-ok") and " sync " in post
    # The deploy's own sync reports a worker not up as a failure: no such flag.
    assert "--not-up-ok" not in render.sync_argv(gateway())
    assert render.sync_argv(gateway(), "check", 45)[-2:] == ["--timeout", "45"]


@pytest.mark.parametrize("value, allowed", [(0, False), (1, True), (86400, True), (86401, False)])
def test_the_worker_startup_timeout_at_its_edges(value, allowed):
    if allowed:
        assert gateway(gateway_worker_startup_timeout_s=value).gateway_worker_startup_timeout_s == value
    else:
        with pytest.raises(SettingsError, match="gateway_worker_startup_timeout_s"):
            gateway(gateway_worker_startup_timeout_s=value)


def test_no_key_no_launcher_option_and_settings_change_the_unit():
    base = render.render_unit(gateway())
    assert "--arg-from-env" not in base
    assert render.render_unit(gateway(gateway_policy="round_robin")) != base
    assert "--remove-unhealthy-workers" in render.render_unit(gateway(gateway_remove_unhealthy=True))


def test_the_worker_list_names_key_variables_never_keys():
    text = render.render_workers(WORKERS)
    assert '"key_env": "SMG_WORKER_KEY_1"' in text and text.count('"key_env": null') == 2


# --- its container, on recorded Proxmox and H200 answers (tests/fixtures) --------------------


def test_the_host_phase_creates_the_gateways_container_without_gpus_recorded_h200_pve():
    """The host phase on the recorded H200 Proxmox host: the serving container gets its GPUs,
    the gateway's container (vmid 120) is created and started with none, mounting the host's
    wheel store, which holds the gateway's smg set beside the serving one."""
    from harness import plan_deploy
    from pve_sglang.facts.pve import PctConfig, PctPending, PctStatus
    from tasks.host import host_phase
    from test_host_phase_recorded import container_answers, gpu_host_responses

    missing = (Path(__file__).parents[1] / "fixtures/public/pve_pct_missing_ct_pve-nas-issue6.txt").read_text()
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 PctConfig().command(120): missing, PctStatus().command(120): missing,
                 PctPending().command(120): missing}
    responses = dict(sorted(responses.items(), key=lambda item: -len(str(item[0]))))
    ct = {**DEFAULTS, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve",
          "hostname": "glm5", "cores": 64, "memory_mib": 524288}
    gw = {**DEFAULTS, "pct_vmid": 120, "pve_host": "@fake/pve1", "platform": "pve",
          "hostname": "gateway", "cores": 4, "memory_mib": 4096}
    ops = plan_deploy(
        host_phase,
        hosts=[("pve1", {**DEFAULTS, "containers": ["@fake/ct105"], "gateways": ["@fake/gw120"]}),
               ("ct105", ct), ("gw120", gw)],
        responses=responses,
        groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"], "gateways": ["gw120"]},
    )["pve1"]
    every = [c for _, cmds in ops for c in cmds]
    [create] = [c for c in every if "pct create 120" in c]
    assert "--hostname gateway" in create and "--cores 4" in create
    assert not [c for c in every if "pct set 120" in c and "--dev" in c]
    assert [c for c in every if "pct set 105" in c and "--dev0 /dev/nvidia0" in c]
    assert "pct start 120" in every
    names = [name for name, _ in ops]
    store = DEFAULTS["wheel_store"]
    assert [n for n in names if f"| Wheel store {store}:" in n and "smg 1.13.0" in n], names
    assert [n for n in names if f"| Wheel store {store}:" in n and "sglang " in n], names
    assert f"--mp0 {store},mp={store},ro=1" in create


# --- the benchmark through the gateway -------------------------------------------------------


def test_the_benchmark_through_the_gateway_targets_it_from_the_first_worker():
    from pve_sglang.config.settings import ContainerSettings
    from pve_sglang.gateway.workers import gateway_address
    from tasks.gateway import gateway_bench_runs

    cs = ContainerSettings.model_validate({
        **{k: v for k, v in DEFAULTS.items() if k in ContainerSettings.model_fields},
        "stack_install": "sglang-no-deps", "server_port": 30001, "bench_preset": "quick"})
    gs = gateway(gateway_host="0.0.0.0", gateway_port=8080, gateway_bench=True)
    address = gateway_address(gs.gateway_host, "gateway")
    runs = gateway_bench_runs(cs.benchmark, cs.server, gs, address)
    assert runs
    for argv in runs.values():
        text = " ".join(argv)
        assert "--host gateway --port 8080 --base-url http://gateway:8080" in text
        assert "30001" not in text and "/metrics" not in text
    assert gateway_address("10.0.0.9", "gateway") == "10.0.0.9"


def test_the_benchmark_through_a_loopback_gateway_is_refused():
    with pytest.raises(SettingsError, match="gateway_bench runs the benchmark from the first"):
        gateway(gateway_bench=True)


@pytest.mark.parametrize("state, urls", [
    ('{"registered": ["http://a:1"]}', ["http://a:1"]),
    # Written by an older deploy: a plain list.
    ('["http://a:1", "http://b:2"]', ["http://a:1", "http://b:2"]),
    ('{"registered": ["http://a:1", 5]}', ["http://a:1"]),
    ('"nonsense"', []),
    (None, []),
])
def test_the_worker_scripts_state_is_read_old_and_new(tmp_path, state, urls):
    from pve_sglang.remote import gateway_workers

    path = tmp_path / "state.json"
    if state is not None:
        path.write_text(state)
    assert gateway_workers.read_state(str(path)) == urls


def test_the_registered_keys_are_a_link_that_a_new_keys_file_leaves_behind(tmp_path):
    """The keys the workers hold are the old file itself (a hard link, no copy): a new file
    renamed into place by the deploy is not current, and the old keys stay readable beside it
    until the sync links the new one."""
    from pve_sglang.remote import gateway_workers as gw

    keys = tmp_path / "keys.env"
    assert not gw.keys_current(str(keys)) and gw.read_keys(str(keys)) == ({}, None)
    keys.write_text('SMG_WORKER_KEY_0="sk-first"\n')
    values, which = gw.read_keys(str(keys))
    assert values == {"SMG_WORKER_KEY_0": "sk-first"} and not gw.keys_current(str(keys))
    gw.link_registered(str(keys), which)
    link = Path(gw.registered_keys_path(str(keys)))
    assert gw.keys_current(str(keys)) and link.stat().st_nlink == 2
    new = tmp_path / "keys.new"
    new.write_text('SMG_WORKER_KEY_0="sk-other"\n')
    new.rename(keys)
    assert not gw.keys_current(str(keys))
    assert gw.read_keys(str(link))[0] == {"SMG_WORKER_KEY_0": "sk-first"}
    # A file renamed in after the read is not linked: the next sync compares it.
    third = tmp_path / "keys.third"
    third.write_text('SMG_WORKER_KEY_0="sk-third"\n')
    third.rename(keys)
    gw.link_registered(str(keys), which)
    assert not gw.keys_current(str(keys))
    gw.link_registered(str(keys), gw.read_keys(str(keys))[1])
    assert gw.keys_current(str(keys)) and not Path(str(link) + ".tmp").exists()
    worker = {"url": "http://a:1", "key_env": "SMG_WORKER_KEY_0"}
    assert gw.worker_spec(worker, gw.read_keys(str(keys))[0]) == {
        "url": "http://a:1", "api_key": "sk-third"}
    assert gw.worker_spec({"url": "http://b:2", "key_env": None}, {}) == {"url": "http://b:2"}


@pytest.mark.parametrize("field, value", [("gateway_roll_batch", 1), ("gateway_roll_batch", 1000),
                                          ("gateway_drain_timeout_s", 1),
                                          ("gateway_drain_timeout_s", 86400),
                                          ("gateway_roll_failure", "keep"),
                                          ("gateway_roll_failure", "back")])
def test_the_rolls_settings_are_taken_at_their_edges(field, value):
    assert getattr(validate_gateway(W, {field: value}, DEFAULTS), field) == value
