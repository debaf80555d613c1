"""Upgrades of the stack in a real LXC container (systemd, journald) through pyinfra's CLI: the
new stack built beside the serving one, one switch and one restart, a failed upgrade rolled
back until the old release serves again, the failed set remembered, retention, and deploys
killed during the build, the switch and the rollback.

The deploy is ``tests/deploys/upgrade.py``: the container phase's own stack and server steps
and the verify phase's own server checks, on ``devtools/upgrade_site.py``'s container: each
stack a real venv with a real sglang wheel (0.5.7 to 0.5.10, a few MB each), the server the
stand-in run by the Python of ``venv_path``, behaving as the test says for the release of the
stack the link names (serve, crash at load, stall in the autotune, answer degenerate text), as
a real release would. One container for every case, in order (module scope): each case starts
from what the one before left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from devtools.upgrade_site import REPO, UNIT, VENV, make_site, stack_of
from pve_sglang.operations.stack_switch import link_command, record_command, rollback_commands
from pve_sglang.project import load_defaults
from pve_sglang.stack import switch_rules as stacks

RELEASES = ("0.5.7", "0.5.8", "0.5.9", "0.5.10")


@pytest.fixture(scope="module")
def site(lxc_env, sglang_wheel, pypi_wheel, tmp_path_factory):
    started = time.monotonic()
    made = make_site(lxc_env, tmp_path_factory.mktemp("upgrade"),
                     [sglang_wheel(release) for release in RELEASES],
                     pypi_wheel("uv", load_defaults()["uv_version"]))
    yield made
    print(f"\nupgrade tests: {time.monotonic() - started:.1f}s; deploys (s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in made.times.items()))
    made.box.destroy()


def test_first_deploy_builds_a_stack_and_links_it(site):
    done = site.deploy("0.5.8")
    assert done.returncode == 0, done.log[-5000:]
    assert site.link() == f"venv.stacks/{stack_of('0.5.8')}"
    assert site.serves() == "0.5.8"
    assert "chat completion of standin-model" in done.log
    # Converged: nothing changes, nothing restarts.
    pid = site.pid()
    again = site.deploy("0.5.8")
    assert again.returncode == 0, again.log[-5000:]
    assert site.pid() == pid
    assert "will restart" not in again.log


def test_a_venv_made_before_stacks_becomes_one_without_a_reinstall_or_restart(site):
    """The layout of earlier releases: one plain venv at venv_path, the server running from
    it (made here from the stack the first deploy built: the same files, patched)."""
    stack = f"{VENV}.stacks/{stack_of('0.5.8')}"
    site.sh(f"systemctl stop sglang.service && rm {VENV} && mv -T {stack} {VENV} && "
            f"rm -f {VENV}/{stacks.RELEASE_FILE} {stacks.state_path('sglang')} && "
            "systemctl start sglang.service")
    assert site.sh(f"test -d {VENV} && ! test -L {VENV} && echo plain") == "plain"
    deadline = time.monotonic() + 60
    while site.serves() != "0.5.8" and time.monotonic() < deadline:
        time.sleep(0.2)
    dist_info = f"{VENV}/lib/python3.11/site-packages/sglang-0.5.8.dist-info"
    installed = site.sh(f"stat -c '%i %Z' {dist_info}")
    pid, starts = site.pid(), site.starts()
    done = site.deploy("0.5.8")
    assert done.returncode == 0, done.log[-5000:]
    assert f"becomes stack {stack_of('0.5.8')}" in done.log
    assert site.link() == f"venv.stacks/{stack_of('0.5.8')}"
    assert site.pid() == pid and site.starts() == starts  # no restart
    assert site.sh(f"stat -c '%i %Z' {dist_info}") == installed  # not reinstalled
    assert site.serves() == "0.5.8"


def test_good_upgrade_switches_once_and_keeps_the_old_stack(site):
    starts = site.starts()
    done = site.deploy("0.5.9")
    assert done.returncode == 0, done.log[-5000:]
    assert site.starts() == starts + 1  # one restart, for the switch
    assert f"sglang.service restarts because: {VENV} -> stack {stack_of('0.5.9')}" in done.log
    assert site.link() == f"venv.stacks/{stack_of('0.5.9')}"
    assert site.stacks() == {stack_of("0.5.8"), stack_of("0.5.9")}
    assert site.record() == {"failed": {}, "previous": stack_of("0.5.8"), "trial": None}
    assert site.serves() == "0.5.9"
    assert f"the upgrade to sglang 0.5.9 (stack {stack_of('0.5.9')}) serves" in done.log


def test_deploy_killed_during_the_build_never_stops_the_server(site):
    pid, link = site.pid(), site.link()
    new = f"{VENV}.stacks/{stack_of('0.5.10')}"
    deploy = subprocess.Popen(site.command("0.5.10"), cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and deploy.poll() is None:
        if site.box.attach(f"test -e {new}/pyvenv.cfg", check=False).returncode == 0:
            break
        time.sleep(0.2)
    assert deploy.poll() is None, "the deploy ended before its build was seen"
    os.killpg(deploy.pid, signal.SIGKILL)
    deploy.wait()
    assert site.pid() == pid and site.link() == link and site.serves() == "0.5.9"
    assert not site.sh(f"ls {new}/{stacks.RELEASE_FILE} 2>/dev/null || true")
    # The next run finishes the build, switches, restarts once; the third stack prunes the first.
    starts = site.starts()
    done = site.deploy("0.5.10")
    assert done.returncode == 0, done.log[-5000:]
    assert site.starts() == starts + 1
    assert site.serves() == "0.5.10"
    assert site.stacks() == {stack_of("0.5.9"), stack_of("0.5.10")}
    assert "stack_retention 2: removing sglang 0.5.8" in done.log


def test_crash_at_load_rolls_back_and_the_old_release_serves(site):
    site.cases(**{"0_5_7": "crash-load"})
    starts = site.starts()
    done = site.deploy("0.5.7")
    (site.root / "rollback.log").write_text(done.log)  # shown in docs and reports
    assert done.returncode != 0
    old, new = f"sglang 0.5.10 (stack {stack_of('0.5.10')})", f"sglang 0.5.7 (stack {stack_of('0.5.7')})"
    assert f"upgrade from {old} to {new} failed; rolled back to {old}, which serves again" in done.log
    assert "HeaderTooLarge" in done.log  # the journal lines of the failed start
    assert site.link() == f"venv.stacks/{stack_of('0.5.10')}"
    assert site.serves() == "0.5.10"
    # Retention waits for the verdict: the good 0.5.9 is kept, not traded for the failed set.
    assert stack_of("0.5.9") in site.stacks()
    assert site.starts() == starts + 2  # the new release once, the old one again
    failed = site.record()["failed"]
    assert set(failed) == {stack_of("0.5.7")} and failed[stack_of("0.5.7")]["sglang"] == "0.5.7"
    # Why: the first line of the failure (the crash came before or during the watch).
    assert "sglang.service" in failed[stack_of("0.5.7")]["why"]
    assert "Result=exit-code" in failed[stack_of("0.5.7")]["why"]


def test_the_failed_set_is_not_retried_silently(site):
    pid = site.pid()
    done = site.deploy("0.5.7")
    assert done.returncode != 0
    assert f"the set sglang 0.5.7 (stack {stack_of('0.5.7')}) failed as an upgrade on" in done.log
    assert "retry_failed_stack: true" in done.log
    assert site.pid() == pid and site.serves() == "0.5.10"


@pytest.mark.parametrize("case, seen", [
    ("stall-autotune", "is stuck: no log line for"),
    ("degenerate", "chat completion is degenerate"),
    # Status and headers, then nothing, /health 200 all along: bounded by
    # generation_timeout_s (5 s here), judged failed and rolled back, not a dead deploy.
    ("headers-then-silence", "chat completion timed out after 5s (generation_timeout_s): "
                             "no complete answer within 5s (status and headers came"),
])
def test_a_stall_or_a_degenerate_answer_rolls_back_when_retried(site, case, seen):
    site.cases(**{"0_5_7": case})
    started = time.monotonic()
    done = site.deploy("0.5.7", "--data", "retry_failed_stack=true")
    assert done.returncode != 0
    assert "tried again (retry_failed_stack)" in done.log
    assert seen in done.log and "rolled back to sglang 0.5.10" in done.log, done.log[-5000:]
    assert site.link() == f"venv.stacks/{stack_of('0.5.10')}"
    assert site.serves() == "0.5.10"
    assert seen[:30] in site.record()["failed"][stack_of("0.5.7")]["why"]
    assert time.monotonic() - started < 120


def test_a_release_without_the_ready_line_serving_health_is_judged_good(site):
    """The verdict rests on what the server answers: /health 200 and a good completion pass,
    whatever the log says; the log's lines are progress and hints only."""
    site.cases(**{"0_5_7": "no-ready-line"})
    done = site.deploy("0.5.7", "--data", "retry_failed_stack=true")
    assert done.returncode == 0, done.log[-5000:]
    assert "is stuck" not in done.log
    assert site.link() == f"venv.stacks/{stack_of('0.5.7')}"
    assert site.serves() == "0.5.7"
    assert site.record()["trial"] is None and stack_of("0.5.7") not in site.record()["failed"]
    # Back to the release the later cases start from: 0.5.10 serving, 0.5.7 built beside.
    back = site.deploy("0.5.10")
    assert back.returncode == 0, back.log[-5000:]
    assert site.serves() == "0.5.10"


