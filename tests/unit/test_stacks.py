"""Stacks side by side: the decisions (``pve_sglang.stack.switch_rules``) on tables, and the read of a
container's stacks (``facts.stacks.Stacks``) run with ``sh`` on real folders and links here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from harness import sh
from pve_sglang.facts.installed_stacks import Stacks
from pve_sglang.operations.stack_switch import link_command, record_command
from pve_sglang import remote
from pve_sglang.remote import rollback_rules as rules
from pve_sglang.remote import stack_fallback as fallback
from pve_sglang.stack import switch_rules as stacks
from pve_sglang.stack.switch_rules import (
    Found, Move, RollbackVerdict, StacksAt, SwitchPlan, Unfinished, decide_switch, found_of,
    rollback_verdict,
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
    (False, B, B, A, (A, B), True, RollbackVerdict.GOOD),
    (True, B, B, A, (A, B), True, RollbackVerdict.ROLL_BACK),
    # Not on trial (judged good before, or never switched): a failure as before, no rollback.
    (True, None, B, A, (A, B), True, RollbackVerdict.NOT_AN_UPGRADE),
    # The record says B, the link says A (a run killed before its rename): not an upgrade.
    (True, B, A, A, (A, B), True, RollbackVerdict.NOT_AN_UPGRADE),
    (True, B, B, A, (A, B), False, RollbackVerdict.KEEP_FAILED),
    # The rollback target is gone (removed by hand) or never complete.
    (True, B, B, A, (B,), True, RollbackVerdict.NO_TARGET),
    (True, B, B, None, (A, B), True, RollbackVerdict.NO_TARGET),
])
def test_judgement_after_the_verify_phase(failed, trial, current, previous, stacks_, rollback,
                                          verdict):
    assert rollback_verdict(failed, trial, current, previous, stacks_, rollback) is verdict


@pytest.mark.parametrize("found, failed, step", [
    # No trial, or a trial not recorded as failed (a switch, the judgement to come): nothing.
    (Found("link", current=B, stacks=(A, B), previous=A), (B,), None),
    (Found("link", current=B, stacks=(A, B), previous=A, trial=B), (), None),
    # Killed after the failed set was recorded, before the link went back: switch back.
    (Found("link", current=B, stacks=(A, B), previous=A, trial=B), (B,), Unfinished.SWITCH_BACK),
    # Killed after the link went back (before or after the restart), before the record's end.
    (Found("link", current=A, stacks=(A, B), previous=A, trial=B), (B,), Unfinished.FORGET_TRIAL),
    # The target is gone: the failed release stays (rollback_verdict says NO_TARGET).
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
    ({N1: True, N2: True}, B, B, A, True, RollbackVerdict.GOOD),
    ({N1: True, N2: False}, B, B, A, True, RollbackVerdict.ROLL_BACK),
    ({N1: True, N2: None}, B, B, A, True, RollbackVerdict.ROLL_BACK),
    ({N1: True, N2: False}, B, B, A, False, RollbackVerdict.KEEP_FAILED),
    # Not an upgrade on this node (no stack on trial): the group fails, nothing switches back.
    ({N1: True, N2: False}, None, B, A, True, RollbackVerdict.NOT_AN_UPGRADE),
])
def test_each_node_is_judged_by_its_group(passed, trial, current, previous, rollback, verdict):
    failed = bool(stacks.group_failed(passed))
    assert rollback_verdict(failed, trial, current, previous, (A, B), rollback) is verdict


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
def test_a_link_names_a_stack_of_ours_only(tmp_path, target, named):
    assert stacks.linked_id("/opt/sglang/venv", target) == named
    # The fallback reads a real link by the same rule, its folder where it runs: the table's
    # absolute targets moved under it.
    venv = tmp_path / "opt/sglang/venv"
    venv.parent.mkdir(parents=True)
    if target is not None:
        os.symlink(target.replace("/opt/sglang/", f"{venv.parent}/"), venv)
    assert fallback.linked(str(venv)) == named


def test_the_link_the_deploy_writes_is_the_one_the_fallback_writes_back(tmp_path):
    """The deploy's link (``link_command``) and the fallback's switch back (its ``link back``
    step) write the same target, read back as the stack it names on both sides."""
    venv = tmp_path / "opt/sglang/venv"
    venv.parent.mkdir(parents=True)
    sh(link_command(str(venv), A))
    assert os.readlink(venv) == stacks.link_target(str(venv), A) == f"venv.stacks/{A}"
    side = Fallback(tmp_path)
    side.layout(f"venv.stacks/{B}", {A, B}, {**ON_TRIAL, "trial_until": time.time() + 600})
    assert side.run(run=("link back",)) == SWITCH_BACK
    assert os.readlink(venv) == stacks.link_target(str(venv), A)
    assert stacks.linked_id(str(venv), os.readlink(venv)) == fallback.linked(str(venv)) == A


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
#: Its stacks, named by the service ``sglang``; a venv made before stacks named by a lock file.
STACKS = StacksAt(VENV, "sglang", "/x")
LOCKED = StacksAt(VENV, "sglang", "/opt/sglang/stack.lock")


def read_of(current: str | None, names: dict[str, float], state: dict | None = None,
            kind: str = "link") -> dict:
    return {"kind": kind, "target": f"venv.stacks/{current}" if current else None,
            "plain_lock": None, "plain_sglang": None,
            "stacks": {name: {"sglang": f"0.5.{int(mtime)}", "mtime": mtime}
                       for name, mtime in names.items()}, "state": state or {}}


def switch_commands(raw: dict, wanted: str, restart_on_change: bool = True,
                    active: str = "active") -> list:
    return op_commands(stack_ops.switch, stacks=LOCKED, unit="sglang.service", wanted=wanted,
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
    commands = op_commands(stack_ops.migrate, stacks=LOCKED,
                           copies={"/opt/sglang/stack.lock": "pve-sglang.lock"},
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
    assert op_commands(stack_ops.migrate, stacks=STACKS,
                       copies={}, facts={Stacks: read_of(A, {A: 1})}) == []


def test_a_plain_venv_moved_for_real_keeps_its_time_and_serves_through_the_link(tmp_path):
    venv = tmp_path / "opt/sglang/venv"
    (venv / "lib/python3.11/site-packages/sglang-0.5.9.dist-info").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "stack.lock").write_text("sglang==0.5.9 --hash=sha256:00\n")
    os.utime(venv, (1_600_000_000, 1_600_000_000))
    raw = read(tmp_path)
    command = op_commands(stack_ops.migrate,
                          stacks=StacksAt(str(venv), "sglang", str(tmp_path / "stack.lock")),
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
        return op_commands(stack_ops.retention, stacks=STACKS,
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
        return op_commands(stack_ops.not_failed, stacks=STACKS, wanted=B,
                           release="sglang 0.5.10", retry=retry,
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
        STACKS, "sglang.service", record, A)]
    assert [c.split()[0] for c in commands] == ["mkdir", "ln", "systemctl", "mkdir"]
    assert '"trial": "bbbbbbbbbbbbbbbb"' in commands[0] and '"trial": null' in commands[3]
    assert f"venv.stacks/{A}" in commands[1]


def test_a_rollback_cut_short_is_planned_back_then_cleared():
    record = {"previous": A, "trial": B, "failed": {B: {"sglang": "0.5.10"}}}

    def plan(current):
        return op_commands(stack_ops.rollback_finished, stacks=STACKS, unit="sglang.service",
                           facts={Stacks: read_of(current, {A: 1, B: 2}, record)})

    back = plan(B)
    assert len(back) == 3 and f"venv.stacks/{A}" in back[0] and "systemctl restart" in back[1]
    assert '"trial": null' in back[2] and '"previous": null' in back[2] and B in back[2]
    cleared = plan(A)
    assert len(cleared) == 2 and "systemctl restart" in cleared[0] and '"trial": null' in cleared[1]
    # Given the start's watch, the run follows that restart until the previous release serves
    # (as the verify phase's rollback does), after the record is cleared.
    for current, restart in ((B, 1), (A, 0)):
        waited = op_commands(stack_ops.rollback_finished, stacks=STACKS, unit="sglang.service",
                             watch=lambda: None,
                             facts={Stacks: read_of(current, {A: 1, B: 2}, record)})
        assert waited[:-1] == plan(current) and waited[-1] == ["serving", [], {}]
        assert "systemctl restart" in waited[restart]
    assert plan(A) and op_commands(
        stack_ops.rollback_finished, stacks=STACKS,
        unit="sglang.service", facts={Stacks: read_of(A, {A: 1}, {"failed": {}})}) == []


def test_a_trial_that_failed_while_no_run_was_there_is_rolled_back_and_waited_for():
    """A run killed before its verdict, the server restarted on its own since: the next run
    records the set, rolls back, and follows the previous release's start until it serves."""
    def plan(**more):
        return op_commands(stack_ops.rollback_finished, stacks=STACKS, unit="sglang.service",
                           facts={Stacks: read_of(B, {A: 1, B: 2}, {"previous": A, "trial": B}),
                                  UnitState: {"active": "active", "restarts": 1}}, **more)

    commands = plan(watch=lambda: None)
    assert commands[:-1] == plan() and len(commands) == 5
    assert "before its verdict" in commands[0] and f"venv.stacks/{A}" in commands[1]
    assert "systemctl restart" in commands[2] and commands[-1] == ["serving", [], {}]


