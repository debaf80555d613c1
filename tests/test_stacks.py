"""Stacks side by side: the decisions (``pve_sglang.stack.switch_rules``) on tables, and the read of a
container's stacks (``facts.stacks.Stacks``) run with ``sh`` on real folders and links here."""

from __future__ import annotations

import json
import os

import pytest

from harness import sh
from pve_sglang.facts.installed_stacks import Stacks
from pve_sglang.operations.stack_switch import link_command, record_command
from pve_sglang.stack import switch_rules as stacks
from pve_sglang.stack.switch_rules import (
    Found, Move, SwitchPlan, Unfinished, Verdict, decide_switch, found_of, judge,
)

A, B, C, D = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc", "dddddddddddddddd"


@pytest.mark.parametrize("found, wanted, restart_on_change, serving, plan", [
    # Nothing yet: the link is made (the server starts, whatever restart_on_change says).
    (Found("missing"), A, True, False, SwitchPlan(Move.FIRST, None)),
    (Found("missing"), A, False, False, SwitchPlan(Move.FIRST, None)),
    # The serving stack is the wanted one: nothing.
    (Found("link", current=A, stacks=(A,)), A, True, True, SwitchPlan(Move.NONE, A)),
    # Another one is wanted: built beside, switched, one restart; held back without restarts.
    (Found("link", current=A, stacks=(A,)), B, True, True, SwitchPlan(Move.SWITCH, A)),
    (Found("link", current=A, stacks=(A,)), B, False, True, SwitchPlan(Move.PENDING, A)),
    # A server that does not run is not restarted by the switch: no reason to hold it back.
    (Found("link", current=A, stacks=(A,)), B, False, False, SwitchPlan(Move.SWITCH, A)),
    # A venv of the time before stacks counts as the stack it is moved to (``migration``).
    (Found("plain", plain_lock=A), A, True, True, SwitchPlan(Move.NONE, A)),
    (Found("plain", plain_lock=A), B, True, True, SwitchPlan(Move.SWITCH, A)),
    (Found("plain", plain_lock=A), B, False, True, SwitchPlan(Move.PENDING, A)),
])
def test_switch_decisions(found, wanted, restart_on_change, serving, plan):
    assert decide_switch(found, wanted, restart_on_change, serving) == plan


@pytest.mark.parametrize("found, named", [
    (Found("link", current=A, stacks=(A, B)), A),
    (Found("plain", plain_lock=B), B),
    (Found("plain", plain_lock=None), None),  # an install cut short: nothing names it
    (Found("missing"), None),
    (Found("other"), None),
])
def test_the_stack_venv_path_names(found, named):
    assert found.named == named


@pytest.mark.parametrize("found, moved", [
    (Found("missing"), None),
    (Found("link", current=A), None),
    (Found("plain", plain_lock=A), A),
])
def test_a_plain_venv_is_moved_under_its_lock_id(found, moved):
    assert stacks.migration(found) == moved


@pytest.mark.parametrize("found", [Found("other"), Found("plain", plain_lock=None)])
def test_what_cannot_be_named_is_not_moved_nor_switched(found):
    with pytest.raises(ValueError):
        stacks.migration(found)
    if found.kind == "other":
        with pytest.raises(ValueError):
            decide_switch(found, A, True, True)


@pytest.mark.parametrize("failed, trial, current, previous, stacks_, rollback, verdict", [
    (False, B, B, A, (A, B), True, Verdict.GOOD),
    (True, B, B, A, (A, B), True, Verdict.ROLL_BACK),
    # Not on trial (judged good before, or never switched): a failure as before, no rollback.
    (True, None, B, A, (A, B), True, Verdict.NOT_AN_UPGRADE),
    # The record says B, the link says A (a run killed before its rename): not an upgrade.
    (True, B, A, A, (A, B), True, Verdict.NOT_AN_UPGRADE),
    (True, B, B, A, (A, B), False, Verdict.KEEP_FAILED),
    # The rollback target is gone (removed by hand) or never complete.
    (True, B, B, A, (B,), True, Verdict.NO_TARGET),
    (True, B, B, None, (A, B), True, Verdict.NO_TARGET),
])
def test_judgement_after_the_verify_phase(failed, trial, current, previous, stacks_, rollback,
                                          verdict):
    assert judge(failed, trial, current, previous, stacks_, rollback) is verdict


