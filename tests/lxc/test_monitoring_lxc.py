"""The monitoring phase with Debian's real Prometheus (its prometheus package, installed by the
deploy) in a real LXC container on the bridge, scraping stand-in SGLang servers
(tests/standin_sglang.py: SGLang's /metrics with its real metric names) that run as processes
in the same container, at its bridge address, as the gateway tests run theirs, and the real smg
(PyPI, its hashed lock, set up by the gateway phase's own steps) in front of one of them. One
container for the module; the monitoring steps run through pyinfra's CLI (tests/deploys/monitoring.py); every
answer comes from Prometheus's own HTTP API, asked inside the container.

In order: the first deploy installs Prometheus, writes its configuration, rules and the keyed
server's key file (0600, the prometheus user's; the key in no configuration, argv or output), and
Prometheus reports each target up with the servers' and smg's series; a re-run changes nothing;
a server stopped is ``up == 0`` and fires PveSglangServerDown through Prometheus's own rule
evaluation; the gateway's worker stopped fires PveSglangGatewayWorkerUnhealthy from smg's own
metrics;
a server dropped from the inventory leaves the targets and its key file goes (a file the deploy
did not write stays); then, as a user's own Prometheus, the deploy writes only what its
prometheus.yml includes (scrape configs, rules, keys, in a folder of their own), which the test
includes by hand as the docs say and Prometheus then scrapes and evaluates.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from cache_dir import TEST_CACHE
from cli_runs import changed, failed
from wheels import locked_wheels

from pve_sglang.config.gateway import smg_lock_path
from pve_sglang.config.monitoring import validate_monitoring
from pve_sglang.monitoring import render
from pve_sglang.monitoring.targets import Target
from pve_sglang.project import load_defaults

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
LOGS = REPO / "tests" / "fixtures" / "sglang_logs"
STANDIN = "/opt/standin"
KEY = "sk-monitoring-test-Qv8"
PLAIN, KEYED = 31101, 31102
#: Debian's .debs the container downloads, kept for the next run (and tests/promtool.py).
ARCHIVES = TEST_CACHE / "monitoring" / "apt-archives"
#: Short intervals: Prometheus scrapes and evaluates every second, an alert fires after one.
SETTINGS = {"monitoring_scrape_interval_s": 1, "monitoring_alert_for_s": 1}
MS = validate_monitoring("test", SETTINGS, load_defaults())
TIMES: dict[str, float] = {}
#: The gateway (smg) in front of the keyed stand-in: its name, ports and settings.
GATEWAY = "@lxc/gw"
GATEWAY_PORT, SMG_METRICS = 30000, 29000
GATEWAY_SETTINGS = {"gateway_api_key": KEY, "gateway_wheelhouse": "/opt/wheels",
                    "gateway_host": "0.0.0.0", "gateway_port": GATEWAY_PORT,
                    "gateway_prometheus_port": SMG_METRICS, "gateway_health_check_interval_s": 1,
                    "gateway_health_check_timeout_s": 1, "gateway_health_failure_threshold": 2,
                    "gateway_register_timeout_s": 20}

#: Prometheus's HTTP API asked in its container: PATH and its query, the JSON answer printed.
API_CALL = """
import sys, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:9090" + sys.argv[1], timeout=10).read().decode())
"""


def name_of(port: int) -> str:
    return f"@lxc/standin-{port}"


class Site:
    """The container, its stand-ins and the test deploy."""

    def __init__(self, box, folder: Path):
        self.box, self.folder = box, folder
        self.address = str(box.address.ip)

    def start_standin(self, port: int, key: str | None = None) -> None:
        env = f"--setenv=SGLANG_API_KEY={key} " if key else ""
        self.box.attach(
            f"systemd-run --unit standin-{port} {env}/usr/bin/python3 {STANDIN}/standin_sglang.py "
            f"--logs {STANDIN}/logs --port {port} --host 0.0.0.0 --event-file /run/standin-{port} "
            "--pause-scale 0.01 --enable-metrics")

    def stop_standin(self, port: int) -> None:
        self.box.attach(f"systemctl stop standin-{port}", check=False)

    def targets(self, ports: tuple[int, ...]) -> list[Target]:
        return [Target("sglang", name_of(p), f"{self.address}:{p}", "@local", p == KEYED)
                for p in ports] + [Target("smg", GATEWAY, f"{self.address}:{SMG_METRICS}",
                                          "@local")]

    def run(self, inventory_text: str, deploy: str) -> tuple[subprocess.CompletedProcess,
                                                             dict | None]:
        inventory = self.folder / "inventory.py"
        inventory.write_text(inventory_text)
        done = subprocess.run([str(PYINFRA), str(inventory), deploy, "-y", "--json"], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        try:
            results = json.loads(done.stdout)
        except ValueError:
            results = None
        return done, results

    def gateway(self) -> tuple[subprocess.CompletedProcess, dict | None]:
        """smg in this container in front of the keyed stand-in: the gateway phase's steps."""
        data = {**self.box.host_data(), "settings": GATEWAY_SETTINGS, "check_timeout_s": 8,
                "gateway_worker_list": [{"name": name_of(KEYED), "has_key": True,
                                         "url": f"http://{self.address}:{KEYED}"}],
                "worker_keys": [KEY]}
        return self.run(f"gateways = [({self.box.inventory_name!r}, {data!r})]\n",
                        "tests/deploys/gateway.py")

    def deploy(self, ports: tuple[int, ...], **extra) -> tuple[subprocess.CompletedProcess,
                                                                dict | None]:
        """The monitoring deploy scraping the stand-ins of PORTS; EXTRA: host data over it."""
        found = self.targets(ports)
        data = {**self.box.host_data(), "settings": SETTINGS, **extra,
                "monitoring_targets": [t.as_data() for t in found],
                "monitoring_caps": {name_of(PLAIN): 64} if PLAIN in ports else {},
                "server_keys": {t.name: KEY for t in found if t.has_key}}
        return self.run(f"monitoring = [({self.box.inventory_name!r}, {data!r})]\n",
                        "tests/deploys/monitoring.py")

    def api(self, path: str, **query: str) -> dict:
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        done = self.box.attach(f"python3 -c {shlex.quote(API_CALL)} {shlex.quote(url)}",
                               check=False)
        return json.loads(done.stdout) if done.returncode == 0 else {}

    def query(self, expr: str) -> list[dict]:
        return (self.api("/api/v1/query", query=expr).get("data") or {}).get("result") or []

    def wait(self, what: str, check, seconds: float = 120):
        """Until CHECK() answers something true; its last answer in the failure."""
        deadline = time.monotonic() + seconds
        while not (found := check()):
            assert time.monotonic() < deadline, f"{what}: {found!r}"
            time.sleep(0.5)
        return found

    def up(self) -> dict[str, str]:
        return {r["metric"]["container"]: r["value"][1] for r in self.query('up{job="sglang"}')}

    def scraped(self) -> set[str]:
        active = (self.api("/api/v1/targets").get("data") or {}).get("activeTargets") or []
        return {t["labels"].get("container") for t in active}




