"""How long the server does not answer during an upgrade (issue 22): a good upgrade (the new
stack built beside, one switch, one restart), a failed one (rolled back), and the old way (stop,
reinstall in place, start); and a release that crashes after it was judged good (issue 34),
without and with ``upgrade_probation_s`` (systemd switches back by itself: the unit's
``OnFailure=``), with no deploy run for ``--window-s`` after its deploy.

    .venv/bin/python bench/upgrade_downtime.py [--pause-scale 1.0]

Needs root and lxc (``make system-deps``) and the sglang wheels of tests/wheels.py's cache (or
the package index). One container of ``devtools/upgrade_site.py``: real venvs of real sglang
wheels (no dependencies), the stand-in server under the deploy's own unit, the test deploy
``tests/deploys/upgrade.py`` through the pyinfra CLI. A client inside the container polls
``/health`` every 100 ms for the whole run; the downtime is the time between the last 200
before a non-200 answer and the next 200 (the longest such gap of the run; every gap listed).

The stand-in's start (about 25 s with ``--pause-scale 1``, 3 s with 0.1) stands for the model's
load, which a real server spends in any of the three; what differs is what comes before it.
The old way's install here is sglang alone; with the real locked set, a reinstall in place
takes what bench/results/stack_store*.json measured (added in the printed table). The result
goes to bench/results/upgrade_downtime.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from devtools import lxc_env  # noqa: E402
from devtools.upgrade_site import API_KEY, PORT, VENV, Site, make_site, stack_of  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402

RESULT = REPO / "bench" / "results" / "upgrade_downtime.json"
POLLER = "/opt/standin/poll.py"
POLL_LOG = "/run/poll.log"
#: A client polling /health every 100 ms, one line per answer: time and status.
POLL_SCRIPT = f"""
import time, urllib.request
while True:
    request = urllib.request.Request("http://127.0.0.1:{PORT}/health",
                                     headers={{"Authorization": "Bearer {API_KEY}"}})
    try:
        status = urllib.request.urlopen(request, timeout=0.5).status
    except Exception as error:
        status = getattr(error, "code", 0)
    with open("{POLL_LOG}", "a") as log:
        log.write(f"{{time.time():.3f}} {{status}}\\n")
    time.sleep(0.1)