@pytest.mark.parametrize("found, failed, step", [
    # No trial, or a trial not recorded as failed (a switch, the judgement to come): nothing.
    (Found("link", current=B, stacks=(A, B), previous=A), (B,), None),
    (Found("link", current=B, stacks=(A, B), previous=A, trial=B), (), None),
    # Killed after the failed set was recorded, before the link went back: switch back.
    (Found("link", current=B, stacks=(A, B), previous=A, trial=B), (B,), Unfinished.SWITCH_BACK),
    # Killed after the link went back (before or after the restart), before the record's end.
    (Found("link", current=A, stacks=(A, B), previous=A, trial=B), (B,), Unfinished.FORGET_TRIAL),
    # The target is gone: the failed release stays (judge says NO_TARGET).
    (Found("link", current=B, stacks=(B,), previous=A, trial=B), (B,), None),
    (Found("link", current=B, stacks=(A, B), previous=None, trial=B), (B,), None),
])
def test_a_rollback_cut_short_is_finished(found, failed, step):
    assert stacks.unfinished_rollback(found, failed) is step


N1, N2, N3 = "ct101", "ct102", "ct103"


@pytest.mark.parametrize("passed, failed", [
    # Every node served and answered: the group is good.
    ({N1: True, N2: True}, ()),
    ({N1: True}, ()),
    # One node failed its start or its answer: the group fails, named in the group's order.
    ({N1: True, N2: False}, (N2,)),
    ({N1: False, N2: True, N3: False}, (N1, N3)),
    # A node that left the run before its judgement (an earlier operation failed on it).
    ({N1: True, N2: None}, (N2,)),
    ({N1: None, N2: False}, (N1, N2)),
])
def test_a_group_fails_when_one_node_fails(passed, failed):
    assert stacks.group_failed(passed) == failed


@pytest.mark.parametrize("passed, trial, current, previous, rollback, verdict", [
    # Every node gets the same verdict from the group's: the node that served rolls back too.
    ({N1: True, N2: True}, B, B, A, True, Verdict.GOOD),
    ({N1: True, N2: False}, B, B, A, True, Verdict.ROLL_BACK),
    ({N1: True, N2: None}, B, B, A, True, Verdict.ROLL_BACK),
    ({N1: True, N2: False}, B, B, A, False, Verdict.KEEP_FAILED),
    # Not an upgrade on this node (no stack on trial): the group fails, nothing switches back.
    ({N1: True, N2: False}, None, B, A, True, Verdict.NOT_AN_UPGRADE),
])
def test_each_node_is_judged_by_its_group(passed, trial, current, previous, rollback, verdict):
    failed = bool(stacks.group_failed(passed))
    assert judge(failed, trial, current, previous, (A, B), rollback) is verdict


@pytest.mark.parametrize("nodes, in_run, current, wanted, missing", [
    # Every node in the run: they switch together.
    ([N1, N2], {N1, N2}, A, B, ()),
    ([N1, N2], {N1, N2, N3}, A, B, ()),
    # A node of the group left out (--limit, a failed connection or operation): refused.
    ([N1, N2], {N1}, A, B, (N2,)),
    ([N1, N2, N3], {N2}, A, B, (N1, N3)),
    # Nothing to switch (the serving stack is wanted) or nothing serves yet: no refusal.
    ([N1, N2], {N1}, B, B, ()),
    ([N1, N2], {N1}, None, B, ()),
    # Served alone (no nodes).
    ([], {N1}, A, B, ()),
])
def test_a_node_does_not_switch_without_its_group(nodes, in_run, current, wanted, missing):
    assert stacks.not_together(nodes, in_run, current, wanted) == missing


@pytest.mark.parametrize("record, wanted, retry, refused", [
    ({}, A, False, None),
    ({A: {"when": "t", "why": "w"}}, A, False, {"when": "t", "why": "w"}),
    ({A: {"when": "t", "why": "w"}}, A, True, None),
    ({A: {"when": "t", "why": "w"}}, B, False, None),
])
def test_a_failed_set_is_not_retried_silently(record, wanted, retry, refused):
    assert stacks.refused(record, wanted, retry) == refused


@pytest.mark.parametrize("current, previous, wanted, restart, after", [
    (B, A, B, True, (B, A)),      # nothing to switch: as it is
    (B, A, B, False, (B, A)),
    (B, A, C, True, (C, B)),      # switched: the replaced stack is the rollback target
    (B, A, C, False, (B, A)),     # switch pending: the current one serves on
    (None, None, A, True, (A, None)),  # a first stack
])
def test_serving_and_rollback_after_the_switch(current, previous, wanted, restart, after):
    assert stacks.after_switch(current, previous, wanted, restart) == after