@pytest.fixture(scope="module")
def site(lxc_env, package_index, tmp_path_factory):
    began = time.monotonic()
    ARCHIVES.mkdir(parents=True, exist_ok=True)
    wheels = locked_wheels(smg_lock_path("1.13.0", "3.11"))
    box = lxc_env.create(lxc_env.new_name("mon"), network="bridge", extra_config=[
        f"lxc.mount.entry = {ARCHIVES} var/cache/apt/archives none bind,create=dir 0 0",
        f"lxc.mount.entry = {wheels} opt/wheels none bind,ro,create=dir 0 0"])
    s = Site(box, tmp_path_factory.mktemp("monitoring"))
    box.attach(f"mkdir -p {STANDIN}/logs")
    box.attach(f"cat > {STANDIN}/standin_sglang.py", input=(REPO / "tests/standin_sglang.py").read_text())
    box.attach(f"cat > {STANDIN}/logs/startup_tp8.log", input=(LOGS / "startup_tp8.log").read_text())
    s.start_standin(PLAIN)
    s.start_standin(KEYED, KEY)
    TIMES["container and stand-ins"] = time.monotonic() - began
    done, results = s.gateway()
    assert done.returncode == 0 and results and not failed(results), done.stderr[-5000:]
    TIMES["smg"] = time.monotonic() - began - TIMES["container and stand-ins"]
    yield s
    print(f"\nmonitoring LXC module: {json.dumps({k: round(v, 1) for k, v in TIMES.items()})}")
    box.destroy()