def test_restart_pending_builds_and_waits_then_a_killed_switch_converges(site):
    site.cases(**{"0_5_7": "normal"})
    pid = site.pid()
    done = site.deploy("0.5.7", "--data", "retry_failed_stack=true", "--data",
                       "restart_on_change=false")
    assert done.returncode == 0, done.log[-5000:]
    assert "restart pending" in done.log and "is built beside the serving" in done.log
    assert site.pid() == pid and site.link() == f"venv.stacks/{stack_of('0.5.10')}"
    assert stack_of("0.5.7") in site.stacks()
    # A run killed in the switch, after the record and the rename, before the restart: what the
    # deploy's own commands leave.
    record = {**site.record(), "previous": stack_of("0.5.10"), "trial": stack_of("0.5.7")}
    site.sh(record_command("sglang", record).get_raw_value())
    site.sh(link_command(VENV, stack_of("0.5.7")).get_raw_value())
    starts = site.starts()
    done = site.deploy("0.5.7", "--data", "retry_failed_stack=true")
    assert done.returncode == 0, done.log[-5000:]
    assert "restart pending: the sglang stack link changed after the server started" in done.log
    assert site.starts() == starts + 1
    assert site.serves() == "0.5.7"
    assert site.record()["trial"] is None and site.record()["failed"] == {}


