"""The gateway phase with the real smg (PyPI, its hashed lock) in a real LXC container, in front
of stand-in SGLang servers (tests/standin_sglang.py: SGLang's /health, /generate, /metrics with
its real metric names; keys checked as SGLang checks them) running as processes in a second
container on the bridge. Two containers for the whole module; the gateway steps run through
pyinfra's CLI (tests/deploys/gateway.py), requests come from inside the gateway's container.

In order, on one gateway: the first deploy installs and registers; a re-run changes nothing;
requests spread over the workers; a shared prefix sticks to one worker (cache_aware); a worker
added is registered without restarting the gateway or the other servers; a worker killed is
marked by the gateway while requests keep being served, and the deploy fails naming it; a worker
dropped from the inventory is removed through the worker API; then a re-run changes nothing; a
worker answering /health but failing every generation (HTTP 500), and one hanging after its
headers, both listed healthy by smg, are named by the deploy, and a worker someone else
registered stays when the inventory drops it; a worker down when registered is named not up
(smg's registration pending, its 409 understood), reported while pending once dropped from the
inventory, and removed once its server came up; a worker's key rotated (its server restarted
with a new one) is registered again with it, in place, without a gateway restart, and serves.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import changed, failed
from wheels import locked_wheels

from pve_sglang.config.gateway import smg_lock_path
from pve_sglang.gateway import render

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
LOGS = REPO / "tests" / "fixtures" / "sglang_logs"
STANDIN = "/opt/standin"
KEY = "sk-gateway-test-Zr4"
PORTS = (31001, 31002, 31003)
#: Stand-ins that fail as a worker can: 500 to every generation, silence after the headers;
#: and the port of a worker whose server is down when it is registered.
FAILING, HANGING, DOWN = 31004, 31005, 31006
GATEWAY_PORT = 30000
CLIENT = "/opt/client/gateway_client.py"
SETTINGS = {"gateway_api_key": KEY, "gateway_wheelhouse": "/opt/wheels",
            "gateway_health_check_interval_s": 1, "gateway_health_check_timeout_s": 1,
            "gateway_health_failure_threshold": 2, "gateway_register_timeout_s": 20,
            "gateway_port": GATEWAY_PORT}
#: Seconds each worker has to answer the deploy's generation check (the hanging one takes them).
CHECK_TIMEOUT_S = 8
SCRIPT = (f"python3 {render.TOOLS}/gateway_workers.py --gateway http://127.0.0.1:{GATEWAY_PORT} "
          "--workers /opt/smg/smg-workers.json --env-file /etc/smg/smg.env --keys-file "
          "/etc/smg/smg-workers.env --state /opt/smg/smg-registered.json")
TIMES: dict[str, float] = {}


def put(box, path: str, text: str, mode: str = "644") -> None:
    box.attach(f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)} && "
               f"chmod {mode} {shlex.quote(path)}", input=text)


class Site:
    """The two containers, the stand-ins and the test deploy."""

    def __init__(self, gateway, servers, folder: Path):
        self.gateway, self.servers, self.folder = gateway, servers, folder
        self.address = str(servers.address.ip)

    def url(self, port: int) -> str:
        return f"http://{self.address}:{port}"

    def start_standin(self, port: int, key: str = KEY, case: str = "normal") -> None:
        self.servers.attach(
            f"systemd-run --unit standin-{port} --setenv=SGLANG_API_KEY={key} /usr/bin/python3 "
            f"{STANDIN}/standin_sglang.py --logs {STANDIN}/logs --port {port} --host 0.0.0.0 "
            f"--event-file /run/standin-{port} --pause-scale 0.01 --enable-metrics --case {case}")

    def stop_standin(self, port: int) -> None:
        self.servers.attach(f"systemctl stop standin-{port}", check=False)

    def script(self, command: str, *args: str) -> tuple[int, dict]:
        """The worker script in the gateway's container, as the deploy runs it."""
        done = self.gateway.attach(f"{SCRIPT.replace(' --gateway', f' {command} --gateway', 1)} "
                                   + " ".join(args), check=False)
        return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])

    def smg(self, method: str, path: str, body: dict | None = None) -> dict:
        """smg's worker API, asked by hand in its container (someone else's change)."""
        done = self.gateway.attach(
            f"python3 -c {shlex.quote(SMG_CALL)} {method} {shlex.quote(path)} "
            f"{shlex.quote(json.dumps(body) if body else '')}")
        return json.loads(done.stdout or "{}")

    def wait_listed(self, wanted: dict[int, bool], seconds: float = 60) -> None:
        """Until smg lists exactly the ports of WANTED, each with that health."""
        deadline = time.monotonic() + seconds
        want = {self.url(p): healthy for p, healthy in wanted.items()}
        while (found := {w["url"]: w["is_healthy"] for w in self.gateway_listing()}) != want:
            assert time.monotonic() < deadline, (found, want)
            time.sleep(0.2)

    def standin_pid(self, port: int) -> str:
        return self.servers.attach(f"systemctl show -p MainPID --value standin-{port}").stdout.strip()

    def deploy(self, ports: tuple[int, ...], keys: dict[int, str] | None = None,
               **settings) -> tuple[subprocess.CompletedProcess, dict | None]:
        """The gateway deploy with workers PORTS, each with its key in KEYS (else KEY), and
        SETTINGS over the module's."""
        workers = [{"name": f"@lxc/standin-{p}", "url": self.url(p), "has_key": True} for p in ports]
        inventory = self.folder / "inventory.py"
        data = {**self.gateway.host_data(), "settings": {**SETTINGS, **settings},
                "gateway_worker_list": workers, "check_timeout_s": CHECK_TIMEOUT_S,
                "worker_keys": [(keys or {}).get(p, KEY) for p in ports]}
        inventory.write_text(f"gateways = [({self.gateway.inventory_name!r}, {data!r})]\n")
        done = subprocess.run([str(PYINFRA), str(inventory), "tests/deploys/gateway.py", "-y",
                               "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
        try:
            results = json.loads(done.stdout)
        except ValueError:
            results = None
        return done, results

    def roll(self, ports: tuple[int, ...], flags: str | dict[int, str], roll: bool = True,
             dry: bool = False, **settings) -> tuple[subprocess.CompletedProcess, dict | None]:
        """The roll deploy (tests/deploys/gateway_roll.py): a stand-in replica per port of
        PORTS, each a unit of its own in the servers' container running with FLAGS (or its
        port's in FLAGS), behind the
        gateway with SETTINGS over the module's; ROLL false: restarted at once (no roll); DRY:
        its plan only (``--dry``)."""
        names = [f"@lxc/standin-roll-{p}" for p in ports]
        gateway = {**self.gateway.host_data(), "settings": {**SETTINGS, **settings},
                   "gateway_worker_list": [{"name": n, "url": self.url(p), "has_key": True}
                                           for n, p in zip(names, ports)],
                   "check_timeout_s": CHECK_TIMEOUT_S, "worker_keys": [KEY] * len(ports)}
        by_port = flags if isinstance(flags, dict) else dict.fromkeys(ports, flags)
        replicas = [(n, {**self.servers.host_data(), "port": p, "flags": by_port[p], "key": KEY,
                         "roll": roll}) for n, p in zip(names, ports)]
        inventory = self.folder / "roll_inventory.py"
        inventory.write_text(f"gateways = [({self.gateway.inventory_name!r}, {gateway!r})]\n"
                             f"replicas = {replicas!r}\n")
        done = subprocess.run([str(PYINFRA), str(inventory), "tests/deploys/gateway_roll.py",
                               "--dry" if dry else "-y", "--json"], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        try:
            return done, json.loads(done.stdout)
        except ValueError:
            return done, None

    def load(self, until: str, concurrency: int = 4, whole_every: int = 3) -> subprocess.Popen:
        """A client sending requests through the gateway until the file UNTIL exists in its
        container: streamed, and every WHOLE_EVERY-th one asked whole (not streamed)."""
        self.gateway.attach(f"rm -f {until}")
        return subprocess.Popen(
            ["lxc-attach", "-P", str(self.gateway.lxc_path), "-n", self.gateway.name,
             "--clear-env", "-v", f"API_KEY={KEY}", "--", "python3", CLIENT, "requests", "--url",
             f"http://127.0.0.1:{GATEWAY_PORT}", "--until", until, "--concurrency",
             str(concurrency), "--tokens", "24", "--whole-every", str(whole_every)],
            stdout=subprocess.PIPE, text=True)

    def client(self, *args: str, key: str | None = KEY) -> dict:
        done = self.gateway.attach((f"API_KEY={key} " if key else "") + f"python3 {CLIENT} "
                                   + " ".join(args), timeout=300)
        return json.loads(done.stdout)

    def counts(self, ports) -> dict[int, int]:
        found = self.client("counts", *(self.url(p) for p in ports))
        return {p: found[self.url(p)] for p in ports}

    def gateway_listing(self) -> list[dict]:
        status = self.gateway.attach(SCRIPT.replace(" --gateway", " status --gateway", 1),
                                     check=False).stdout
        return json.loads(status).get("workers") or [] if status.strip() else []

    def gateway_pid(self) -> str:
        return self.gateway.attach("systemctl show -p MainPID --value smg.service").stdout.strip()


#: smg's worker API asked by hand (METHOD PATH [BODY]) in its container, with the gateway's key
#: from its env file.
SMG_CALL = f"""
import sys, urllib.request
method, path, body = sys.argv[1], sys.argv[2], sys.argv[3]
key = open("/etc/smg/smg.env").read().split('SGLANG_API_KEY="')[1].split('"')[0]
request = urllib.request.Request("http://127.0.0.1:{GATEWAY_PORT}" + path, method=method,
                                 data=body.encode() or None, headers={{
                                     "Authorization": "Bearer " + key,
                                     "Content-Type": "application/json"}})
print(urllib.request.urlopen(request, timeout=10).read().decode())
"""




@pytest.fixture(scope="module")
def site(lxc_env, package_index, tmp_path_factory):
    began = time.monotonic()
    wheels = locked_wheels(smg_lock_path("1.13.0", "3.11"))
    servers = lxc_env.create(lxc_env.new_name("gwsrv"), network="bridge")
    gateway = lxc_env.create(lxc_env.new_name("gw"), network="bridge", extra_config=[
        f"lxc.mount.entry = {wheels} opt/wheels none bind,ro,create=dir 0 0"])
    s = Site(gateway, servers, tmp_path_factory.mktemp("gateway"))
    put(servers, f"{STANDIN}/standin_sglang.py", (REPO / "tests/standin_sglang.py").read_text())
    put(servers, f"{STANDIN}/logs/startup_tp8.log", (LOGS / "startup_tp8.log").read_text())
    put(gateway, CLIENT, (REPO / "tests/gateway_client.py").read_text())
    for port in PORTS:
        s.start_standin(port)
    TIMES["containers and stand-ins"] = time.monotonic() - began
    yield s
    print(f"\ngateway LXC module: {json.dumps({k: round(v, 1) for k, v in TIMES.items()})}")
    gateway.destroy()
    servers.destroy()


@pytest.fixture(scope="module")
def first(site):
    began = time.monotonic()
    done, results = site.deploy(PORTS[:2])
    TIMES["first deploy"] = time.monotonic() - began
    return done, results


def test_first_deploy_installs_smg_and_registers_its_workers(site, first):
    done, results = first
    assert done.returncode == 0 and results and not failed(results), done.stderr[-5000:]
    names = " | ".join(changed(results))
    for step in ("smg 1.13.0 as locked", "Gateway environment", "Unit /etc/systemd/system/smg"):
        assert step in names, names
    for port in PORTS[:2]:
        assert f"{site.url(port)}: healthy" in done.stderr, done.stderr[-4000:]
    assert "chat completion" in done.stderr
    listed = {w["url"]: w["is_healthy"] for w in site.gateway_listing()}
    assert listed == {site.url(p): True for p in PORTS[:2]}
    # The key: in the 0600 env file only, in no process's argv, not in the journal.
    assert site.gateway.attach("stat -c '%a' /etc/smg/smg.env /etc/smg/smg-workers.env"
                               ).stdout.split() == ["600", "600"]
    seen = site.gateway.attach("cat /proc/[0-9]*/cmdline | tr '\\0' ' '; journalctl -u smg "
                               "--no-pager; cat /etc/systemd/system/smg.service "
                               "/opt/smg/smg-workers.json", check=False).stdout
    assert KEY not in seen
    assert KEY not in done.stdout + done.stderr


def test_rerun_changes_nothing(site, first):
    done, results = site.deploy(PORTS[:2])
    assert done.returncode == 0 and results, done.stderr[-4000:]
    assert changed(results) == [] and failed(results) == []


def test_requests_spread_over_the_workers(site, first):
    before = site.counts(PORTS[:2])
    answer = site.client("requests", "--url", f"http://127.0.0.1:{GATEWAY_PORT}", "--count", "40",
                         "--concurrency", "8")
    after = site.counts(PORTS[:2])
    assert answer["codes"] == {"200": 40}, answer["codes"]
    got = {p: after[p] - before[p] for p in PORTS[:2]}
    assert sum(got.values()) == 40 and all(n > 0 for n in got.values()), got


def test_a_shared_prefix_sticks_to_one_worker_under_cache_aware(site, first):
    before = site.counts(PORTS[:2])
    answer = site.client("requests", "--url", f"http://127.0.0.1:{GATEWAY_PORT}", "--count", "12",
                         "--prefix-words", "240")
    after = site.counts(PORTS[:2])
    assert answer["codes"] == {"200": 12}, answer["codes"]
    got = sorted(after[p] - before[p] for p in PORTS[:2])
    assert got == [0, 12], got


def test_a_worker_added_is_registered_without_a_restart(site, first):
    gateway_pid = site.gateway_pid()
    servers = {p: site.standin_pid(p) for p in PORTS}
    done, results = site.deploy(PORTS)
    assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
    names = changed(results)
    assert any("Worker list" in n for n in names) and any("lists its 3 workers" in n
                                                          for n in names), names
    assert not any("enabled and running" in n for n in names), names
    assert site.gateway_pid() == gateway_pid
    assert {p: site.standin_pid(p) for p in PORTS} == servers
    assert {w["url"] for w in site.gateway_listing()} == {site.url(p) for p in PORTS}


def test_a_killed_worker_is_marked_while_requests_are_served_and_the_deploy_names_it(site, first):
    load = subprocess.Popen(
        ["lxc-attach", "-P", str(site.gateway.lxc_path), "-n", site.gateway.name, "--clear-env",
         "-v", f"API_KEY={KEY}", "--", "python3", CLIENT, "requests", "--url",
         f"http://127.0.0.1:{GATEWAY_PORT}", "--seconds", "8", "--concurrency", "4"],
        stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    killed = time.time()
    site.servers.attach(f"systemctl kill -s KILL standin-{PORTS[2]}")
    marked = None
    while time.time() - killed < 20:
        listed = {w["url"]: w["is_healthy"] for w in site.gateway_listing()}
        if listed.get(site.url(PORTS[2])) is False or site.url(PORTS[2]) not in listed:
            marked = time.time()
            break
        time.sleep(0.1)
    output, _ = load.communicate(timeout=60)
    assert marked is not None, "the gateway still routes to the killed worker after 20 s"
    TIMES["death to unhealthy (s)"] = marked - killed
    requests = json.loads(output)["requests"]
    after = [status for start, _, status, _ in requests if start > marked + 0.5]
    assert after and set(after) == {"200"}, json.loads(output)["codes"]
    done, results = site.deploy(PORTS)
    assert done.returncode != 0
    assert f"{site.url(PORTS[2])}) is unhealthy in the gateway" in done.stderr, done.stderr[-4000:]
    assert f"{site.url(PORTS[0])}: healthy" in done.stderr


def test_a_worker_dropped_from_the_inventory_is_removed_and_then_nothing_changes(site, first):
    gateway_pid = site.gateway_pid()
    done, results = site.deploy(PORTS[:2])
    assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
    assert {w["url"] for w in site.gateway_listing()} == {site.url(p) for p in PORTS[:2]}
    assert site.gateway_pid() == gateway_pid
    done, results = site.deploy(PORTS[:2])
    assert done.returncode == 0 and results and changed(results) == [], done.stderr[-4000:]


def test_workers_failing_or_hanging_on_every_generation_are_named_though_listed_healthy(site, first):
    """One worker answers /health but 500 to every generation, one stalls after its headers:
    smg lists both healthy (it retries the 500 elsewhere; the hang only times out), and the
    deploy names each. One of them was registered by someone else, before the inventory named
    it: when the inventory drops both, the deploy removes only its own (the other one's 500s
    smg retries on another worker: the chat completion through the gateway still passes)."""
    site.start_standin(FAILING, case="fail-generation")
    site.start_standin(HANGING, case="headers-then-silence")
    try:
        other = site.smg("POST", "/workers", {"url": site.url(FAILING), "api_key": KEY})
        assert other.get("worker_id"), other
        site.wait_listed({PORTS[0]: True, PORTS[1]: True, FAILING: True})
        done, results = site.deploy((*PORTS[:2], FAILING, HANGING))
        assert done.returncode != 0, done.stderr[-4000:]
        assert (f"@lxc/standin-{FAILING} ({site.url(FAILING)}) fails a generation asked as the "
                "gateway asks it: HTTP 500") in done.stderr, done.stderr[-4000:]
        assert (f"@lxc/standin-{HANGING} ({site.url(HANGING)}) fails a generation asked as the "
                f"gateway asks it: HTTP 200, then nothing for {CHECK_TIMEOUT_S}s after its "
                "headers") in done.stderr, done.stderr[-4000:]
        assert f"{site.url(PORTS[0])}: healthy" in done.stderr
        # What smg says of them: healthy.
        listed = {w["url"]: w["is_healthy"] for w in site.gateway_listing()}
        assert listed[site.url(FAILING)] is True and listed[site.url(HANGING)] is True, listed
        done, results = site.deploy(PORTS[:2])
        assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
        assert {w["url"] for w in site.gateway_listing()} == {
            site.url(PORTS[0]), site.url(PORTS[1]), site.url(FAILING)}
    finally:
        for worker in site.smg("GET", "/workers")["workers"]:
            if worker["url"] in (site.url(FAILING), site.url(HANGING)):
                site.smg("DELETE", f"/workers/{worker['id']}")
        site.wait_listed({PORTS[0]: True, PORTS[1]: True})
        site.stop_standin(FAILING)
        site.stop_standin(HANGING)


def test_a_worker_down_when_registered_is_not_up_then_reported_and_removed_once_dropped(site, first):
    """smg holds the registration of a worker whose server is down (pending): the deploy says
    so, naming it; a second sync meets smg's 409 in progress and says the same; dropped from the
    inventory meanwhile, it is reported while smg may still add it, and removed once it did."""
    done, results = site.deploy((*PORTS[:2], DOWN))
    assert done.returncode != 0
    assert (f"worker @lxc/standin-{DOWN} ({site.url(DOWN)}) is not up: the gateway holds its "
            "registration (pending)") in done.stderr, done.stderr[-4000:]
    assert {w["url"] for w in site.gateway_listing()} == {site.url(p) for p in PORTS[:2]}
    code, result = site.script("sync", "--timeout", "2")
    assert code == 4 and "error" not in result, result
    assert result["not_up"] == [{"name": f"@lxc/standin-{DOWN}", "url": site.url(DOWN),
                                 "pending": True}] and result["listed"] == 2, result
    # The sync runs (the keys file changed with the list) and says so; the next run, with
    # nothing to sync, says it in its check.
    for _ in range(2):
        done, results = site.deploy(PORTS[:2])
        assert done.returncode != 0
        assert (f"{site.url(DOWN)} is no longer a worker of this gateway, but the gateway still "
                "holds the registration") in done.stderr, done.stderr[-4000:]
    assert "gateway worker " + site.url(DOWN) + ": no longer a worker, registration pending" in (
        done.stderr), done.stderr[-4000:]
    site.start_standin(DOWN)
    try:
        site.wait_listed({PORTS[0]: True, PORTS[1]: True, DOWN: True})  # smg added it: it serves
        done, results = site.deploy(PORTS[:2])
        assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
        assert {w["url"] for w in site.gateway_listing()} == {site.url(p) for p in PORTS[:2]}
    finally:
        site.stop_standin(DOWN)


def test_a_rotated_worker_key_is_registered_again_without_a_restart(site, first):
    """Without a gateway key (smg then sends each worker its own: ``key_problem``), the server of
    one worker restarts with a new key, and the inventory says so: the deploy registers that
    worker again with the new key, and requests through the gateway reach it again. Before, the
    gateway kept the old key: the worker answered 401 to every request routed to it, and no run
    mended it."""
    done, results = site.deploy(PORTS[:2], gateway_api_key=None)
    assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
    rotated = "sk-gateway-rotated-Q8"
    site.servers.attach(f"systemctl stop standin-{PORTS[0]}")
    site.start_standin(PORTS[0], rotated)
    gateway_pid, other = site.gateway_pid(), site.standin_pid(PORTS[1])
    done, results = site.deploy(PORTS[:2], {PORTS[0]: rotated}, gateway_api_key=None)
    assert done.returncode == 0 and results and not failed(results), done.stderr[-4000:]
    names = changed(results)
    assert any("Workers' keys" in n for n in names) and any("lists its 2 workers" in n
                                                            for n in names), names
    assert site.gateway_pid() == gateway_pid and site.standin_pid(PORTS[1]) == other
    assert rotated not in done.stdout + done.stderr
    deadline = time.monotonic() + 20
    while {w["url"]: w["is_healthy"] for w in site.gateway_listing()} != {
            site.url(p): True for p in PORTS[:2]}:
        assert time.monotonic() < deadline, site.gateway_listing()
        time.sleep(0.2)
    # Whatever the policy would choose, the rotated worker is the only one serving: the other
    # stopped and marked, every request reaches it. With its old key (the bug) it answers 401.
    site.stop_standin(PORTS[1])
    site.wait_listed({PORTS[0]: True, PORTS[1]: False})
    before = site.counts(PORTS[:1])
    answer = site.client("requests", "--url", f"http://127.0.0.1:{GATEWAY_PORT}", "--count",
                         "12", "--concurrency", "4", key=None)
    after = site.counts(PORTS[:1])
    assert answer["codes"] == {"200": 12}, answer["codes"]
    assert after[PORTS[0]] - before[PORTS[0]] == 12, (before, after)
    site.start_standin(PORTS[1])
    site.wait_listed({PORTS[0]: True, PORTS[1]: True})
    done, results = site.deploy(PORTS[:2], {PORTS[0]: rotated}, gateway_api_key=None)
    assert done.returncode == 0 and results and changed(results) == [], done.stderr[-4000:]


ROLL_PORTS = (31007, 31008, 31009)


def unit_pid(site: Site, port: int) -> str:
    return site.servers.attach(
        f"systemctl show -p MainPID --value standin-roll-{port}.service").stdout.strip()


def test_a_change_rolls_over_the_replicas_and_no_request_fails(site, first):
    """Three replicas behind the real smg, each a real unit; a flag of theirs changes: each is
    taken out of the gateway's rotation, drained, restarted, its start followed, asked a
    generation as the gateway asks it, and given back before the next, in the inventory's
    order. A client streaming through the gateway the whole time sees no failed request (a
    stream without its last event fails). Restarted at once, as without the roll, the same
    change cuts requests (``bench/gateway_roll.py`` measures it)."""
    done, results = site.roll(ROLL_PORTS, "--token-delay 0.005")
    assert done.returncode == 0 and results and not failed(results), done.stderr[-5000:]
    site.wait_listed({p: True for p in ROLL_PORTS})
    before = {p: unit_pid(site, p) for p in ROLL_PORTS}
    # The plan (--dry): the order, and each replica's step; nothing restarts.
    done, _ = site.roll(ROLL_PORTS, "--token-delay 0.006", dry=True)
    assert done.returncode == 0, done.stderr[-5000:]
    order = ("a restart rolls over its 3 replicas, 1 at a time, in this order: "
             + "; ".join(f"{n}. @lxc/standin-roll-{p}" for n, p in enumerate(ROLL_PORTS, 1)))
    assert order in done.stderr, done.stderr[-5000:]
    for p in ROLL_PORTS:
        assert (f"@lxc/standin-roll-{p}: standin-roll-{p}.service restarts in turn behind "
                f"{site.gateway.inventory_name}: out of its rotation") in done.stderr
    assert {p: unit_pid(site, p) for p in ROLL_PORTS} == before
    # A run killed between a turn's out and its in left the last replica out of the rotation:
    # the roll gives it back before its first turn (no turn counts without it).
    code, out = site.script("out", "--worker", f"@lxc/standin-roll-{ROLL_PORTS[2]}",
                            "--drain", "5")
    assert code == 0 and out["was_listed"], out
    site.wait_listed({p: True for p in ROLL_PORTS[:2]})
    until = "/run/roll-done"
    load = site.load(until)
    try:
        site.client("requests", "--url", f"http://127.0.0.1:{GATEWAY_PORT}", "--count", "4")
        began = time.time()
        done, results = site.roll(ROLL_PORTS, "--token-delay 0.006")
        ended = time.time()
    finally:
        site.gateway.attach(f"touch {until}")
        output, _ = load.communicate(timeout=120)
    TIMES["roll of 3 replicas"] = ended - began
    assert done.returncode == 0 and results and not failed(results), done.stderr[-6000:]
    requests = json.loads(output)["requests"]
    during = [(status, kind) for start, _, status, kind in requests if began <= start <= ended]
    assert {status for status, _ in during} == {"200"}, json.loads(output)["by_kind"]
    assert {kind for _, kind in during} == {"stream", "whole"}, during
    assert json.loads(output)["codes"] == {"200": len(requests)}, json.loads(output)["by_kind"]
    # Each restarted, in its turn, in the inventory's order, and given back.
    assert all(unit_pid(site, p) != before[p] for p in ROLL_PORTS), before
    assert order in done.stderr, done.stderr[-6000:]
    assert ("given back first, left out of its rotation by an earlier run: "
            f"{site.url(ROLL_PORTS[2])}") in done.stderr, done.stderr[-6000:]
    lines = [done.stderr.index(f"@lxc/standin-roll-{p}: drained in") for p in ROLL_PORTS]
    assert lines == sorted(lines), done.stderr[-6000:]
    for p in ROLL_PORTS:
        assert (f"@lxc/standin-roll-{p}: drained in") in done.stderr
    assert done.stderr.count("serving, given back (listed healthy in") == 3, done.stderr[-6000:]
    assert {w["url"]: w["is_healthy"] for w in site.gateway_listing()} == {
        site.url(p): True for p in ROLL_PORTS}


def test_a_replica_failing_its_judgement_stops_the_roll_naming_it_and_the_one_before_goes_back(
        site, first):
    """The change makes the second replica fail each generation (HTTP 500; /health still 200):
    the first is changed in its turn and serves; the second restarts, fails the generation asked
    as the gateway asks it, and the roll stops there, naming it; the third is not restarted and
    keeps serving what it ran. With ``gateway_roll_failure: back`` the first goes back to what
    it ran before, in its turn (out, back, judged, given back), so that the group serves one
    set. The next run with a good change rolls over all three."""
    done, results = site.roll(ROLL_PORTS, "--token-delay 0.005")
    assert done.returncode == 0 and results and not failed(results), done.stderr[-5000:]
    site.wait_listed({p: True for p in ROLL_PORTS})
    before = {p: unit_pid(site, p) for p in ROLL_PORTS}
    first_name, stopper, last = (f"@lxc/standin-roll-{p}" for p in ROLL_PORTS)
    change = {ROLL_PORTS[0]: "--token-delay 0.004",
              ROLL_PORTS[1]: "--token-delay 0.004 --case fail-generation",
              ROLL_PORTS[2]: "--token-delay 0.004"}
    done, results = site.roll(ROLL_PORTS, change, gateway_roll_failure="back")
    assert done.returncode != 0
    assert f"{first_name}: drained in" in done.stderr, done.stderr[-6000:]
    assert (f"{stopper}: drained in" in done.stderr and "failed its judgement: a generation asked "
            "as the gateway asks it: HTTP 500" in done.stderr), done.stderr[-6000:]
    assert (f"{last}: drain -, restart -, not restarted: the roll stopped at {stopper}"
            in done.stderr), done.stderr[-6000:]
    # The first went back, in its turn: drained again, restarted on its flags before.
    assert (f"{first_name}: drained in" in done.stderr.split("not restarted")[-1]
            and "back on its flags before (--token-delay 0.005) (the roll stopped at "
            f"{stopper}), serving, given back" in done.stderr), done.stderr[-6000:]
    assert f"{stopper}: stays out of {site.gateway.inventory_name}'s rotation" in done.stderr
    flags = site.servers.attach(f"tr '\\0' ' ' < /proc/{unit_pid(site, ROLL_PORTS[0])}/cmdline").stdout
    assert flags.rstrip().endswith("--token-delay 0.005"), flags
    assert unit_pid(site, ROLL_PORTS[0]) != before[ROLL_PORTS[0]]
    assert unit_pid(site, ROLL_PORTS[1]) != before[ROLL_PORTS[1]]
    assert unit_pid(site, ROLL_PORTS[2]) == before[ROLL_PORTS[2]]
    # The gateway phase gave the failed one back (its verify phase, in a real deploy, rolls
    # it back first) and names it failing.
    assert f"{stopper} ({site.url(ROLL_PORTS[1])}) fails a generation" in done.stderr
    done, results = site.roll(ROLL_PORTS, "--token-delay 0.005")
    assert done.returncode == 0 and results and not failed(results), done.stderr[-6000:]
    assert done.stderr.count("serving, given back (listed healthy in") >= 2, done.stderr[-6000:]