NOW = 1_000_000.0


# --- the rollback rule (``remote/rollback_rules.py``), written once for both sides ----------

@pytest.mark.parametrize("until, open_", [
    (None, True),  # not judged yet: on trial until its verdict
    (NOW + 1, True),  # the second before its end
    (NOW, False),  # its end: the whole window served
    (NOW - 1, False),  # the second after
])
def test_the_probation_window_ends_at_its_exact_second(until, open_):
    assert rules.window_open(until, NOW) is open_
    assert rules.judged_on_probation(until, NOW) is (open_ and until is not None)


@pytest.mark.parametrize("trial, current, until, probation_s, step", [
    (None, B, None, 600, stacks.Probation.NONE),  # nothing on trial
    (C, B, None, 600, stacks.Probation.NONE),  # the link names another stack
    (B, B, None, 600, stacks.Probation.START),  # the first good verdict: on probation
    (B, B, None, 0, stacks.Probation.PASSED),  # no probation: the trial ends at the verdict
    (B, B, NOW + 1, 600, stacks.Probation.WAIT),  # the second before its end
    (B, B, NOW, 600, stacks.Probation.PASSED),  # served the whole window
    (B, B, NOW - 1, 600, stacks.Probation.PASSED),  # the second after
    (B, B, NOW - 5, 0, stacks.Probation.PASSED),
])
def test_probation(trial, current, until, probation_s, step):
    assert stacks.probation(trial, current, until, NOW, probation_s) is step


