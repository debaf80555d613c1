"""What a roll saves (issue 51): replicas behind the real smg restarted by a change one at a
time (out of the rotation, drained, restarted, judged, given back) against today's restart of
them all at once, with a client streaming through the gateway the whole time.

    .venv/bin/python bench/gateway_roll.py [--replicas 3] [--pause-scale 0.2] [--rounds 2]
                                           [--concurrency 4] [--before-s 15]

Needs root and lxc (``make system-deps``), smg's locked wheels (tests/wheels.py's cache or the
package index); run it under the LXC tests' lock (``flock /tmp/lxc-tests.lock``). The gateway
LXC tests' two containers (``tests/lxc/test_gateway_lxc.py``'s ``Site``): real smg 1.13.0 from its
hashed lock in one, REPLICAS stand-in SGLang servers in the other, each under a real systemd
unit of its own, deployed by ``tests/deploys/gateway_roll.py`` through the pyinfra CLI (the
server's own restart operation, in its turn or not). PAUSE_SCALE stretches the stand-in's start
(its recorded 8-GPU log; 0.2: a few seconds, as a model's load is minutes).

Each round: BEFORE_S seconds of load alone (p99 of its requests' latency), then a change of a
flag of every replica (its ``--token-delay``) deployed with the roll, then the same with
``roll`` off (the restart as without a gateway: all at once); the client sends CONCURRENCY
``/generate`` back to back (streamed, every third asked whole, not streamed) through the gateway from before the deploy until the
gateway serves again after it (every replica listed healthy and 4 requests through it answered
whole: ``until_serving_s``); the requests begun in that window are counted.
A request fails when it did not end with its stream's last event, or its whole answer is not
whole (``cut``, an HTTP error, no answer). Results: bench/results/gateway_roll.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "lxc"))  # test_*.py: tests/lxc/

from devtools import lxc_env  # noqa: E402
from pve_sglang.config.gateway import smg_lock_path  # noqa: E402
from test_gateway_lxc import CLIENT, GATEWAY_PORT, LOGS, STANDIN, Site, put  # noqa: E402
from wheels import locked_wheels  # noqa: E402

RESULTS = REPO / "bench" / "results" / "gateway_roll.json"
BASE_PORT = 31100
UNTIL = "/run/roll-bench-done"


def p99(values: list[float]) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def summary(requests: list, began: float, ended: float) -> dict:
    """The requests started between BEGAN and ENDED: how many, failed, p99 latency of those
    served."""
    within = [(s, e, status, kind) for s, e, status, kind in requests if began <= s <= ended]
    served = [e - s for s, e, status, _ in within if status == "200"]
    failed: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for _, _, status, kind in within:
        kinds[kind] = kinds.get(kind, 0) + 1
        if status != "200":
            failed[f"{kind} {status}"] = failed.get(f"{kind} {status}", 0) + 1
    return {"requests": len(within), "by_kind": kinds, "failed": sum(failed.values()),
            "failed_by": failed, "p99_s": round(p99(served), 3) if served else None}


def loaded(site: Site, concurrency: int, action) -> tuple[list, float, float, object]:
    """ACTION run under the client's load: its requests, when ACTION began and ended, what it
    returned."""
    load = site.load(UNTIL, concurrency)
    time.sleep(2)  # the client's threads are sending
    began = time.time()
    try:
        result = action()
    finally:
        ended = time.time()
        time.sleep(1)
        site.gateway.attach(f"touch {UNTIL}")
        output, _ = load.communicate(timeout=300)
    return json.loads(output)["requests"], began, ended, result


def serving(site: Site, ports: tuple[int, ...], seconds: float = 600) -> None:
    """Until the gateway lists every replica healthy and serves: 4 requests through it all
    answered whole (after a restart of all at once smg lists them healthy again before it
    sends them requests again: its circuit breakers answer 503 meanwhile)."""
    deadline = time.monotonic() + seconds
    site.wait_listed({p: True for p in ports}, seconds=seconds)
    while site.client("requests", "--url", f"http://127.0.0.1:{GATEWAY_PORT}", "--count", "4",
                      "--concurrency", "4")["codes"] != {"200": 4}:
        assert time.monotonic() < deadline, "the gateway does not serve again"
        time.sleep(0.5)


def changed(site: Site, ports: tuple[int, ...], flags: str, how: str):
    """The change deployed (``roll`` or all at once), then until the gateway serves through
    every replica again (``serving``): the window a client lives through."""
    done, _ = site.roll(ports, flags, roll=how == "roll")
    serving(site, ports)
    return done


def turn_lines(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines()
            if ": drained in " in line or "not restarted" in line or "failed its judgement" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--pause-scale", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--before-s", type=float, default=15.0)
    args = parser.parse_args()
    ports = tuple(BASE_PORT + i for i in range(args.replicas))
    env = lxc_env.LxcEnv()
    rows = []
    try:
        wheels = locked_wheels(smg_lock_path("1.13.0", "3.11"))
        servers = env.create(env.new_name("rbsrv"), network="bridge")
        gateway = env.create(env.new_name("rbgw"), network="bridge", extra_config=[
            f"lxc.mount.entry = {wheels} opt/wheels none bind,ro,create=dir 0 0"])
        site = Site(gateway, servers, Path(tempfile.mkdtemp(prefix="pvs-roll-bench-",
                                                            dir="/var/tmp")))
        put(servers, f"{STANDIN}/standin_sglang.py", (REPO / "tests/standin_sglang.py").read_text())
        put(servers, f"{STANDIN}/logs/startup_tp8.log", (LOGS / "startup_tp8.log").read_text())
        put(gateway, CLIENT, (REPO / "tests/gateway_client.py").read_text())
        flags = lambda delay: f"--pause-scale {args.pause_scale} --token-delay {delay}"  # noqa: E731
        delay = 0.005
        done, _ = site.roll(ports, flags(delay))
        assert done.returncode == 0, done.stderr[-4000:]
        for round_ in range(1, args.rounds + 1):
            for how in ("roll", "all at once"):
                serving(site, ports)
                requests, began, ended, _ = loaded(
                    site, args.concurrency, lambda: time.sleep(args.before_s))
                before = summary(requests, began, ended)
                delay = round(delay + 0.001, 3)
                requests, began, ended, done = loaded(
                    site, args.concurrency, lambda delay=delay, how=how: changed(site, ports, flags(delay), how))
                during = summary(requests, began, ended)
                row = {"round": round_, "restart": how, "until_serving_s": round(ended - began, 1),
                       "deploy_rc": done.returncode, "before": before, "during": during,
                       "p99_ratio": (round(during["p99_s"] / before["p99_s"], 2)
                                     if during["p99_s"] and before["p99_s"] else None),
                       "turns": turn_lines(done.stderr),
                       "deploy_errors": [line.strip()[:300] for line in done.stderr.splitlines()
                                         if "Error" in line or "unhealthy" in line][:6]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        env.close()
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                         capture_output=True, text=True).stdout.strip(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}",
            "smg": "1.13.0", "replicas": args.replicas, "pause_scale": args.pause_scale,
            "concurrency": args.concurrency, "before_s": args.before_s,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"written {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
