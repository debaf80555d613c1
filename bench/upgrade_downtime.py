"""How long the server does not answer during an upgrade (issue 22): a good upgrade (the new
stack built beside, one switch, one restart), a failed one (rolled back), and the old way (stop,
reinstall in place, start); and a release that crashes after it was judged good (issues 34,
47), after its window (``upgrade_probation_s`` 0: its crash loop started again after each
start limit) and within it (the unit's ``ExecStopPost=`` switches back at its first crash),
with no deploy run for ``--window-s`` after its deploy; and a rollback cut short after each of
its steps (``rollback_commands``), then ``--cut-wait-s`` without a deploy run, then the next
run.

    .venv/bin/python bench/upgrade_downtime.py [--pause-scale 1.0] [--cases crash-on-probation]

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
import os
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
from devtools.upgrade_site import API_KEY, PORT, UNIT, VENV, Site, make_site, stack_of  # noqa: E402
from pve_sglang.operations.stack_switch import link_command, record_command, rollback_commands  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from pve_sglang.stack.switch_rules import StacksAt  # noqa: E402

RESULT = REPO / "bench" / "results" / "upgrade_downtime.json"
POLLER = "/opt/standin/poll.py"
#: The unit's states once its server exited with an error (waiting to restart, or given up):
#: ExecMainStatus would still hold the exit of the process the restart stopped.
CRASHED = ("auto-restart", "failed")
POLL_LOG = "/run/poll.log"
#: The groups of cases (``--cases``), in the order they run.
CASES = ("upgrades", "crash-after-window", "crash-on-probation", "cuts")
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


def after(lines: list[str], since: float) -> dict:
    """From SINCE (wall time) on: the first answer that is not a 200 (``first_down``), the
    first 200 of the last run of 200s that lasts to the end (``back``, None: down at the end),
    the seconds from one to the other (``down_to_back_s``) and the seconds without a 200 in
    between, the new release's short spells of service left out (``unavailable_s``)."""
    polls = [(float(when), status) for when, status in (line.split() for line in lines)
             if float(when) >= since]
    down = next((when for when, status in polls if status != "200"), None)
    if down is None:
        return {"first_down": None, "back": None, "down_to_back_s": 0.0, "unavailable_s": 0.0}
    back = None
    for when, status in reversed(polls):
        if status != "200":
            break
        back = when
    unavailable = sum(later - when for (when, status), (later, _) in zip(polls, polls[1:])
                      if when >= down and status != "200")
    end = back if back is not None else polls[-1][0]
    return {"first_down": down, "back": back, "down_to_back_s": round(end - down, 2),
            "unavailable_s": round(unavailable, 2)}


def measured(site: Site, what: str, action, extra: dict | None = None) -> dict:
    """ACTION's run under the poller: the gaps without a 200; EXTRA (filled by ACTION, with
    ``since``: a wall time) adds ``after``'s figures from that time on."""
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
    if extra:
        since = extra.pop("since", None)
        if since is not None:
            figures = after(lines, since)
            row.update(down_to_back_s=figures["down_to_back_s"],
                       unavailable_s=figures["unavailable_s"])
        row.update(extra)
    if not lines:
        raise SystemExit(f"{what}: the poller wrote nothing: {site.sh('systemctl status pvs-poll', check=False)}")
    still = " and still down at the end" if row["down_at_end"] else ""
    print(f"{what:<40} down {row['downtime_s']:>6.2f}s{still}  (run {wall:.1f}s, gaps "
          f"{row['gaps_s']}, answers {statuses}, {extra or ''})", flush=True)
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


def crash_after_ready(site: Site, probation_s: int, back: str, window_s: float,
                      extra: dict) -> bool:
    """A release that is judged good, then crashes 6 s after it is ready, each restart the
    same (``crash-after-ready``): its deploy run, then no run for WINDOW_S (or until BACK, the
    previous release, serves again and has for 5 s). PROBATION_S 0 is the time before
    ``upgrade_probation_s``: the trial ended at the verdict, nothing switches back. EXTRA gets
    the verdict's time (``since``: the deploy's end)."""
    done = site.deploy("0.5.7", "--data", "retry_failed_stack=true", "--data",
                       f"upgrade_probation_s={probation_s}")
    if done.returncode != 0:
        raise SystemExit(f"the crash-after-ready deploy failed: {done.log[-3000:]}")
    extra["since"] = time.time()
    deadline, served = time.monotonic() + window_s, None
    while time.monotonic() < deadline:
        if site.link().endswith(stack_of(back)) and site.serves() == back:
            served = served or time.monotonic()
            if time.monotonic() - served >= 5:
                break
        time.sleep(0.5)
    # The release's own starts (its first journal line each), and the crash loop the unit's
    # fallback keeps restarting (its starts, its last pause).
    extra["new_release_starts"] = int(site.sh(
        f"journalctl -u {UNIT} --no-pager -o cat --since @{int(extra['since'])} | grep -c "
        "'^stand-in of sglang 0.5.7:' || true"))
    loop = site.record().get("crash_loop") or {}
    extra["fallback_restarts"] = loop.get("restarts", 0)
    extra["last_pause_s"] = loop.get("pause_s")
    return served is not None