@pytest.mark.parametrize("trial, current, until, restarts, active, failed", [
    (B, B, NOW + 60, 1, "active", "restarted on its own 1 time since the switch, while on "
                                  "probation (upgrade_probation_s)"),
    (B, B, NOW + 60, 3, "activating", "restarted on its own 3 times"),
    (B, B, NOW + 60, 2, "failed", "failed for good on its own"),
    # Not judged yet: the run that switched was cut short before its verdict (whatever
    # upgrade_probation_s is, 0 too): said so, not "after its verdict ... upgrade_probation_s".
    (B, B, None, 1, "active", "restarted on its own 1 time since the switch, before its "
                              "verdict (the run that switched to it was cut short)"),
    (B, B, None, 3, "failed", "failed for good on its own (its start limit, after 3 automatic "
                              "restarts) before its verdict"),
    (B, B, NOW + 60, 0, "active", None),  # serving, no restart
    (B, B, NOW + 1, 4, "active", "restarted on its own 4 times"),  # the second before its end
    (B, B, NOW, 4, "active", None),  # at its end: not the upgrade's failure
    (B, B, NOW - 1, 4, "active", None),  # the second after
    (B, A, NOW + 60, 4, "failed", None),  # the link names another stack
    (None, B, None, 4, "failed", None),  # nothing on trial
])
def test_failed_on_probation(trial, current, until, restarts, active, failed):
    why = stacks.failed_on_probation(trial, current, until, NOW, restarts, active)
    assert (why is None) is (failed is None)
    assert failed is None or failed in why
    assert why is None or until is not None or "upgrade_probation_s" not in why