@pytest.mark.parametrize("mtimes, keep, serving, rollback, wanted, gone", [
    # Three upgrades A -> B -> C, two kept: the serving one and its rollback target.
    ({A: 1, B: 2, C: 3}, 2, C, B, C, [A]),
    ({A: 1, B: 2, C: 3, D: 4}, 2, D, C, D, [A, B]),
    # The rollback target is kept even when it is the oldest; keep 1 keeps both anyway.
    ({A: 1, B: 2, C: 3}, 2, C, A, C, [B]),
    ({A: 1, B: 2, C: 3}, 1, C, A, C, [B]),
    # Built, switch pending (restart_on_change false): the serving one, its target and the new.
    ({A: 1, B: 2, C: 3}, 2, B, A, C, []),
    # More kept than there are: nothing removed.
    ({A: 1, B: 2}, 3, B, A, B, []),
    # A folder not named by a lock id is never ours to remove.
    ({A: 1, B: 2, C: 3, "my-venv": 0}, 2, C, B, C, [A]),
])
def test_retention(mtimes, keep, serving, rollback, wanted, gone):
    assert stacks.to_remove(mtimes, keep, serving, rollback, wanted) == gone


@pytest.mark.parametrize("mtimes, keep, serving, rollback, wanted, failed, gone", [
    # B serves again after C failed and was rolled back: the good A stays, the failed C goes.
    ({A: 1, B: 2, C: 3}, 2, B, None, B, (C,), [C]),
    # The failed set asked again (retry_failed_stack) is the wanted one: kept.
    ({A: 1, B: 2, C: 3}, 2, C, B, C, (C,), [A]),
    # Nothing failed: the newest count, as before.
    ({A: 1, B: 2, C: 3}, 2, B, None, B, (), [A]),
])
def test_retention_never_keeps_a_failed_set_over_a_good_one(mtimes, keep, serving, rollback,
                                                            wanted, failed, gone):
    assert stacks.to_remove(mtimes, keep, serving, rollback, wanted, failed) == gone


@pytest.mark.parametrize("trial, current, serving, waits", [
    (None, B, B, False),  # nothing on trial, no switch: remove now
    (None, B, C, True),   # this run switches to C: after its verdict
    (C, C, C, True),      # C on trial (a run killed before its verdict): after it
])
def test_retention_waits_for_the_verdict(trial, current, serving, waits):
    assert stacks.retention_waits(trial, current, serving) is waits


@pytest.mark.parametrize("target, named", [
    (f"venv.stacks/{A}", A), (f"/opt/sglang/venv.stacks/{A}", A), (f"venv.stacks/{A}/", A),
    ("other/aaaaaaaaaaaaaaaa", None), ("venv.stacks/not-a-lock", None), (None, None),
])
def test_a_link_names_a_stack_of_ours_only(target, named):
    assert stacks.linked_id("/opt/sglang/venv", target) == named


def test_a_stack_id_is_a_lock_id():
    with pytest.raises(ValueError):
        stacks.stack_path("/opt/sglang/venv", "../../etc")
    assert stacks.STACK_NAME.match(stacks.unlocked_id("0.5.9"))
    assert stacks.unlocked_id("0.5.9") != stacks.unlocked_id("0.5.10")


def read(tmp_path, venv: str = "opt/sglang/venv") -> dict:
    fact = Stacks()
    return fact.process(sh(fact.command(str(tmp_path / venv), str(tmp_path / "stack.lock"),
                                        str(tmp_path / "state.json"))))


def make_stack(tmp_path, stack_id: str, release: str, complete: bool = True) -> None:
    folder = tmp_path / "opt/sglang/venv.stacks" / stack_id
    folder.mkdir(parents=True)
    if complete:
        (folder / stacks.RELEASE_FILE).write_text(json.dumps({"sglang": release}) + "\n")