def rollback_cut(site: Site, steps: int, old: str, new: str, wait_s: float,
                 extra: dict) -> bool:
    """A rollback killed after its first STEPS commands (``rollback_commands``, as a deploy
    run runs them): NEW (crashing at load) switched to and on trial, OLD the previous stack;
    then WAIT_S without a deploy run (does OLD serve again by itself?), then the next run
    (with NEW's settings again: it finishes the rollback and refuses NEW). EXTRA gets the
    switch's time (``since``), the command the kill came after, whether OLD served again
    without a run and the next run's time."""
    on_trial = {**site.record(), "previous": stack_of(old), "trial": stack_of(new)}
    on_trial.pop("trial_until", None)
    extra["since"] = time.time()
    site.sh(record_command("sglang", on_trial).get_raw_value())
    site.sh(link_command(VENV, stack_of(new)).get_raw_value())
    site.sh(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}")
    deadline = time.monotonic() + 60
    while site.sh(f"systemctl show -p SubState --value {UNIT}") not in CRASHED:
        if time.monotonic() > deadline:
            raise SystemExit(f"{new} did not crash at load: {site.sh('journalctl -n 20')}")
        time.sleep(0.2)  # the crash at load: the verify phase's judgement would fail here
    failed = {**on_trial, "failed": {**(on_trial.get("failed") or {}), stack_of(new): {
        "sglang": new, "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "why": f"bench: rollback cut after step {steps}"}}}
    commands = rollback_commands(StacksAt(VENV, "sglang"), UNIT, failed, stack_of(old))
    for command in commands[:steps]:
        site.sh(command.get_raw_value())
    extra["cut_after"] = ["the failed set recorded", "the link back", "the restart"][steps - 1]
    cut, alone = time.monotonic(), None
    while time.monotonic() - cut < wait_s:
        if site.link().endswith(stack_of(old)) and site.serves() == old:
            alone = round(time.monotonic() - cut, 1)
            break
        time.sleep(0.2)
    extra["serves_without_a_run_after_s"] = alone
    started = time.monotonic()
    done = site.deploy(new)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and site.serves() != old:
        time.sleep(0.1)
    extra["next_run_to_serving_s"] = None if alone is not None else \
        round(time.monotonic() - started, 1)
    return done.returncode != 0 and site.serves() == old and site.record()["trial"] is None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pause-scale", type=float, default=1.0)
    parser.add_argument("--window-s", type=float, default=240.0,
                        help="how long a crash-after-ready case waits without a deploy run")
    parser.add_argument("--cut-wait-s", type=float, default=45.0,
                        help="how long a rollback cut short waits without a deploy run")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"which cases, comma-separated (default all: {','.join(CASES)})")
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
        wanted = set(args.cases.split(","))
        if "upgrades" in wanted:
            rows.append(measured(site, "good upgrade 0.5.8 -> 0.5.9 (switch)",
                                 lambda: site.deploy("0.5.9").returncode == 0))
            rows.append(measured(site, "failed upgrade 0.5.9 -> 0.5.7 (rollback)",
                                 lambda: site.deploy("0.5.7").returncode != 0
                                 and site.link().endswith(stack_of("0.5.9"))))
            rows.append(measured(site, "old way: stop, reinstall 0.5.8, start",
                                 lambda: old_way(site, "0.5.8")))
        # A release that crashes after it was judged good (issues 34, 47): after its window
        # (upgrade_probation_s 0: the trial ends at the verdict) the crash loop is started
        # again after each start limit, a growing pause between (the unit's OnFailure=); within
        # it the unit's ExecStopPost= switches back at the first crash.
        site.cases(**{"0_5_7": "crash-after-ready"})
        if "crash-after-window" in wanted:
            assert site.deploy("0.5.9").returncode == 0
            before: dict = {}
            rows.append(measured(
                site, "crash after ready 0.5.9 -> 0.5.7, probation 0 (after its window)",
                lambda: not crash_after_ready(site, 0, "0.5.9", args.window_s, before), before))
        if "crash-on-probation" in wanted:
            assert site.deploy("0.5.9").returncode == 0
            now: dict = {}
            rows.append(measured(
                site, "crash after ready 0.5.9 -> 0.5.7, probation (first crash: ExecStopPost)",
                lambda: crash_after_ready(site, 600, "0.5.9", args.window_s, now), now))
        # A rollback killed after each of its steps (issue 34 item 4), 0.5.7 crashing at load.
        site.cases(**{"0_5_7": "crash-load"})
        for steps in (1, 2, 3) if "cuts" in wanted else ():
            assert site.deploy("0.5.9").returncode == 0 and site.serves() == "0.5.9"
            cut: dict = {}
            rows.append(measured(site, f"rollback 0.5.7 -> 0.5.9 cut after step {steps}",
                                 lambda steps=steps, cut=cut: rollback_cut(site, steps, "0.5.9", "0.5.7",
                                                      args.cut_wait_s, cut), cut))
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
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "recorded_real_set_install_s": stores}
    for row in rows:  # which revision measured it: a run of some --cases keeps the other rows
        row["measured"] = {"date": meta["date"], "git_commit": meta["git_commit"]}
    if set(args.cases.split(",")) != set(CASES) and RESULT.exists():
        earlier = json.loads(RESULT.read_text())
        again = {row["case"] for row in rows}
        kept = [row for row in earlier["rows"] if row["case"] not in again]
        meta["cases"] = args.cases.split(",")
        meta["earlier"] = earlier["meta"].get("earlier", earlier["meta"])
        rows = kept + rows
    RESULT.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"written {RESULT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