@pytest.fixture(scope="module")
def first(site):
    began = time.monotonic()
    done, results = site.deploy((PLAIN, KEYED))
    TIMES["first deploy"] = time.monotonic() - began
    return done, results


def test_first_deploy_installs_prometheus_scraping_every_server(site, first):
    done, results = first
    assert done.returncode == 0 and results and not failed(results), done.stderr[-5000:]
    names = " | ".join(changed(results))
    for step in ("Prometheus (Debian's)", "Prometheus's configuration", "Scrape key",
                 "Prometheus reloaded"):
        assert step in names, names
    up = site.wait("both servers up", lambda: (u := site.up()) == {
        name_of(PLAIN): "1", name_of(KEYED): "1"} and u)
    assert up
    # A server metric's series, labelled with its container (the rules join on it).
    series = site.wait("the servers' series", lambda: {
        r["metric"]["container"] for r in site.query("sglang:num_running_reqs")} == {
            name_of(PLAIN), name_of(KEYED)})
    assert series
    # The inventory's figures reach Prometheus as the rules' series.
    caps = site.wait("the cap", lambda: site.query("pve_sglang:max_running_requests"))
    assert [(c["metric"]["container"], c["value"][1]) for c in caps] == [(name_of(PLAIN), "64")]
    # smg's own metrics, its worker's health among them.
    site.wait("smg up", lambda: [r["value"][1] for r in site.query('up{job="smg"}')] == ["1"])
    health = site.wait("smg's worker health", lambda: site.query(
        'smg_worker_health{job="smg"}'))
    assert [(h["metric"]["container"], h["value"][1]) for h in health] == [(GATEWAY, "1")], health


def test_the_key_is_a_file_of_prometheus_alone_and_nowhere_else(site, first):
    done, _ = first
    path = render.key_path(MS, name_of(KEYED))
    assert site.box.attach(f"stat -c '%a %U' {path}").stdout.split() == ["600", "prometheus"]
    assert site.box.attach(f"cat {path}").stdout == KEY
    seen = site.box.attach(f"cat /proc/[0-9]*/cmdline | tr '\\0' ' '; cat {render.CONFIG_PATH} "
                           f"{render.rules_dir(MS)}/*.yml; journalctl -u prometheus --no-pager",
                           check=False).stdout
    assert path in seen and KEY not in seen
    assert KEY not in done.stdout + done.stderr


def test_rerun_changes_nothing(site, first):
    done, results = site.deploy((PLAIN, KEYED))
    assert done.returncode == 0 and results, done.stderr[-4000:]
    assert changed(results) == [] and failed(results) == []


def test_a_server_stopped_is_down_and_fires_its_alert(site, first):
    site.stop_standin(PLAIN)
    try:
        site.wait("the stopped server down", lambda: site.up().get(name_of(PLAIN)) == "0")
        assert site.up()[name_of(KEYED)] == "1"
        firing = site.wait("PveSglangServerDown firing", lambda: [
            a for a in (site.api("/api/v1/alerts").get("data") or {}).get("alerts") or []
            if a["labels"].get("alertname") == "PveSglangServerDown" and a["state"] == "firing"])
        assert [a["labels"]["container"] for a in firing] == [name_of(PLAIN)]
        assert "journalctl -u sglang" in firing[0]["annotations"]["hint"]
    finally:
        site.start_standin(PLAIN)
    site.wait("the server up again", lambda: site.up().get(name_of(PLAIN)) == "1")