def test_the_read_of_links_stacks_and_the_record(tmp_path):
    venv = str(tmp_path / "opt/sglang/venv")
    assert read(tmp_path)["kind"] == "missing"
    make_stack(tmp_path, A, "0.5.9")
    make_stack(tmp_path, B, "0.5.10", complete=False)  # cut short: not a stack yet
    (tmp_path / "opt/sglang/venv.stacks/not-ours").mkdir()
    assert sh(link_command(venv, A)) == []
    assert sh(record_command("sglang", {"previous": None, "trial": A}).get_raw_value().replace(
        stacks.STATE_DIR, str(tmp_path)).replace("sglang-stacks.json", "state.json")) == []
    raw = read(tmp_path)
    assert raw["kind"] == "link" and raw["target"] == f"venv.stacks/{A}"
    assert set(raw["stacks"]) == {A} and raw["stacks"][A]["sglang"] == "0.5.9"
    assert raw["state"] == {"previous": None, "trial": A}
    assert found_of(venv, raw) == Found("link", current=A, stacks=(A,), trial=A)
    # The switch is one rename: the link is a link all the time, never missing.
    make_stack(tmp_path / "x", B, "0.5.10")
    assert sh(link_command(venv, B)) == []
    assert os.readlink(venv) == f"venv.stacks/{B}"
    assert not os.path.lexists(venv + ".switching")


def test_a_plain_venv_is_named_by_its_complete_lock(tmp_path):
    venv = tmp_path / "opt/sglang/venv"
    (venv / "lib/python3.11/site-packages/sglang-0.5.9.dist-info").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "stack.lock").write_text("sglang==0.5.9 --hash=sha256:00\n")
    raw = read(tmp_path)
    lock_id = __import__("hashlib").sha256(b"sglang==0.5.9 --hash=sha256:00\n").hexdigest()[:16]
    assert raw["kind"] == "plain" and raw["plain_lock"] == lock_id
    assert raw["plain_sglang"] == "0.5.9"
    assert found_of(str(venv), raw).plain_lock == lock_id
    # Without a lock (sglang-no-deps): named by its sglang release.
    (tmp_path / "stack.lock").unlink()
    assert found_of(str(venv), read(tmp_path)).plain_lock == stacks.unlocked_id("0.5.9")
    # An install cut short names nothing: it is not moved, not switched to.
    (venv / ".pve-sglang-install-incomplete").touch()
    assert found_of(str(venv), read(tmp_path)).plain_lock is None


# The operations on recorded reads (``Stacks``, ``UnitState``): the commands they plan.

from harness import op_commands  # noqa: E402
from pyinfra.api import OperationError  # noqa: E402

from pve_sglang.facts.container import UnitState  # noqa: E402
from pve_sglang.operations import stack_switch as stack_ops  # noqa: E402

VENV = "/opt/sglang/venv"


def read_of(current: str | None, names: dict[str, float], state: dict | None = None,
            kind: str = "link") -> dict:
    return {"kind": kind, "target": f"venv.stacks/{current}" if current else None,
            "plain_lock": None, "plain_sglang": None,
            "stacks": {name: {"sglang": f"0.5.{int(mtime)}", "mtime": mtime}
                       for name, mtime in names.items()}, "state": state or {}}


def switch_commands(raw: dict, wanted: str, restart_on_change: bool = True,
                    active: str = "active") -> list:
    return op_commands(stack_ops.switch, venv_path=VENV, lock_file="/opt/sglang/stack.lock",
                       service="sglang", unit="sglang.service", wanted=wanted,
                       restart_on_change=restart_on_change,
                       facts={Stacks: raw, UnitState: {"active": active}})


def test_the_switch_writes_the_record_then_renames_the_link():
    commands = switch_commands(read_of(A, {A: 7}), B)
    assert commands == [
        'mkdir -p /var/lib/pve-sglang && printf \'%s\\n\' \'{"previous": "aaaaaaaaaaaaaaaa", '
        '"trial": "bbbbbbbbbbbbbbbb"}\' > /var/lib/pve-sglang/sglang-stacks.json.tmp && mv -f '
        '/var/lib/pve-sglang/sglang-stacks.json.tmp /var/lib/pve-sglang/sglang-stacks.json',
        f"ln -sfn venv.stacks/{B} /opt/sglang/venv.switching && mv -T "
        "/opt/sglang/venv.switching /opt/sglang/venv",
    ]
    assert switch_commands(read_of(B, {A: 7, B: 8}), B) == []
    # restart_on_change false: built, not switched.
    assert switch_commands(read_of(A, {A: 7}), B, restart_on_change=False) == []


