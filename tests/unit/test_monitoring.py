"""The monitoring's pure parts: scrape targets chosen from the inventory, Prometheus's
configuration (keys only as files), and the shipped alert rules run by Debian's own
``promtool test rules`` (tests/promtool.py finds it), each alert at its edges: the value that
fires it and the one just beside it that does not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pve_sglang import remote
from pve_sglang.config.monitoring import validate_monitoring
from pve_sglang.config.settings import SettingsError
from pve_sglang.monitoring import render, targets
from pve_sglang.monitoring.targets import Target
from pve_sglang.project import load_defaults
from promtool import promtool

REPO = Path(__file__).resolve().parents[2]
MS = validate_monitoring("test", {"monitoring_alert_for_s": 60}, load_defaults())


# --- targets ----------------------------------------------------------------------------------

SERVER = {"enable_metrics": True, "server_host": "0.0.0.0", "server_port": 30000,
          "hostname": "sglang-c1", "api_key": None, "nodes": None}


@pytest.mark.parametrize("bound, address", [("0.0.0.0", "sglang-c1:30000"),
                                            ("::", "sglang-c1:30000"),
                                            ("10.0.3.7", "10.0.3.7:30000"),
                                            ("fd00::7", "[fd00::7]:30000")])
def test_a_server_is_scraped_where_the_monitoring_container_reaches_it(bound, address):
    target = targets.server_target("w", "@lxc/c1", "@local", {**SERVER, "server_host": bound})
    assert target == Target("sglang", "@lxc/c1", address, "@local", False)


@pytest.mark.parametrize("bound", ["127.0.0.1", "127.1.2.3", "::1"])
def test_a_server_on_loopback_is_refused_naming_the_field(bound):
    with pytest.raises(SettingsError, match=rf"host h, container c1: field 'server_host' = "
                                            rf"'{re.escape(bound)}' is reachable from its own"):
        targets.server_target("host h, container c1", "@lxc/c1", "h",
                              {**SERVER, "server_host": bound})


def test_a_server_without_metrics_is_refused_and_a_later_node_is_no_target():
    with pytest.raises(SettingsError, match="field 'enable_metrics' = False"):
        targets.server_target("w", "@lxc/c1", "h", {**SERVER, "enable_metrics": False})
    nodes = ("@lxc/c0", "@lxc/c1")
    assert targets.server_target("w", "@lxc/c1", "h", {**SERVER, "nodes": nodes}) is None
    assert targets.server_target("w", "@lxc/c0", "h", {**SERVER, "nodes": nodes}) is not None


def test_a_keyed_server_has_a_job_of_its_own_with_its_key_file_never_the_key():
    found = [Target("sglang", "@lxc/a", "sglang-a:30000", "h"),
             Target("sglang", "@lxc/b", "sglang-b:30000", "h", has_key=True),
             Target("smg", "@lxc/gw", "sglang-gw:29000", "h"),
             Target("node", "h", "h:9100", "h")]
    config = yaml.safe_load(render.render_config(MS, found))
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    assert list(jobs) == ["sglang", "smg", "node", "sglang-key-1"]
    keyed = jobs["sglang-key-1"]
    assert keyed["authorization"] == {"type": "Bearer",
                                      "credentials_file": render.key_path(MS, "@lxc/b")}
    assert keyed["relabel_configs"] == [{"target_label": "job", "replacement": "sglang"}]
    assert keyed["static_configs"] == [{"targets": ["sglang-b:30000"],
                                        "labels": {"container": "@lxc/b", "pve_host": "h"}}]
    assert "authorization" not in jobs["sglang"]
    assert config["rule_files"] == ["/etc/prometheus/pve-sglang/rules/*.yml"]


def test_key_files_the_deploy_removes_are_only_its_own_names():
    name = render.key_path(MS, "@pct/pve1/105").rsplit("/", 1)[1]
    assert render.is_key_name(name)
    for other in ("server-0123456789abcde.key", "server-0123456789abcdef0.key",
                  "server-0123456789abcdeg.key", "user.key", "server-0123456789abcdef.key~"):
        assert not render.is_key_name(other), other


@pytest.mark.parametrize("field, value, allowed", [
    ("monitoring_throughput_share", 1, "less than 1"),
    ("monitoring_throughput_share", 0, "greater than 0"),
    ("prometheus_host", "localhost", "not an IP address"),
    ("monitoring_dir", "etc/prom", "absolute"),
    ("monitoring_low_power_pct", 101, "less than or equal to 100"),
])
def test_bad_monitoring_settings_are_refused_naming_field_and_value(field, value, allowed):
    with pytest.raises(SettingsError) as error:
        validate_monitoring("host h, monitoring", {field: value}, load_defaults())
    assert field in str(error.value) and "host h, monitoring" in str(error.value)
    assert allowed in str(error.value)


def test_best_output_of_the_last_run():
    runs = [{"rows": [{"output_token_throughput": 5000.0}]},
            {"rows": [{"output_token_throughput": 880.0}, {"output_token_throughput": 3740.0},
                      {"output_token_throughput": None}]}]
    assert render.best_output_tok_s(runs) == 3740.0
    assert render.best_output_tok_s([]) is None
    assert render.best_output_tok_s([{"rows": [{"output_token_throughput": 0}]}]) is None


# --- the rules, run by promtool ---------------------------------------------------------------

def running(container, values, host="h1"):
    return f'sglang:num_running_reqs{{job="sglang",container="{container}",pve_host="{host}"}}', values


def queued(container, values, host="h1"):
    return f'sglang:num_queue_reqs{{job="sglang",container="{container}",pve_host="{host}"}}', values


def metric(name, container, values, host="h1", job="sglang", **labels):
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'{name}{{job="{job}",container="{container}",pve_host="{host}"{extra}}}', values


#: alert -> (input series, eval time, the labels of the alerts expected to fire).
CASES = {
    # Down from 30 s: pending at 75 s (45 s), firing at 90 s (60 s = monitoring_alert_for_s).
    "PveSglangServerDown": (
        [metric("up", "a", "1 1 0x10"), metric("up", "b", "1x12")],
        [("75s", []), ("90s", [{"container": "a"}])]),
    # Three restarts (six changes of up) in 30 minutes fire; five changes do not.
    "PveSglangServerRestarting": (
        [metric("up", "a", "1 0 1 0 1 0 1 1"), metric("up", "b", "1 0 1 0 1 0 0 0")],
        [("2m", [{"container": "a"}])]),
    # At the cap of 64 with a queue; one under it; at it without a queue.
    "PveSglangQueueAtCap": (
        [running("a", "64x10"), queued("a", "1x10"), running("b", "63x10"), queued("b", "5x10"),
         running("c", "64x10"), queued("c", "0x10")],
        [("2m", [{"container": "a"}])]),
    # Token usage at 0.95 with a queue; 0.94 with one; 0.99 without.
    "PveSglangKvCacheFull": (
        [metric("sglang:token_usage", "a", "0.95x10"), queued("a", "1x10"),
         metric("sglang:token_usage", "b", "0.94x10"), queued("b", "3x10"),
         metric("sglang:token_usage", "c", "0.99x10"), queued("c", "0x10")],
        [("2m", [{"container": "a"}])]),
    # GPUs at 359 of 600 W (under 60 %) with a queue; at 360 W (60 %); low without a queue.
    "PveSglangGpuUnderPower": (
        [metric("pve_sglang_gpu_power_watts", "h1", "359x10", "h1", "node", gpu="0"),
         metric("pve_sglang_gpu_power_limit_watts", "h1", "600x10", "h1", "node", gpu="0"),
         metric("pve_sglang_gpu_power_watts", "h2", "360x10", "h2", "node", gpu="0"),
         metric("pve_sglang_gpu_power_limit_watts", "h2", "600x10", "h2", "node", gpu="0"),
         metric("pve_sglang_gpu_power_watts", "h3", "100x10", "h3", "node", gpu="0"),
         metric("pve_sglang_gpu_power_limit_watts", "h3", "600x10", "h3", "node", gpu="0"),
         queued("c1", "2x10", "h1"), queued("c2", "2x10", "h2"), queued("c3", "0x10", "h3")],
        [("2m", [{"pve_host": "h1"}])]),
    "PveSglangGatewayWorkerUnhealthy": (
        [metric("smg_worker_health", "gw", "1 0x10", "h1", "smg", worker="http://a:30000"),
         metric("smg_worker_health", "gw", "1x10", "h1", "smg", worker="http://b:30000")],
        [("2m", [{"container": "gw", "worker": "http://a:30000", "job": "smg",
                  "pve_host": "h1"}])]),
    # Benchmark 1000 tok/s, share 0.7: 699 with a queue fires, 700 does not, 100 without a queue.
    "PveSglangThroughputBelowBenchmark": (
        [metric("sglang:gen_throughput", "a", "699x10"), queued("a", "1x10"),
         metric("sglang:gen_throughput", "b", "700x10"), queued("b", "1x10"),
         metric("sglang:gen_throughput", "c", "100x10"), queued("c", "0x10")],
        [("2m", [{"container": "a"}])]),
}
#: The labels each alert keeps from its expression, beside the given ones.
KEPT = {"PveSglangServerDown": {"job": "sglang", "pve_host": "h1"},
        "PveSglangServerRestarting": {"job": "sglang", "pve_host": "h1"},
        "PveSglangGpuUnderPower": {}, "PveSglangGatewayWorkerUnhealthy": {}}


def expected(rule: dict, labels: dict) -> dict:
    """An alert as promtool reports it: its labels and its annotations with them filled in."""
    labels = {**rule.get("labels", {}), **labels}
    notes = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), v)
             for k, v in rule["annotations"].items()}
    return {"exp_labels": labels, "exp_annotations": notes}


@pytest.fixture(scope="module")
def tool():
    path, why = promtool()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def rule_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rules")
    (folder / render.RULES_NAME).write_text(render.render_rules(MS))
    names = {c: 1000.0 for c in "abc"}
    (folder / render.INVENTORY_RULES_NAME).write_text(
        render.render_inventory_rules(MS, names, {c: 64 for c in "abc"}))
    return folder


def test_the_shipped_rules_cover_every_alert_the_issue_names():
    rules = yaml.safe_load(render.RULES_SOURCE.read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert sorted(alerts) == sorted(CASES)


def test_promtool_checks_the_rendered_rules_and_config(tool, rule_files, tmp_path):
    done = subprocess.run([tool, "check", "rules", *sorted(map(str, rule_files.glob("*.yml")))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text(render.render_config(MS, [Target("sglang", "@lxc/a", "a:30000", "h"),
                                                Target("node", "h", "h:9100", "h")]).replace(
        "/etc/prometheus/pve-sglang/rules", str(rule_files)))
    done = subprocess.run([tool, "check", "config", str(config)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("alert", sorted(CASES))
def test_each_alert_fires_at_its_edge_and_not_beside_it(tool, rule_files, alert, tmp_path):
    series, evals = CASES[alert]
    rules = yaml.safe_load(render.render_rules(MS))
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    kept = KEPT.get(alert, {"pve_host": "h1"})
    test = {"rule_files": [str(rule_files / render.RULES_NAME),
                           str(rule_files / render.INVENTORY_RULES_NAME)],
            "evaluation_interval": "15s",
            "tests": [{"interval": "15s",
                       "input_series": [{"series": s, "values": v} for s, v in series],
                       "alert_rule_test": [
                           {"eval_time": at, "alertname": alert,
                            "exp_alerts": [expected(rule, {**kept, **labels}) for labels in fire]}
                           for at, fire in evals]}]}
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run([tool, "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the GPU textfile (recorded H200 nvidia-smi output) ---------------------------------------

RECORDED_CSV = REPO / "tests/fixtures/h200/gpu_sampler/heavy_raw.csv"


def run_textfile(tmp_path, stand_in: str) -> str:
    """gpu_textfile.py --once as the deploy leaves it (beside the sampler), with STAND_IN as
    nvidia-smi; the textfile it wrote."""
    script = remote.stage(remote.GPU_TEXTFILE, tmp_path / "tools")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{stand_in}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    out = tmp_path / "textfile"
    out.mkdir()
    subprocess.run([sys.executable, str(script), "--dir", str(out), "--once"], check=True,
                   env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert [p.name for p in out.iterdir()] == ["pve_sglang_gpu.prom"]
    return (out / "pve_sglang_gpu.prom").read_text()


def test_the_gpu_textfile_from_recorded_h200_output_passes_promtool(tmp_path, tool):
    line = RECORDED_CSV.read_text().splitlines()[-1]
    text = run_textfile(tmp_path, f"echo '{line}'")
    power, limit = (float(v) for v in line.split(",")[1:3])
    assert f'pve_sglang_gpu_power_watts{{gpu="0"}} {power:g}\n' in text
    assert f'pve_sglang_gpu_power_limit_watts{{gpu="0"}} {limit:g}\n' in text
    assert "pve_sglang_gpu_up 1\n" in text
    done = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_gpu_textfile_says_when_nvidia_smi_fails(tmp_path):
    text = run_textfile(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    assert "pve_sglang_gpu_up 0\n" in text and "power_watts" not in text


# --- the hosts file's monitoring: entry --------------------------------------------------------

DEFAULTS = load_defaults()


def hosts(monitoring: dict | None, gateway_host: str = "0.0.0.0", gateway: bool = True,
          **host) -> dict:
    return {"h": {"platform": "lxc", "server_host": "0.0.0.0", "stack_install": "sglang-no-deps",
                  **host,
                  "containers": [{"name": "w1", "max_running_requests": 64},
                                 {"name": "w2", "api_key": "sk-w2-secret"}],
                  "gateways": [{"name": "gw", "gateway_host": gateway_host}] if gateway else [],
                  **({"monitoring": monitoring} if monitoring is not None else {})}}


def test_a_hosts_monitoring_scrapes_every_server_and_gateway_of_the_inventory():
    from pve_sglang.hosts_file import build_monitored_inventory

    pve_hosts, _, _, [(name, data)] = build_monitored_inventory(
        hosts({"name": "prom", "prometheus_host": "0.0.0.0"}), DEFAULTS)
    assert name == "@lxc/h/prom" and data["lxc_name"] == "prom" and data["pve_host"] == "h"
    assert pve_hosts[0][1]["monitoring"] == ["@lxc/h/prom"]
    assert data["monitoring_targets"] == [
        Target("sglang", "@lxc/h/w1", "sglang-w1:30000", "h").as_data(),
        Target("sglang", "@lxc/h/w2", "sglang-w2:30000", "h", has_key=True).as_data(),
        Target("smg", "@lxc/h/gw", "sglang-gw:29000", "h").as_data()]
    assert data["monitoring_caps"] == {"@lxc/h/w1": 64}
    # Its container: the monitoring's size unless its entry says otherwise, no serving settings.
    assert (data["cores"], data["memory_mib"]) == (2, 2048) and "model_path" not in data
    assert "sk-w2-secret" not in repr(data)


def test_without_monitoring_a_server_on_loopback_is_fine():
    from pve_sglang.hosts_file import build_monitored_inventory

    data = hosts(None, server_host="127.0.0.1", gateway=False)
    assert build_monitored_inventory(data, DEFAULTS)[3] == []


@pytest.mark.parametrize("monitoring, host, words", [
    ({"name": "prom", "prometheus_prot": 1}, {}, ["monitoring prom", "unknown field "
                                                  "'prometheus_prot'", "prometheus_port"]),
    ({"name": "prom", "model_path": "/m"}, {}, ["unknown field 'model_path'"]),
    ({"name": "prom", "cores": 0}, {}, ["container prom", "field 'cores' = 0"]),
    ({"name": "prom", "monitoring_dir": "relative"}, {}, ["monitoring_dir", "'relative'"]),
    ({"name": "prom"}, {"server_host": "127.0.0.1", "gateway": False},
     ["container @lxc/h/w1", "field 'server_host' = '127.0.0.1'", "monitoring container"]),
    ({"name": "prom"}, {"gateway_host": "127.0.0.1"}, ["gateway @lxc/h/gw", "gateway_host"]),
    ({"name": "w1"}, {}, ["a container of its own"]),
])
def test_bad_monitoring_entries_are_named(monitoring, host, words):
    from pve_sglang.hosts_file import build_monitored_inventory

    with pytest.raises(SettingsError) as raised:
        build_monitored_inventory(hosts(monitoring, **host), DEFAULTS)
    for word in words:
        assert word in str(raised.value), str(raised.value)
    assert "sk-w2-secret" not in str(raised.value)


# --- the phases on the recorded H200 Proxmox host (tests/fixtures) ------------------------------


def test_the_host_phase_creates_the_monitoring_container_without_gpus_recorded_h200_pve():
    """The recorded H200 Proxmox host: the monitoring container (vmid 130) is created and
    started with no GPU, sized as its entry says, beside the serving container with its GPUs."""
    from harness import plan_deploy
    from pve_sglang.facts.pve import PctConfig, PctPending, PctStatus
    from tasks.host import host_phase
    from test_host_phase_recorded import container_answers, gpu_host_responses

    missing = (REPO / "tests/fixtures/public/pve_pct_missing_ct_pve-nas-issue6.txt").read_text()
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 PctConfig().command(130): missing, PctStatus().command(130): missing,
                 PctPending().command(130): missing}
    responses = dict(sorted(responses.items(), key=lambda item: -len(str(item[0]))))
    ct = {**DEFAULTS, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve",
          "hostname": "glm5", "cores": 64, "memory_mib": 524288}
    mon = {**DEFAULTS, "pct_vmid": 130, "pve_host": "@fake/pve1", "platform": "pve",
           "hostname": "prom", "cores": 2, "memory_mib": 2048}
    ops = plan_deploy(
        host_phase,
        hosts=[("pve1", {**DEFAULTS, "containers": ["@fake/ct105"], "monitoring": ["@fake/mon130"]}),
               ("ct105", ct), ("mon130", mon)],
        responses=responses,
        groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"], "monitoring": ["mon130"]},
    )["pve1"]
    every = [c for _, cmds in ops for c in cmds]
    [create] = [c for c in every if "pct create 130" in c]
    assert "--hostname prom" in create and "--cores 2" in create and "--memory 2048" in create
    assert not [c for c in every if "pct set 130" in c and "--dev" in c]
    assert "pct start 130" in every


def test_a_gpu_host_of_a_monitored_inventory_gets_the_node_exporter_recorded_h200():
    """On the recorded H200 host, with a monitoring container in the inventory: Debian's node
    exporter on node_exporter_port with its textfile folder, the GPU textfile script and its
    timer; the monitoring container scrapes it at the host's ssh_hostname."""
    from harness import plan_deploy
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.context import ctx_host, ctx_state
    from tasks import monitoring
    from tasks.monitoring import monitoring_phase
    from test_host_phase_recorded import gpu_host_responses

    responses = dict(sorted(gpu_host_responses().items(), key=lambda item: -len(str(item[0]))))
    host_data = {**DEFAULTS, "ssh_hostname": "pve1.lan", "containers": [],
                 "node_exporter_port": 9101}
    ops = plan_deploy(monitoring_phase, hosts=[("pve1", host_data)], responses=responses,
                      groups={"pve_hosts": ["pve1"], "monitoring": []})["pve1"]
    assert ops == []  # no monitoring container in the inventory: nothing on the host
    mon = {**DEFAULTS, "pct_vmid": 130, "pve_host": "@fake/pve1", "platform": "pve",
           "monitoring_targets": [], "monitoring_caps": {}}
    ops = plan_deploy(monitoring_phase, hosts=[("pve1", host_data), ("mon130", mon)],
                      responses=responses,
                      groups={"pve_hosts": ["pve1"], "monitoring": ["mon130"]})["pve1"]
    text = "\n".join(c for _, cmds in ops for c in cmds)
    assert "prometheus-node-exporter" in text
    assert ('ARGS="--web.listen-address=:9101 --collector.textfile.directory='
            '/var/lib/prometheus/node-exporter"') in text
    assert ("ExecStart=/usr/bin/python3 /opt/sglang/gpu_textfile.py --dir "
            "/var/lib/prometheus/node-exporter --once") in text
    assert "OnUnitActiveSec=15s" in text
    assert "pve-sglang-gpu-textfile.timer" in text
    # The container's targets: the host's node exporter at its ssh_hostname.
    state = State(Inventory(([("@fake/pve1", {**host_data, "fake_responses": responses}),
                              ("@fake/mon130", mon)], {}),
                            pve_hosts=(["@fake/pve1"], {}), monitoring=(["@fake/mon130"], {})),
                  Config())
    connect_all(state)
    with ctx_state.use(state), ctx_host.use(state.inventory.get_host("@fake/mon130")):
        ms = validate_monitoring("t", {"node_exporter_port": 9101}, DEFAULTS)
        assert monitoring.scrape_targets(ms) == [Target("node", "@fake/pve1", "pve1.lan:9101",
                                                        "@fake/pve1")]