ON_TRIAL = {"trial": B, "previous": A}
JUDGED = {**ON_TRIAL, "trial_until": NOW + 60}


@pytest.mark.parametrize("record, current, present, now, rollback, result, act", [
    # A stack judged good that crashes on probation: switched back at its first crash.
    (JUDGED, B, {A, B}, NOW, True, "exit-code", rules.Act.SWITCH_BACK),
    (JUDGED, B, {A, B}, NOW, True, "signal", rules.Act.SWITCH_BACK),
    (JUDGED, B, {A, B}, NOW, True, "success", rules.Act.LEAVE),  # a clean stop
    # Not judged yet: the run that switched judges it (the start limit, if it was cut short).
    (ON_TRIAL, B, {A, B}, NOW, True, "exit-code", rules.Act.LEAVE),
    # Probation's end at its exact second: the second before, at, after.
    (JUDGED, B, {A, B}, NOW + 59, True, "exit-code", rules.Act.SWITCH_BACK),
    (JUDGED, B, {A, B}, NOW + 60, True, "exit-code", rules.Act.LEAVE),
    (JUDGED, B, {A, B}, NOW + 61, True, "exit-code", rules.Act.LEAVE),
    (JUDGED, A, {A, B}, NOW, True, "exit-code", rules.Act.LEAVE),  # the link went back already
    (JUDGED, B, {B}, NOW, True, "exit-code", rules.Act.LEAVE),  # no previous stack
    (JUDGED, B, {A, B}, NOW, False, "exit-code", rules.Act.LEAVE),  # upgrade_rollback: false
    ({}, B, {A, B}, NOW, True, "exit-code", rules.Act.LEAVE),  # nothing on trial
])
def test_a_crash_on_probation_switches_back_at_once(record, current, present, now, rollback,
                                                     result, act):
    assert rules.at_exit(record, current, present, now, rollback, result) is act
    # An exit the unit is not restarted on (a missing secret) is no release's fault.
    assert rules.at_exit(record, current, present, now, rollback, result, True) is rules.Act.LEAVE