def test_a_plain_venv_is_moved_into_the_stacks_folder_not_reinstalled():
    raw = {**read_of(None, {}, kind="plain"), "plain_lock": A, "plain_sglang": "0.5.9"}
    commands = op_commands(stack_ops.migrate, venv_path=VENV, lock_file="/opt/sglang/stack.lock",
                           service="sglang", copies={"/opt/sglang/stack.lock": "pve-sglang.lock"},
                           facts={Stacks: raw})
    ref = f"/opt/sglang/venv.stacks/.{A}.mtime"
    assert commands == [
        f"mkdir -p /opt/sglang/venv.stacks && touch -r /opt/sglang/venv {ref} && "
        "{ [ ! -f /opt/sglang/stack.lock ] || cp -p /opt/sglang/stack.lock "
        "/opt/sglang/venv/pve-sglang.lock ; } && printf '%s\\n' "
        f"'{{\"lock\": \"{A}\", \"sglang\": \"0.5.9\"}}' > "
        "/opt/sglang/venv/pve-sglang-stack.json && mv -T /opt/sglang/venv "
        f"/opt/sglang/venv.stacks/{A} && touch -r {ref} /opt/sglang/venv.stacks/{A} && "
        f"ln -sfn venv.stacks/{A} /opt/sglang/venv.switching && mv -T "
        f"/opt/sglang/venv.switching /opt/sglang/venv && touch -h -r {ref} /opt/sglang/venv && "
        f"rm -f {ref}"]
    # Then the switch sees the stack it became: nothing when it is the one wanted.
    assert switch_commands(raw, A) == []
    assert op_commands(stack_ops.migrate, venv_path=VENV, lock_file="/x", service="sglang",
                       copies={}, facts={Stacks: read_of(A, {A: 1})}) == []