def test_each_servers_last_benchmark_reaches_the_throughput_rule(tmp_path):
    """The history on this machine (``bench_history_dir``): each server's last run's best
    output tok/s, written as the rule's series; a server without a run has none."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.context import ctx_host, ctx_state
    from pve_sglang.server.bench_history import record
    from tasks import monitoring

    history = str(tmp_path / "bench-history")
    record(history, "@fake/ct105", [{"concurrency": 8, "output_token_throughput": 900.0}], {})
    record(history, "@fake/ct105", [{"concurrency": 8, "output_token_throughput": 1200.5},
                                    {"concurrency": 64, "output_token_throughput": 3400.25}], {})
    found = [Target("sglang", "@fake/ct105", "glm5:30000", "@fake/pve1"),
             Target("sglang", "@fake/ct106", "ct106:30000", "@fake/pve1"),
             Target("smg", "@fake/gw120", "gw:29000", "@fake/pve1")]
    ct = {**DEFAULTS, "pct_vmid": 105, "bench_history_dir": history}
    state = State(Inventory(([("@fake/ct105", ct), ("@fake/ct106", {**ct, "pct_vmid": 106}),
                              ("@fake/mon130", {**DEFAULTS, "pct_vmid": 130})], {})), Config())
    connect_all(state)
    with ctx_state.use(state), ctx_host.use(state.inventory.get_host("@fake/mon130")):
        best = monitoring.last_benchmarks(found)
    assert best == {"@fake/ct105": 3400.25}
    rules = yaml.safe_load(render.render_inventory_rules(MS, best, {}))["groups"][0]["rules"]
    assert {"record": "pve_sglang:benchmark_output_tok_s", "expr": "vector(3400.2)",
            "labels": {"container": "@fake/ct105"}} in rules


def test_an_existing_prometheus_is_reached_by_ssh_and_gets_no_container():
    from pve_sglang.hosts_file import build_monitored_inventory

    data = hosts({"prometheus_address": "prom.lan", "ssh_user": "ops",
                  "monitoring_dir": "/etc/prometheus/pve"}, ssh_port=2222)
    pve_hosts, _, _, [(name, mon)] = build_monitored_inventory(data, DEFAULTS)
    assert name == "prom.lan" and mon["ssh_hostname"] == "prom.lan"
    assert (mon["ssh_user"], mon["ssh_port"], mon["monitoring_external"]) == ("ops", 2222, True)
    assert "lxc_name" not in mon and "cores" not in mon
    assert pve_hosts[0][1]["monitoring"] == []  # the host phase creates no container for it
    assert [t["name"] for t in mon["monitoring_targets"]] == ["@lxc/h/w1", "@lxc/h/w2",
                                                              "@lxc/h/gw"]


@pytest.mark.parametrize("monitoring, words", [
    ({"prometheus_address": "prom.lan", "cores": 2}, ["field 'cores'", "has no container"]),
    ({"prometheus_address": "h"}, ["'prometheus_address' = 'h'", "a machine of its own"]),
    ({"prometheus_address": "prom lan"}, ["prometheus_address", "'prom lan'"]),
    ({"prometheus_address": "prom.lan", "prometheus_user": "Root"}, ["prometheus_user"]),
])
def test_bad_existing_prometheus_entries_are_named(monitoring, words):
    from pve_sglang.hosts_file import build_monitored_inventory

    with pytest.raises(SettingsError) as raised:
        build_monitored_inventory(hosts(monitoring), DEFAULTS)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_an_existing_prometheus_gets_its_scrape_configs_as_a_file_to_include():
    found = [Target("sglang", "@lxc/b", "sglang-b:30000", "h", has_key=True),
             Target("smg", "@lxc/gw", "sglang-gw:29000", "h")]
    text = render.render_scrape_file(MS, found)
    assert yaml.safe_load(text) == {"scrape_configs": render.scrape_configs(MS, found)}
    assert render.scrape_path(MS) == "/etc/prometheus/pve-sglang/scrape-configs.yml"