def test_the_gateways_worker_stopped_fires_its_alert_from_smgs_metrics(site, first):
    site.stop_standin(KEYED)
    try:
        firing = site.wait("PveSglangGatewayWorkerUnhealthy firing", lambda: [
            a for a in (site.api("/api/v1/alerts").get("data") or {}).get("alerts") or []
            if a["labels"].get("alertname") == "PveSglangGatewayWorkerUnhealthy"
            and a["state"] == "firing"])
        assert [a["labels"]["container"] for a in firing] == [GATEWAY]
    finally:
        site.start_standin(KEYED, KEY)
    site.wait("the worker healthy again", lambda: [
        h["value"][1] for h in site.query('smg_worker_health{job="smg"}')] == ["1"])


def test_a_server_dropped_from_the_inventory_leaves_the_targets_and_its_key(site, first):
    keys = render.keys_dir(MS)
    # Another's file in the keys folder: not the deploy's name, so never removed.
    site.box.attach(f"echo mine > {keys}/users-own.key")
    done, results = site.deploy((PLAIN,))
    assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
    site.wait("only the kept server scraped", lambda: site.scraped() == {name_of(PLAIN), GATEWAY})
    assert site.box.attach(f"ls {keys}").stdout.split() == ["users-own.key"]
    done, results = site.deploy((PLAIN,))
    assert done.returncode == 0 and results and changed(results) == [], done.stderr[-4000:]


def test_an_existing_prometheus_gets_only_what_its_configuration_includes(site, first):
    theirs = "/etc/prometheus/theirs"
    settings = {**SETTINGS, "monitoring_dir": theirs}
    ms = validate_monitoring("test", settings, load_defaults())
    before = site.box.attach(f"sha256sum {render.CONFIG_PATH} {render.DEFAULTS_PATH}").stdout
    done, results = site.deploy((PLAIN, KEYED), monitoring_external=True, settings=settings)
    assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
    names = " | ".join(changed(results))
    assert "Scrape configs" in names and "Prometheus (Debian's)" not in names, names
    assert "reloaded" not in names and "enabled and running" not in names, names
    # Its configuration and flags stay the user's.
    assert site.box.attach(f"sha256sum {render.CONFIG_PATH} {render.DEFAULTS_PATH}").stdout == before
    assert site.box.attach(f"stat -c '%a %U' {render.key_path(ms, name_of(KEYED))}"
                           ).stdout.split() == ["600", "prometheus"]
    # The user includes them: its own global and rule_files, the jobs of the scrape configs
    # appended (Debian's 2.42 has no scrape_config_files).
    head = ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {render.rules_dir(ms)}/*.yml\n")
    site.box.attach(f"cat - {render.scrape_path(ms)} > {render.CONFIG_PATH} && promtool check "
                    f"config {render.CONFIG_PATH} && systemctl reload prometheus", input=head)
    since = site.box.attach("date -u +%Y-%m-%dT%H:%M:%S").stdout.strip()
    site.wait("the rules of the folder of its own loaded", lambda: any(
        g["file"].startswith(theirs)
        for g in (site.api("/api/v1/rules").get("data") or {}).get("groups") or []))

    def scraped_since() -> list[dict]:
        active = (site.api("/api/v1/targets").get("data") or {}).get("activeTargets") or []
        return [t for t in active if t["health"] == "up" and t["lastScrape"][:19] > since]

    fresh = site.wait("both servers and smg scraped up after the reload",
                      lambda: len(found := scraped_since()) == 3 and found)
    assert {t["labels"]["container"] for t in fresh} == {name_of(PLAIN), name_of(KEYED), GATEWAY}
    done, results = site.deploy((PLAIN, KEYED), monitoring_external=True, settings=settings)
    assert done.returncode == 0 and results and changed(results) == [], done.stderr[-4000:]