def test_a_plain_venv_moved_for_real_keeps_its_time_and_serves_through_the_link(tmp_path):
    venv = tmp_path / "opt/sglang/venv"
    (venv / "lib/python3.11/site-packages/sglang-0.5.9.dist-info").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "stack.lock").write_text("sglang==0.5.9 --hash=sha256:00\n")
    os.utime(venv, (1_600_000_000, 1_600_000_000))
    raw = read(tmp_path)
    command = op_commands(stack_ops.migrate, venv_path=str(venv),
                          lock_file=str(tmp_path / "stack.lock"), service="sglang",
                          copies={str(tmp_path / "stack.lock"): "pve-sglang.lock"},
                          facts={Stacks: raw})[0]
    assert sh(command + " && echo done") == ["done"]
    moved = found_of(str(venv), read(tmp_path))
    assert moved.kind == "link" and moved.current == raw["plain_lock"]
    assert moved.stacks == (raw["plain_lock"],)
    assert (venv / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    assert (venv / "pve-sglang.lock").read_text() == "sglang==0.5.9 --hash=sha256:00\n"
    # Its own time, on the stack and on the link: the server is not found older than its venv.
    assert os.stat(venv).st_mtime == 1_600_000_000 and os.lstat(venv).st_mtime == 1_600_000_000


def test_retention_plans_the_removal_of_the_oldest():
    def plan(raw, wanted, restart_on_change=True):
        return op_commands(stack_ops.retention, venv_path=VENV, lock_file="/x", service="sglang",
                           wanted=wanted, keep=2, restart_on_change=restart_on_change,
                           facts={Stacks: raw})

    # The third upgrade (C over B over A), planned before its switch: nothing before the
    # verdict; A goes after it (C serves, its trial ended).
    assert plan(read_of(B, {A: 1, B: 2, C: 3}, {"previous": A}), C) == []
    assert plan(read_of(C, {A: 1, B: 2, C: 3}, {"previous": B, "trial": C}), C) == []
    assert plan(read_of(C, {A: 1, B: 2, C: 3}, {"previous": B}), C) == [
        f"rm -rf /opt/sglang/venv.stacks/{A}"]
    # Switch pending: the serving one, its rollback target and the new one stay.
    assert plan(read_of(B, {A: 1, B: 2, C: 3}, {"previous": A}), C, False) == []


def test_a_failed_set_stops_the_run_before_any_change():
    record = {"failed": {B: {"sglang": "0.5.10", "when": "2026-12-04 06:00:00 UTC",
                             "why": "sglang.service stopped running"}}}

    def check(retry):
        return op_commands(stack_ops.not_failed, venv_path=VENV, lock_file="/x",
                           service="sglang", wanted=B, release="sglang 0.5.10", retry=retry,
                           facts={Stacks: read_of(A, {A: 1, B: 2}, record)})

    with pytest.raises(OperationError, match=r"sglang 0.5.10 \(stack b+\) failed as an upgrade "
                       r"on 2026-12-04 06:00:00 UTC and was rolled back: sglang.service stopped"):
        check(False)
    assert check(True) == []


def test_the_rollback_records_first_and_clears_the_trial_last():
    """Each prefix of the rollback's commands is a state the next run finishes
    (``unfinished_rollback``); the record names the trial until the link went back."""
    record = {"previous": A, "trial": B, "failed": {B: {"sglang": "0.5.10"}}}
    commands = [c.get_raw_value() for c in stack_ops.rollback_commands(
        VENV, "sglang", "sglang.service", record, A)]
    assert [c.split()[0] for c in commands] == ["mkdir", "ln", "systemctl", "mkdir"]
    assert '"trial": "bbbbbbbbbbbbbbbb"' in commands[0] and '"trial": null' in commands[3]
    assert f"venv.stacks/{A}" in commands[1]


def test_a_rollback_cut_short_is_planned_back_then_cleared():
    record = {"previous": A, "trial": B, "failed": {B: {"sglang": "0.5.10"}}}

    def plan(current):
        return op_commands(stack_ops.rollback_finished, venv_path=VENV, lock_file="/x",
                           service="sglang", unit="sglang.service",
                           facts={Stacks: read_of(current, {A: 1, B: 2}, record)})

    back = plan(B)
    assert len(back) == 3 and f"venv.stacks/{A}" in back[0] and "systemctl restart" in back[1]
    assert '"trial": null' in back[2] and '"previous": null' in back[2] and B in back[2]
    cleared = plan(A)
    assert len(cleared) == 2 and "systemctl restart" in cleared[0] and '"trial": null' in cleared[1]
    assert plan(A) and op_commands(
        stack_ops.rollback_finished, venv_path=VENV, lock_file="/x", service="sglang",
        unit="sglang.service", facts={Stacks: read_of(A, {A: 1}, {"failed": {}})}) == []


NOW = 1_000_000.0


@pytest.mark.parametrize("trial, current, until, probation_s, step", [
    (None, B, None, 600, stacks.Probation.NONE),  # nothing on trial
    (C, B, None, 600, stacks.Probation.NONE),  # the link names another stack
    (B, B, None, 600, stacks.Probation.START),  # the first good verdict: on probation
    (B, B, None, 0, stacks.Probation.PASSED),  # no probation: the trial ends at the verdict
    (B, B, NOW + 1, 600, stacks.Probation.WAIT),  # its window still runs
    (B, B, NOW, 600, stacks.Probation.PASSED),  # served the whole window
    (B, B, NOW - 5, 0, stacks.Probation.PASSED),
])
def test_probation(trial, current, until, probation_s, step):
    assert stacks.probation(trial, current, until, NOW, probation_s) is step


@pytest.mark.parametrize("trial, current, until, restarts, active, failed", [
    (B, B, NOW + 60, 1, "active", "restarted on its own 1 time since the switch"),
    (B, B, NOW + 60, 3, "activating", "restarted on its own 3 times"),
    (B, B, NOW + 60, 2, "failed", "failed for good on its own"),
    (B, B, None, 1, "active", "restarted on its own"),  # not judged yet: still on trial
    (B, B, NOW + 60, 0, "active", None),  # serving, no restart
    (B, B, NOW - 1, 4, "active", None),  # after the window: not the upgrade's failure
    (B, A, NOW + 60, 4, "failed", None),  # the link names another stack
    (None, B, None, 4, "failed", None),  # nothing on trial
])
def test_failed_on_probation(trial, current, until, restarts, active, failed):
    why = stacks.failed_on_probation(trial, current, until, NOW, restarts, active)
    assert (why is None) is (failed is None)
    assert failed is None or failed in why


@pytest.mark.parametrize("record, current, present, back", [
    ({"trial": B, "previous": A}, B, {A, B}, A),  # never judged: a crash loop goes back
    ({"trial": B, "previous": A, "trial_until": NOW + 60}, B, {A, B}, A),  # on probation
    ({"trial": B, "previous": A, "trial_until": NOW}, B, {A, B}, None),  # probation over
    ({"trial": B, "previous": A}, A, {A, B}, None),  # the link went back already
    ({"trial": B, "previous": A}, B, {B}, None),  # the previous stack is gone
    ({"trial": None, "previous": None}, B, {A, B}, None),  # nothing on trial
    ({"trial": B, "previous": B}, B, {B}, None),
    # A rollback cut short (the failed set recorded, the link still on it): back too.
    ({"trial": B, "previous": A, "failed": {B: {}}}, B, {A, B}, A),
])
def test_the_units_fallback_switches_back_only_a_stack_on_trial(record, current, present, back):
    from pve_sglang.remote.stack_fallback import fall_back

    assert fall_back(record, current, present, NOW) == back