def wait_serving(site, release: str, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while site.serves() != release and time.monotonic() < deadline:
        time.sleep(0.5)
    return site.serves() == release


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_rollback_killed_at_each_step_converges_on_the_previous_release(site, steps):
    """A run killed inside its rollback: the rollback's own commands (``rollback_commands``)
    up to the kill, after the switch to 0.5.7, which crash-loops. The next run (asking for the
    failed set again) finishes the rollback: 0.5.10 serves, the record holds no trial, and the
    failed set is refused, truly rolled back."""
    site.cases(**{"0_5_7": "crash-load"})
    old, new = stack_of("0.5.10"), stack_of("0.5.7")
    on_trial = {"previous": old, "trial": new, "failed": {}}
    site.sh(record_command("sglang", on_trial).get_raw_value())
    site.sh(link_command(VENV, new).get_raw_value())
    site.sh(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}")
    failed = {**on_trial, "failed": {new: {"sglang": "0.5.7", "when": "2026-12-04 06:00:00 UTC",
                                           "why": f"killed at step {steps}"}}}
    for command in rollback_commands(stacks.StacksAt(VENV, "sglang"), UNIT, failed, old)[:steps]:
        site.sh(command.get_raw_value())
    restarted = steps == 3 and wait_serving(site, "0.5.10")  # cut after its own restart
    starts = site.starts()
    done = site.deploy("0.5.7")
    # The run that finished the rollback waited until the previous release serves again, as
    # the verify phase's rollback does (before, it ended with /health 503).
    served = site.serves()
    assert done.returncode != 0
    assert f"the set sglang 0.5.7 (stack {new}) failed as an upgrade" in done.log, done.log[-3000:]
    assert ("was cut short: switching back" in done.log) == (steps == 1), done.log[-3000:]
    assert site.link() == f"venv.stacks/{old}"
    record = site.record()
    assert record["trial"] is None and set(record["failed"]) == {new}
    if steps < 3:  # this run restarted it
        assert f"rolled back: sglang 0.5.10 (stack {old}) serves again" in done.log, \
            done.log[-3000:]
        assert served == "0.5.10", done.log[-3000:]
    assert wait_serving(site, "0.5.10")
    if restarted:  # the server the rollback restarted, within its link's second, is kept
        assert site.starts() == starts, done.log[-3000:]
    site.cases(**{"0_5_7": "normal"})


PROBATION = ("--data", "upgrade_probation_s=600")
FALLBACK_UNIT = "sglang-stack-fallback.service"
#: The unit's states once its server exited with an error (waiting to restart, or given up).
CRASHED = ("auto-restart", "failed")
#: The fallback's first N steps, run by the container's Python from the script the deploy
#: uploaded (the unit's own code, cut where a kill would cut it).
FALLBACK_STEPS = ("python3 -c 'import sys; sys.path.insert(0, \"/opt/sglang\"); import "
                  "stack_fallback as f; [step() for _, step in f.steps(f.arguments(["
                  "\"--unit\", \"sglang.service\", \"--venv-path\", \"/opt/sglang/venv\", "
                  "\"--state\", \"{state}\"]))[:{steps}]]'")


@pytest.mark.parametrize("steps, then", [(1, "fallback"), (1, "deploy"), (2, "deploy"),
                                         (3, "deploy"), (4, "deploy")])
def test_a_fallback_killed_at_each_step_converges_on_the_previous_release(site, steps, then):
    """systemd's own switch back (the unit's OnFailure=, remote/stack_fallback.py) killed
    after each of its steps: 0.5.7 on trial (its run cut short before its verdict: the unit's
    ExecStopPost= leaves it to the start limit) crashed at load, and the fallback's own code
    ran up to the kill. The next fallback (the server failing again: the unit started as
    OnFailure= starts it) or the next deploy run (asking for 0.5.7 again) gets 0.5.10 serving,
    the trial cleared, and the record says why 0.5.7 failed; the deploy refuses 0.5.7."""
    site.cases(**{"0_5_7": "crash-load"})
    old, new = stack_of("0.5.10"), stack_of("0.5.7")
    on_trial = {"previous": old, "trial": new, "failed": {}}
    site.sh(record_command("sglang", on_trial).get_raw_value())
    site.sh(link_command(VENV, new).get_raw_value())
    site.sh(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}")
    deadline = time.monotonic() + 30
    while site.sh(f"systemctl show -p SubState --value {UNIT}") not in CRASHED and \
            time.monotonic() < deadline:
        time.sleep(0.2)  # its crash at load
    site.sh(FALLBACK_STEPS.format(state=stacks.state_path("sglang"), steps=steps))
    assert site.link() == f"venv.stacks/{new if steps == 1 else old}"
    restarted = steps == 4 and wait_serving(site, "0.5.10")  # its start queued
    starts = site.starts()
    if then == "fallback":
        site.sh(f"systemctl start {FALLBACK_UNIT}")
    else:
        done = site.deploy("0.5.7")
        assert done.returncode != 0
        assert f"the set sglang 0.5.7 (stack {new}) failed as an upgrade" in done.log, \
            done.log[-3000:]
        assert "systemd switched back to sglang 0.5.10" in done.log, done.log[-3000:]
    assert site.link() == f"venv.stacks/{old}"
    record = site.record()
    assert record["trial"] is None and record["previous"] is None, record
    assert "trial_until" not in record and set(record["failed"]) == {new}, record
    assert "failed for good while on trial" in record["failed"][new]["why"], record
    assert wait_serving(site, "0.5.10")
    if restarted:  # the server the queued start started is kept
        assert site.starts() == starts
    if then == "fallback":  # the next run reports the switch back, as after a whole one
        done = site.deploy("0.5.10")
        assert done.returncode == 0, done.log[-5000:]
        assert "systemd switched back to sglang 0.5.10" in done.log, done.log[-3000:]
    assert "fell_back" not in site.record()


def started(site, release: str) -> int:
    """How many times RELEASE's stand-in started (its first line in the journal)."""
    return int(site.sh(f"journalctl -u {UNIT} --no-pager -o cat | grep -c '^stand-in of sglang "
                       f"{release}:' || true"))


def test_a_crash_after_ready_on_probation_switches_back_at_its_first_crash(site):
    """A release judged good (ready, a good chat completion) that crashes 6 s later: within
    upgrade_probation_s the unit's ExecStopPost= (remote/stack_fallback.py) switches the link
    back to the previous stack at this first crash and starts it at once, without a deploy run
    (before: three crashes and the start limit, then OnFailure=). The next run reports it."""
    site.cases(**{"0_5_7": "crash-after-ready"})
    done = site.deploy("0.5.7", "--data", "retry_failed_stack=true", *PROBATION)
    assert done.returncode == 0, done.log[-5000:]
    assert "on trial until" in done.log, done.log[-3000:]
    record = site.record()
    assert record["trial"] == stack_of("0.5.7") and record["trial_until"] > time.time()
    assert record["failed"] == {}  # the retried set judged good; on probation
    new_starts = started(site, "0.5.7")
    started_at = time.monotonic()
    deadline = started_at + 180
    back = f"venv.stacks/{stack_of('0.5.10')}"
    while time.monotonic() < deadline and not (site.link() == back and site.serves() == "0.5.10"):
        time.sleep(0.5)
    print(f"\ncrash after ready, on probation: 0.5.10 serves again "
          f"{time.monotonic() - started_at:.1f}s after the deploy's verdict, no deploy run")
    assert site.link() == back
    assert site.serves() == "0.5.10"
    # Its first crash was its last: 0.5.7 was not started again.
    assert started(site, "0.5.7") == new_starts, site.sh(
        f"journalctl -u {UNIT} --no-pager -n 60 -o short-precise | grep -v -e TP -e blob")
    record = site.record()
    assert record["trial"] is None and record["previous"] is None and "trial_until" not in record
    why = record["failed"][stack_of("0.5.7")]["why"]
    assert "crashed on probation" in why and "its first crash" in why and "ExecStopPost=" in why
    assert "crash_loop" not in record  # the start it queued is no crash loop
    assert record["fell_back"]["from"] == stack_of("0.5.7")
    assert record["fell_back"]["to"] == stack_of("0.5.10")
    # The next run reports the switch back, and forgets the note (the failed set stays).
    done = site.deploy("0.5.10")
    assert done.returncode == 0, done.log[-5000:]
    assert f"systemd switched back to sglang 0.5.10 (stack {stack_of('0.5.10')})" in done.log, \
        done.log[-3000:]
    assert "fell_back" not in site.record() and stack_of("0.5.7") in site.record()["failed"]
    assert site.serves() == "0.5.10"


def test_a_restart_before_the_verdict_seen_by_the_next_run_is_rolled_back_until_served(site):
    """A run killed after its switch and restart, before its verdict (its own commands, as
    the switch leaves them), and 0.5.7 crashing 6 s after ready, restarted once by systemd:
    the next run (upgrade_probation_s 0) reads the restart since the switch (NRestarts),
    says it failed before its verdict (not "after its verdict", not upgrade_probation_s),
    records the set, rolls back, and waits until 0.5.10 serves again before it ends."""
    site.cases(**{"0_5_7": "crash-after-ready"})
    old, new = stack_of("0.5.10"), stack_of("0.5.7")
    # 0.5.7's stack built beside (retention removed the failed set), its switch held back.
    built = site.deploy("0.5.7", "--data", "retry_failed_stack=true", "--data",
                        "restart_on_change=false")
    assert built.returncode == 0 and new in site.stacks(), built.log[-3000:]
    site.sh(record_command("sglang", {**site.record(), "previous": old, "trial": new,
                                      "failed": {}}).get_raw_value())
    site.sh(link_command(VENV, new).get_raw_value())
    site.sh(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}")
    deadline = time.monotonic() + 60
    while int(site.sh(f"systemctl show -p NRestarts --value {UNIT}") or 0) < 1 and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert int(site.sh(f"systemctl show -p NRestarts --value {UNIT}") or 0) >= 1, \
        site.sh(f"systemctl show -p NRestarts -p ActiveState -p SubState {UNIT}; journalctl "
                f"-u {UNIT} -u {FALLBACK_UNIT} --no-pager -n 300 -o short-precise | grep -v "
                "-e TP -e blob") + f"\n{site.record()}"
    assert site.link() == f"venv.stacks/{new}"
    done = site.deploy("0.5.7")
    served = site.serves()
    assert done.returncode != 0
    said = [line for line in done.log.splitlines() if "rolling back to" in line]
    assert any(f"the upgrade to sglang 0.5.7 (stack {new}) failed: the server restarted on its "
               "own 1 time since the switch, before its verdict (the run that switched to it "
               "was cut short); rolling back to sglang 0.5.10" in line for line in said), \
        "\n".join(said) or done.log[:8000]
    assert "after its verdict" not in done.log and "(upgrade_probation_s)" not in done.log
    assert f"the set sglang 0.5.7 (stack {new}) failed as an upgrade" in done.log
    assert f"rolled back: sglang 0.5.10 (stack {old}) serves again" in done.log, done.log[-3000:]
    assert served == "0.5.10", done.log[-3000:]
    assert site.link() == f"venv.stacks/{old}"
    record = site.record()
    assert record["trial"] is None
    assert "before its verdict" in record["failed"][new]["why"]


def test_a_crash_loop_after_probation_is_started_again_and_reported(site):
    """0.5.10 served its whole window (no stack on trial) and now crashes at each load: at
    each start limit the unit's OnFailure= starts it again after a pause that doubles, never
    giving up (before: down until the next deploy run); the next run reports the loop, and the
    first run whose server answers ends it. RestartSec 1 s here (a drop-in) so the bursts are
    short; the pauses double from it."""
    fast = f"/etc/systemd/system/{UNIT}.d/zz-fast-restart.conf"
    site.put(fast, "[Service]\nRestartSec=1\n")
    site.sh("systemctl daemon-reload")
    try:
        site.cases(**{"0_5_10": "crash-load"})
        assert site.record().get("trial") is None
        site.sh(f"systemctl reset-failed {UNIT}; systemctl restart {UNIT}")
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and \
                (site.record().get("crash_loop") or {}).get("restarts", 0) < 2:
            time.sleep(0.5)
        loop = site.record().get("crash_loop") or {}
        assert loop.get("restarts", 0) >= 2, site.sh(
            f"journalctl -u {UNIT} -u {FALLBACK_UNIT} --no-pager -n 80 -o short-precise | "
            "grep -v -e TP -e blob") + f"\n{site.record()}"
        # RestartSec (1 s) doubled at each start limit: 2 s, 4 s, ...
        assert loop["pause_s"] == 2.0 ** loop["restarts"], loop
        assert "failed for good (Result=" in loop["why"], loop
        # Started again after its second start limit: it did not give up.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and \
                site.sh(f"systemctl show -p ActiveState --value {UNIT}") == "failed":
            time.sleep(0.5)
        assert site.sh(f"systemctl show -p ActiveState --value {UNIT}") != "failed"
        # The next run reports the loop (and fails: the release does not serve).
        done = site.deploy("0.5.10")
        assert done.returncode != 0
        assert f"{UNIT} of sglang 0.5.10 (stack {stack_of('0.5.10')}) crash-loops" in done.log, \
            done.log[-3000:]
        assert "its fallback (remote/stack_fallback.py) starts it again after each start " \
            "limit" in done.log, done.log[-3000:]
        # Repaired: the first run whose server answers ends the loop.
        site.cases()
        done = site.deploy("0.5.10")
        assert done.returncode == 0, done.log[-5000:]
        assert "its crash loop" in done.log and "is over" in done.log, done.log[-3000:]
        assert "crash_loop" not in site.record()
        assert site.serves() == "0.5.10"
    finally:
        site.sh(f"rm -f {fast} && systemctl daemon-reload")
        site.cases()


def test_an_upgrade_sent_back_with_its_roll_serves_the_release_before_and_is_recorded_failed(site):
    """``gateway_roll_failure: back`` on one replica (``operations.roll.back_with_the_roll``
    runs the same two functions): an upgrade that serves, on trial, is sent back because its
    roll stopped at another replica: the release it goes back to is named, the link goes back,
    the server restarts and serves it, and the new set is recorded failed with why."""
    if not site.serves():  # run alone: a release serves first
        assert site.deploy(RELEASES[1]).returncode == 0
    serving = site.serves()
    failed = site.record().get("failed") or {}
    new = next(r for r in reversed(RELEASES) if r != serving and stack_of(r) not in failed)
    done = site.deploy(new, "--data", "upgrade_probation_s=3600")
    assert done.returncode == 0, done.log[-5000:]
    assert site.serves() == new and site.record().get("trial"), site.record()
    starts = site.starts()
    done = site.deploy(new, "--data", "upgrade_probation_s=3600", "--data", "send_back=true")
    assert done.returncode == 0, done.log[-5000:]
    assert f"goes back to: sglang {serving} (stack {stack_of(serving)})" in done.log, done.log[-3000:]
    assert site.serves() == serving and site.starts() == starts + 1
    assert site.link() == f"venv.stacks/{stack_of(serving)}"
    record = site.record()
    assert record.get("trial") is None and record.get("previous") is None, record
    assert record["failed"][stack_of(new)]["why"] == (
        "the roll behind the test's gateway stopped at another replica"), record