"""


def gaps(lines: list[str], start: float) -> list[float]:
    """Each span without a 200, from the last 200 before it (or START, the case's start, when
    the first answers are not 200) to the first 200 after it; a span still open at the last
    answer ends there (``down_at_end``)."""
    found, last_ok, down = [], start, False
    for line in lines:
        when, status = line.split()
        if status == "200":
            if down and last_ok is not None:
                found.append(float(when) - last_ok)
            last_ok, down = float(when), False
        else:
            down = True
    if down and lines:
        found.append(float(lines[-1].split()[0]) - last_ok)
    return found


def down_at_end(lines: list[str]) -> bool:
    return bool(lines) and lines[-1].split()[1] != "200"


def measured(site: Site, what: str, action) -> dict:
    site.sh(f": > {POLL_LOG}")
    # The container's clock is this machine's (a container shares the kernel).
    start, started = time.time(), time.monotonic()
    ok = action()
    wall = time.monotonic() - started
    time.sleep(1)
    lines = site.sh(f"cat {POLL_LOG}").splitlines()
    spans = gaps(lines, start)
    statuses: dict[str, int] = {}
    for line in lines:
        statuses[line.split()[1]] = statuses.get(line.split()[1], 0) + 1
    row = {"case": what, "downtime_s": round(max(spans, default=0.0), 2),
           "gaps_s": [round(g, 2) for g in spans], "deploy_s": round(wall, 1), "ok": ok,
           "polls": statuses, "down_at_end": down_at_end(lines)}
    if not lines:
        raise SystemExit(f"{what}: the poller wrote nothing: {site.sh('systemctl status pvs-poll', check=False)}")
    still = " and still down: until the next deploy run" if row["down_at_end"] else ""
    print(f"{what:<40} down {row['downtime_s']:>6.2f}s{still}  (run {wall:.1f}s, gaps "
          f"{row['gaps_s']}, answers {statuses})", flush=True)
    return row


def old_way(site: Site, release: str) -> bool:
    """What a reinstall in place costs the server: stop, install into the serving venv, start,
    until /health answers."""
    site.sh("systemctl stop sglang.service")
    site.sh(f"/opt/sglang/tools/bin/uv pip install --python {VENV}/bin/python --no-index "
            f"--find-links /opt/wheelhouse --no-deps --reinstall sglang=={release}")
    site.sh("systemctl start sglang.service")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and site.health() != "200":
        time.sleep(0.1)
    return site.health() == "200"


def crash_after_ready(site: Site, probation_s: int, back: str, window_s: float) -> bool:
    """A release that is judged good, then crashes 6 s after it is ready, each restart the
    same (``crash-after-ready``): its deploy run, then no run for WINDOW_S (or until BACK, the
    previous release, serves again and has for 5 s). PROBATION_S 0 is the time before
    ``upgrade_probation_s``: the trial ended at the verdict, nothing switches back."""
    done = site.deploy("0.5.7", "--data", "retry_failed_stack=true", "--data",
                       f"upgrade_probation_s={probation_s}")
    if done.returncode != 0:
        raise SystemExit(f"the crash-after-ready deploy failed: {done.log[-3000:]}")
    deadline, served = time.monotonic() + window_s, None
    while time.monotonic() < deadline:
        if site.link().endswith(stack_of(back)) and site.serves() == back:
            served = served or time.monotonic()
            if time.monotonic() - served >= 5:
                return True
        time.sleep(0.5)
    return served is not None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pause-scale", type=float, default=1.0)
    parser.add_argument("--window-s", type=float, default=240.0,
                        help="how long a crash-after-ready case waits without a deploy run")
    args = parser.parse_args()
    import wheels

    env = lxc_env.LxcEnv()
    rows = []
    root = Path(tempfile.mkdtemp(prefix="pvs-upgrade-bench-site-", dir="/var/tmp"))
    try:
        site = make_site(env, root, [wheels.wheel(r) for r in ("0.5.7", "0.5.8", "0.5.9")],
                         wheels.project_wheel("uv", load_defaults()["uv_version"]),
                         pause_scale=args.pause_scale)
        site.cases(**{"0_5_7": "crash-load"})
        assert site.deploy("0.5.8").returncode == 0
        site.put(POLLER, POLL_SCRIPT)
        site.sh(f"systemd-run --unit pvs-poll -p Restart=always /usr/bin/python3 {POLLER}")
        rows.append(measured(site, "good upgrade 0.5.8 -> 0.5.9 (switch)",
                             lambda: site.deploy("0.5.9").returncode == 0))
        rows.append(measured(site, "failed upgrade 0.5.9 -> 0.5.7 (rollback)",
                             lambda: site.deploy("0.5.7").returncode != 0
                             and site.link().endswith(stack_of("0.5.9"))))
        rows.append(measured(site, "old way: stop, reinstall 0.5.8, start",
                             lambda: old_way(site, "0.5.8")))
        # A release that crashes after it was judged good (issue 34): before, the trial ended
        # at the verdict and the model stayed down once the start limit stopped the unit; now
        # it stays on trial (upgrade_probation_s) and the unit's OnFailure= switches back.
        assert site.deploy("0.5.9").returncode == 0
        site.cases(**{"0_5_7": "crash-after-ready"})
        rows.append(measured(site, "crash after ready 0.5.9 -> 0.5.7, no probation (before)",
                             lambda: not crash_after_ready(site, 0, "0.5.9", args.window_s)))
        assert site.deploy("0.5.9").returncode == 0
        rows.append(measured(site, "crash after ready 0.5.9 -> 0.5.7, probation (OnFailure)",
                             lambda: crash_after_ready(site, 600, "0.5.9", args.window_s)))
    finally:
        env.close()
        shutil.rmtree(root, ignore_errors=True)
    stores = {}
    for name in ("stack_store.json", "stack_store_whole_venv.json"):
        path = REPO / "bench" / "results" / name
        if path.exists():
            recorded = json.loads(path.read_text())
            stores[name] = {row["step"]: row["install_s"] for row in recorded["rows"]}
    whole = stores.get("stack_store_whole_venv.json", {}).get("second container, same host")
    if whole:
        print(f"old way with the real locked set: + {whole:.1f}s of `uv pip sync` of the whole "
              "set from the host's store (bench/results/stack_store_whole_venv.json)")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                         capture_output=True, text=True).stdout.strip(),
            "machine": f"{platform.machine()}, Linux {platform.release()}",
            "pause_scale": args.pause_scale, "poll_ms": 100,
            "recorded_real_set_install_s": stores}
    RESULT.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"written {RESULT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