@pytest.mark.parametrize("record, current, present, now, rollback, prevented, act", [
    (ON_TRIAL, B, {A, B}, NOW, True, False, rules.Act.SWITCH_BACK),  # never judged
    (JUDGED, B, {A, B}, NOW, True, False, rules.Act.SWITCH_BACK),  # on probation
    # A rollback cut short (the failed set recorded, the link still on it): back too.
    ({**ON_TRIAL, "failed": {B: {}}}, B, {A, B}, NOW, True, False, rules.Act.SWITCH_BACK),
    # Probation's end at its exact second: the second before, at, after.
    (JUDGED, B, {A, B}, NOW + 59, True, False, rules.Act.SWITCH_BACK),
    (JUDGED, B, {A, B}, NOW + 60, True, False, rules.Act.RESTART),
    (JUDGED, B, {A, B}, NOW + 61, True, False, rules.Act.RESTART),
    # Not on trial (it served its whole window, or none was ever): the best there is, started
    # again after a growing pause, never given up; unless restarting cannot help.
    ({}, B, {A, B}, NOW, True, False, rules.Act.RESTART),
    ({"trial": None, "previous": A}, B, {A, B}, NOW, True, False, rules.Act.RESTART),
    ({}, B, {A, B}, NOW, True, True, rules.Act.LEAVE),
    ({"trial": B, "previous": A}, A, {A, B}, NOW, True, False, rules.Act.RESTART),  # link back
    ({"trial": B, "previous": A}, B, {B}, NOW, True, False, rules.Act.RESTART),  # no target
    ({"trial": B, "previous": B}, B, {B}, NOW, True, False, rules.Act.RESTART),
    # upgrade_rollback: false: the failed release is kept for debugging, as the deploy keeps it.
    (JUDGED, B, {A, B}, NOW, False, False, rules.Act.LEAVE),
])
def test_the_start_limit_switches_back_a_stack_on_trial_else_restarts(
        record, current, present, now, rollback, prevented, act):
    assert rules.at_start_limit(record, current, present, now, rollback, prevented) is act


@pytest.mark.parametrize("loop, now, restarts, pause", [
    (None, NOW, 1, 20.0),  # the first start limit: RestartSec (10 s) doubled
    ({"since": NOW - 100, "restarts": 1, "last": NOW - 50}, NOW, 2, 40.0),
    ({"since": NOW - 100, "restarts": 5, "last": NOW - 50}, NOW, 6, 600.0),  # 640: capped
    ({"since": NOW - 100, "restarts": 20, "last": NOW - 50}, NOW, 21, 600.0),  # never gives up
    # A failure LOOP_RESET_S after the loop's last start is a new loop: the second before, at.
    ({"since": NOW - 9999, "restarts": 4, "last": NOW - rules.LOOP_RESET_S + 1}, NOW, 5, 320.0),
    ({"since": NOW - 9999, "restarts": 4, "last": NOW - rules.LOOP_RESET_S}, NOW, 1, 20.0),
])
def test_a_crash_loop_pause_doubles_up_to_its_cap(loop, now, restarts, pause):
    after = rules.loop_after(loop, now, 10.0)
    assert (after["restarts"], after["pause_s"]) == (restarts, pause)
    assert after["last"] == now + pause
    assert after["since"] == (loop["since"] if loop and restarts > 1 else now)


# --- the uploaded fallback, run as systemd runs it, against a stand-in ``systemctl`` --------

#: ``systemctl`` as the fallback calls it: ``show -pNAME... UNIT`` answers NAME=value lines (from
#: the folder's ``show`` file), ``list-jobs --no-legend UNIT`` the jobs (``jobs``); every call is
#: logged (``calls``). ``systemd-run`` logs its call too (the unit it would start runs apart).
STANDIN_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$STANDIN/calls"
case "$1" in
  show) cat "$STANDIN/show" ;;
  list-jobs) cat "$STANDIN/jobs" 2>/dev/null ;;
esac
"""
STANDIN_SYSTEMD_RUN = """#!/bin/sh
echo "systemd-run $*" >> "$STANDIN/calls"
"""


class Fallback:
    """``stack_fallback.py`` staged with its companions alone (``remote.stage``), on a stacks
    folder, link and record in TMP; run by a Python without site-packages (``-I -S``: only the
    standard library and what was uploaded), ``systemctl`` a stand-in."""

    def __init__(self, tmp):
        self.tmp, self.venv = tmp, str(tmp / "opt/sglang/venv")
        self.state = tmp / "state.json"
        self.script = remote.stage(remote.STACK_FALLBACK, tmp / "tools")
        self.standin = tmp / "standin"
        (self.standin / "bin").mkdir(parents=True)
        for name, text in (("systemctl", STANDIN_SYSTEMCTL), ("systemd-run", STANDIN_SYSTEMD_RUN)):
            (self.standin / "bin" / name).write_text(text)
            (self.standin / "bin" / name).chmod(0o755)
        self.unit(ActiveState="failed", Result="exit-code", ExecMainStatus="1", NRestarts="3",
                  RestartUSec="10s")

    def unit(self, jobs: str = "", **shown: str) -> None:
        (self.standin / "show").write_text("".join(f"{k}={v}\n" for k, v in shown.items()))
        (self.standin / "jobs").write_text(jobs)

    def layout(self, link: str | None, complete: set[str], record: dict | None) -> None:
        for name in (A, B):
            folder = self.tmp / "opt/sglang/venv.stacks" / name
            folder.mkdir(parents=True, exist_ok=True)
            release = folder / stacks.RELEASE_FILE
            if name in complete:
                release.write_text(json.dumps({"sglang": f"0.5.{'9' if name == A else '10'}"}))
            elif release.exists():
                release.unlink()
        if os.path.lexists(self.venv):
            os.unlink(self.venv)
        if link:
            os.symlink(link, self.venv)
        if record is None:
            self.state.unlink(missing_ok=True)
        else:
            self.state.write_text(json.dumps(record))

    def run(self, *flags: str, now: float | None = None, run: tuple[str, ...] = (),
            environment: dict | None = None) -> list[str]:
        """The names of the steps the fallback would take (FLAGS: its own, ``--on-exit``...),
        and those named in RUN taken."""
        argv = ["--unit", "sglang.service", "--venv-path", self.venv, "--state",
                str(self.state), "--no-restart-status", "78", *flags]
        code = (f"import json, sys; sys.path.insert(0, {str(self.script.parent)!r}); "
                "import stack_fallback as f; "
                f"steps = f.steps(f.arguments({argv!r}), now={now!r}); "
                "print(json.dumps([name for name, _ in steps])); "
                f"[step() for name, step in steps if name in {list(run)!r}]")
        env = {"PATH": f"{self.standin / 'bin'}:{os.environ['PATH']}",
               "STANDIN": str(self.standin), **(environment or {})}
        done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                              text=True, env=env, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    def calls(self) -> list[str]:
        path = self.standin / "calls"
        return [line for line in path.read_text().splitlines() if not line.startswith(
            ("show", "list-jobs"))] if path.exists() else []

    def record(self) -> dict:
        return json.loads(self.state.read_text())


SWITCH_BACK = ["record the failed set", "link back", "reset the start limit", "queue the start",
               "clear the trial"]
RESTART = ["record the crash loop", "pause", "start again"]


def deploy_sees(tmp_path, rollback: bool) -> str:
    """What the deploy's next run does with this failure (the server restarted on its own, its
    start limit reached), from its own read of the folder (the ``Stacks`` fact run with sh):
    ``switch back``, ``record`` (a failed upgrade kept), or ``nothing`` (not an upgrade's)."""
    raw = read(tmp_path)
    commands = op_commands(stack_ops.rollback_finished,
                           stacks=StacksAt(str(tmp_path / "opt/sglang/venv"), "sglang", "/x"),
                           unit="sglang.service",
                           rollback=rollback,
                           facts={Stacks: raw, UnitState: {"active": "failed", "restarts": 3}})
    if any(f"venv.stacks/{A}" in command for command in commands):
        return "switch back"
    return "record" if commands else "nothing"


@pytest.mark.parametrize("link, complete, record, until_s, rollback, deploy, fallback", [
    # On trial, never judged (a run cut short before its verdict), or judged and on probation.
    (f"venv.stacks/{B}", {A, B}, ON_TRIAL, None, True, "switch back", SWITCH_BACK),
    (f"venv.stacks/{B}", {A, B}, ON_TRIAL, 600, True, "switch back", SWITCH_BACK),
    # The link written absolute: read the same on both sides.
    ("{venv}.stacks/" + B, {A, B}, ON_TRIAL, 600, True, "switch back", SWITCH_BACK),
    # After the window: not the upgrade's failure; the fallback restarts it, after a pause.
    (f"venv.stacks/{B}", {A, B}, ON_TRIAL, -600, True, "nothing", RESTART),
    # upgrade_rollback: false: recorded and kept on both sides.
    (f"venv.stacks/{B}", {A, B}, ON_TRIAL, 600, False, "record", []),
    # The previous stack is not complete: no target on either side.
    (f"venv.stacks/{B}", {B}, ON_TRIAL, 600, True, "record", RESTART),
    # The link names the previous stack already; no record at all.
    (f"venv.stacks/{A}", {A, B}, ON_TRIAL, 600, True, "nothing", RESTART),
    (f"venv.stacks/{B}", {A, B}, None, None, True, "nothing", RESTART),
])
def test_the_uploaded_fallback_and_the_deploy_give_one_verdict_with_a_standin_systemctl(
        tmp_path, link, complete, record, until_s, rollback, deploy, fallback):
    """The rollback rule is written once (``rollback_rules``): the deploy's next run, reading
    the folder its way, and the fallback uploaded beside its companion, reading it its own,
    decide the same on each row (the fallback switches back exactly where the deploy would)."""
    side = Fallback(tmp_path)
    if record is not None and until_s is not None:
        record = {**record, "trial_until": time.time() + until_s}
    side.layout(link.format(venv=side.venv), complete, record)
    flags = () if rollback else ("--keep-failed",)
    assert side.run(*flags) == fallback
    assert deploy_sees(tmp_path, rollback) == deploy
    assert (deploy == "switch back") is (fallback == SWITCH_BACK)


def test_the_fallbacks_switch_back_keeps_the_reason_the_deploy_recorded_with_a_standin_systemctl(
        tmp_path):
    """A rollback cut after its first step (the failed set recorded with the deploy's reason,
    the link still on it), then the crash loop's start limit: systemd's switch back keeps the
    deploy's reason, and notes its own for the next run to report."""
    side = Fallback(tmp_path)
    ours = {"sglang": "0.5.10", "when": "2026-12-04 06:00:00 UTC",
            "why": "sglang.service stopped running: failed/exit-code (the deploy's watch)"}
    side.layout(f"venv.stacks/{B}", {A, B}, {**ON_TRIAL, "failed": {B: ours}})
    assert side.run(run=tuple(SWITCH_BACK)) == SWITCH_BACK
    assert os.readlink(side.venv) == f"venv.stacks/{A}"
    record = side.record()
    assert record["failed"] == {B: ours}
    assert record["trial"] is None and record["previous"] is None
    assert record["fell_back"]["from"] == B and "failed for good while on trial" in \
        record["fell_back"]["why"]
    assert side.calls() == ["reset-failed sglang.service", "restart --no-block sglang.service"]


def test_a_crash_on_probation_is_switched_back_at_its_first_exit_with_a_standin_systemctl(
        tmp_path):
    """The unit's ExecStopPost= (``--on-exit``), its process ended with systemd's
    ``$SERVICE_RESULT``: a stack judged good, on probation, that crashed goes back at once; a
    stop someone asked for (a job on the unit) or a clean exit leaves it."""
    side = Fallback(tmp_path)
    judged = {**ON_TRIAL, "failed": {}, "trial_until": time.time() + 600}
    side.layout(f"venv.stacks/{B}", {A, B}, judged)
    crashed = {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "1"}
    assert side.run("--on-exit", environment={"SERVICE_RESULT": "success"}) == []
    assert side.run("--on-exit", environment={**crashed, "EXIT_STATUS": "78"}) == []
    side.unit(jobs="123 sglang.service restart running\n")
    assert side.run("--on-exit", environment=crashed) == []
    side.unit()
    assert side.run("--on-exit", environment=crashed, run=tuple(SWITCH_BACK)) == SWITCH_BACK
    assert os.readlink(side.venv) == f"venv.stacks/{A}"
    record = side.record()
    why = record["failed"][B]["why"]
    assert "crashed on probation (Result=exit-code, exited 1), its first crash" in why, why
    assert record["fell_back"] == {"from": B, "to": A, "when": record["failed"][B]["when"],
                                   "why": why}
    assert record["trial"] is None and "trial_until" not in record
    # The unit is still stopping: its start runs apart (systemd-run), once it stopped, instead
    # of the automatic restart's RestartSec.
    reset, start = side.calls()
    assert reset == "reset-failed sglang.service"
    assert start.startswith("systemd-run --no-block --collect --quiet ") and \
        start.endswith(f"stack_fallback.py --unit sglang.service --venv-path {side.venv} "
                       f"--state {side.state} --start-once-stopped"), start
    # Before its verdict the run that switched judges it: the exit leaves it.
    side.layout(f"venv.stacks/{B}", {A, B}, ON_TRIAL)
    assert side.run("--on-exit", environment=crashed) == []


@pytest.mark.parametrize("active, sub, started", [
    ("activating", "auto-restart", True),  # waits for its automatic restart: started now
    ("failed", "failed", True),
    ("inactive", "dead", True),
    ("active", "running", False),  # started meanwhile by someone: left
    ("activating", "start", False),
])
def test_the_switch_backs_start_waits_for_the_stop_with_a_standin_systemctl(tmp_path, active, sub,
                                                                          started):
    """``--start-once-stopped``, run apart by ``systemd-run`` as the uploaded script runs
    (``-E -S``: its folder, the standard library and nothing else)."""
    side = Fallback(tmp_path)
    side.unit(ActiveState=active, SubState=sub)
    env = {"PATH": f"{side.standin / 'bin'}:{os.environ['PATH']}", "STANDIN": str(side.standin)}
    done = subprocess.run([sys.executable, "-E", "-S", str(side.script), "--unit", "sglang.service",
                           "--venv-path", side.venv, "--state", str(side.state),
                           "--start-once-stopped"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert side.calls() == (["reset-failed sglang.service", "restart --no-block sglang.service"]
                            if started else []), done.stdout


def test_a_crash_loop_after_probation_is_started_again_never_given_up_with_a_standin_systemctl(
        tmp_path):
    """A release that served its whole window and crash-loops: at each start limit the
    fallback records the loop (the next run reports it) and starts it again after a pause
    that doubles; a server started meanwhile, a missing secret, are left alone."""
    side = Fallback(tmp_path)
    side.layout(f"venv.stacks/{B}", {A, B}, {"trial": None, "previous": A, "failed": {}})
    now = time.time()
    assert side.run(now=now, run=("record the crash loop", "start again")) == RESTART
    loop = side.record()["crash_loop"]
    assert (loop["restarts"], loop["pause_s"]) == (1, 20.0)
    assert "failed for good (Result=exit-code, exit status 1, after 3 automatic" in loop["why"]
    assert side.calls() == ["reset-failed sglang.service", "start --no-block sglang.service"]
    side.run(now=now + 60, run=("record the crash loop",))
    assert (side.record()["crash_loop"]["restarts"], side.record()["crash_loop"]["pause_s"]) \
        == (2, 40.0)
    assert side.record()["crash_loop"]["since"] == loop["since"]
    # RestartSec as the unit has it (a drop-in's 1 s): the pause doubles from there.
    side.unit(ActiveState="failed", Result="exit-code", ExecMainStatus="1", RestartUSec="1s")
    side.layout(f"venv.stacks/{B}", {A, B}, {})
    side.run(now=now, run=("record the crash loop",))
    assert side.record()["crash_loop"]["pause_s"] == 2.0
    # Started by someone before the fallback ran, or a missing secret (exit 78): nothing.
    side.unit(ActiveState="active")
    assert side.run() == []
    side.unit(ActiveState="failed", Result="exit-code", ExecMainStatus="78")
    assert side.run() == []
