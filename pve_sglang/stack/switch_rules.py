"""
Stacks side by side in a container, and what a run does with them (pure functions).

Each stack is a venv of its own, named by its lock id, in the folder ``<venv_path>.stacks``;
``venv_path`` is a symlink to the one the server runs. A new stack is built beside the serving
one, untouched; the switch is one rename of a symlink, then one restart. A new stack is on
trial until the verify phase judged it: a failed start, a stall, a crash loop or a degenerate
answer switches back to the previous stack. The nodes of a model served by several
(``nodes``) switch in the same run and share one verdict: one failed node rolls them all back.
Every decision here is a row of ``tests/unit/test_stacks.py``.
"""

from __future__ import annotations

import hashlib
from enum import Enum
from typing import NamedTuple

from pve_sglang.remote import TOOLS
# The rollback rule, the stacks' names and their link, written once for the deploy and the
# server's own fallback (``remote/stack_fallback.py``, uploaded with it).
from pve_sglang.remote.rollback_rules import (  # noqa: F401 (the deploy's names for them)
    RELEASE_FILE, STACK_NAME, SUFFIX, RollbackVerdict, failure_verdict, has_target, link_target,
    linked_id, rollback_verdict, stacks_dir, window_open,
)
#: The deploy's record of a container's stacks: the previous one (the rollback target), the one
#: on trial, and the sets that failed.
STATE_DIR = "/var/lib/pve-sglang"
#: The lock file of a venv made before stacks, as the deploy wrote it (names that venv).
LEGACY_LOCK_FILE = f"{TOOLS}/stack.lock"


def stack_path(venv_path: str, stack_id: str) -> str:
    """The venv of stack STACK_ID."""
    if not STACK_NAME.match(stack_id):
        raise ValueError(f"{stack_id!r} is not a stack id (16 hex digits)")
    return f"{stacks_dir(venv_path)}/{stack_id}"


def state_path(service: str) -> str:
    """The record of the stacks of SERVICE's container (previous, on trial, failed sets)."""
    return f"{STATE_DIR}/{service}-stacks.json"


def unlocked_id(sglang_version: str) -> str:
    """The id of a stack of sglang alone (``stack_install: sglang-no-deps``, no lock): a digest
    of what it installs, in the form of a lock id."""
    return hashlib.sha256(f"sglang-no-deps sglang=={sglang_version}".encode()).hexdigest()[:16]


class Found(NamedTuple):
    """What a run reads of a container's stacks (``facts.installed_stacks.Stacks``)."""

    #: ``venv_path`` is: "link" (to a stack), "plain" (a venv of the time before stacks),
    #: "missing", or "other" (a file, or a link to something not ours).
    kind: str
    #: The stack the link names (kind "link").
    current: str | None = None
    #: The lock id of the plain venv's last install (its lock file's digest), when complete.
    plain_lock: str | None = None
    #: The complete stacks in the folder (each with its release file), by name.
    stacks: tuple[str, ...] = ()
    #: The previous stack, the one on trial (the state record).
    previous: str | None = None
    trial: str | None = None

    @property
    def named(self) -> str | None:
        """The stack ``venv_path`` names: the link's, or the plain venv's lock id; None for a
        missing or foreign ``venv_path``."""
        return {"link": self.current, "plain": self.plain_lock}.get(self.kind)


def found_of(venv_path: str, raw: dict) -> Found:
    """The pure view (``Found``) of a ``Stacks`` read: a plain venv named by its lock,
    or by its sglang release when it was installed without a lock."""
    kind, current = raw["kind"], None
    if kind == "link":
        current = linked_id(venv_path, raw.get("target"))
        if current is None:
            kind = "other"
    plain = raw.get("plain_lock") or (
        unlocked_id(raw["plain_sglang"]) if raw.get("plain_sglang") else None)
    record = raw.get("state") or {}
    return Found(kind=kind, current=current, plain_lock=plain if kind == "plain" else None,
                 stacks=tuple(sorted(raw.get("stacks") or {})),
                 previous=record.get("previous"), trial=record.get("trial"))


def release_words(raw: dict, stack_id: str | None) -> str:
    """``sglang 0.5.9 (stack 68a87c7696509d54)`` from a stack's release file, as a ``Stacks``
    read (RAW) holds it: how the operations' messages name a stack."""
    if stack_id is None:
        return "no stack"
    release = (raw.get("stacks") or {}).get(stack_id, {}).get("sglang")
    return f"sglang {release} (stack {stack_id})" if release else f"stack {stack_id}"


class Move(Enum):
    NONE = "none"  # the link names the wanted stack: nothing to switch
    FIRST = "first"  # no server ran from a stack yet: make the link (the server starts anyway)
    SWITCH = "switch"  # the wanted stack, built beside, replaces the serving one: one restart
    PENDING = "pending"  # the switch waits: restart_on_change is false


class SwitchPlan(NamedTuple):
    move: Move
    #: The stack the server runs before the switch (None: none of ours yet).
    previous: str | None


def migration(found: Found) -> str | None:
    """
    The stack id a plain venv at ``venv_path`` (the time before stacks) becomes, moved into the
    stacks folder without reinstalling, before anything is built: the id of its last complete
    install (its lock file's digest, or its sglang release without a lock). None: nothing to
    move. A plain venv whose install the deploy cannot name (cut short, no lock file) is not
    moved: ValueError.
    """
    if found.kind == "other":
        raise ValueError("venv_path is neither a venv nor a link to one of the deploy's stacks")
    if found.kind != "plain":
        return None
    if found.plain_lock is None:
        raise ValueError("venv_path is a venv whose install the deploy cannot name (cut short, "
                         "or no lock file)")
    return found.plain_lock


def decide_switch(found: Found, wanted: str, restart_on_change: bool,
                  serving: bool) -> SwitchPlan:
    """
    What the run does with ``venv_path`` to run stack WANTED.

    + found: the container's stacks as read (a plain venv counts as the stack it is moved to
      by ``migration``, first)
    + wanted: the stack id of the settings (the lock's id)
    + restart_on_change: false holds a switch back while the server runs (restart pending)
    + serving: the server runs now (a switch would restart it)
    """
    if found.kind == "other":
        raise ValueError("venv_path is neither a venv nor a link to one of the deploy's stacks")
    current = found.named
    if current == wanted:
        return SwitchPlan(Move.NONE, current)
    if current is None:
        return SwitchPlan(Move.FIRST, None)
    if not serving or restart_on_change:
        return SwitchPlan(Move.SWITCH, current)
    return SwitchPlan(Move.PENDING, current)


class Unfinished(Enum):
    """A rollback cut short (``unfinished_rollback``): what is left of it."""

    SWITCH_BACK = "switch_back"  # the failed set is recorded; the link still names it
    FORGET_TRIAL = "forget_trial"  # the link went back; the record still holds the trial


def unfinished_rollback(found: Found, failed: tuple[str, ...]) -> Unfinished | None:
    """
    What a run finishes of a rollback killed midway, before anything else. The rollback
    (``stack_switch.rollback_commands``) records the failed set with the trial and its target
    still in the record, then renames the link back, restarts, and clears the trial last: so a
    trial recorded as failed (in FAILED) while the link names it is a rollback to finish (the
    failed record is never read as "rolled back" while the link names it), and one the link no
    longer names is a finished rollback whose record was not cleared. None: nothing cut short.
    """
    if found.trial is None or found.trial not in failed:
        return None
    if found.current != found.trial:
        return Unfinished.FORGET_TRIAL
    if not has_target(found.current, found.previous, found.stacks):
        return None  # no target: the failed release stays, as rollback_verdict's NO_TARGET says
    return Unfinished.SWITCH_BACK


# --- several nodes (``nodes``): one model, one TP group, switched and judged together --------


def group_failed(passed: dict[str, bool | None]) -> tuple[str, ...]:
    """
    The nodes that fail their group, in the group's order. PASSED: each node of the group
    (``nodes``) with True (its start and answer were judged good), False (its start or its
    answer failed) or None (it left the run before its judgement: an earlier operation failed
    on it). One failed node fails them all: a TP group half on each release, or with a rank
    down, cannot serve, so every node is judged (and rolled back) by the same verdict.
    """
    return tuple(name for name, ok in passed.items() if ok is not True)


def not_together(nodes: list[str], in_run: set[str], current: str | None,
                 wanted: str) -> tuple[str, ...]:
    """
    The nodes of the group (NODES) that are not in this run (IN_RUN: the hosts the run
    deploys), when the run would switch this node from the serving stack CURRENT to WANTED:
    a node must not switch alone (``--limit``, a node that failed earlier in the run). Empty:
    go on (a run that switches nothing, or a first install, changes no serving release).
    """
    if current is None or current == wanted:
        return ()
    return tuple(name for name in nodes if name not in in_run)


def refused(failed_sets: dict[str, dict], wanted: str, retry: bool) -> dict | None:
    """The record of WANTED in FAILED_SETS (``{id: {"sglang", "when", "why"}}``) when the run
    must stop before any change: the set failed before, and RETRY (``retry_failed_stack``)
    was not asked. None: go on."""
    if retry:
        return None
    return failed_sets.get(wanted)


def after_switch(current: str | None, previous: str | None, wanted: str,
                 restart_on_change: bool) -> tuple[str | None, str | None]:
    """The serving stack and the rollback target once this run's switch is done: CURRENT stays
    serving while the switch waits (restart_on_change false); else WANTED serves, and the
    stack it replaced becomes the rollback target."""
    if current == wanted:
        return wanted, previous
    if not restart_on_change:
        return current, previous
    return wanted, current


def retention_waits(trial: str | None, current: str | None, serving: str | None) -> bool:
    """Whether the removal of stacks waits for the verdict: a stack is on trial (TRIAL), or
    this run switches (CURRENT, the link now, is not SERVING, the stack after the switch). A
    failed upgrade must find its rollback target, and a good previous stack must not be gone
    for a set that then fails."""
    return trial is not None or current != serving


def to_remove(stacks: dict[str, float], keep: int, serving: str | None,
              rollback: str | None, wanted: str, failed: tuple[str, ...] = ()) -> list[str]:
    """
    The stacks to remove: all but the KEEP newest (STACKS: ``{id: mtime}``), where the serving
    one, the rollback target and the WANTED one (being built, or on trial) always count among
    the kept, first. A set that FAILED as an upgrade never counts among the newest: a good
    older stack is kept in its place. Only names of ours (``STACK_NAME``) are ever listed.
    """
    ours = {name: mtime for name, mtime in stacks.items() if STACK_NAME.match(name)}
    kept = [name for name in dict.fromkeys((serving, rollback, wanted)) if name in ours]
    for name in sorted(ours, key=lambda name: ours[name], reverse=True):
        if len(kept) >= keep:
            break
        if name not in kept and name not in failed:
            kept.append(name)
    return sorted(name for name in ours if name not in kept)


class StacksAt(NamedTuple):
    """Where a container's stacks are, and what names them: the one value the operations that
    read and change them take (``operations/stack_switch.py``), made from the settings by
    ``ServerView.stacks_at``."""

    #: The ``venv_path`` setting: the link to the serving stack, the stacks folder beside it.
    venv_path: str
    #: The server's service name: it names the stacks' state record (``state_path``).
    service: str
    #: The lock file of a venv made before stacks, as the deploy wrote it (names that venv).
    lock_file: str = LEGACY_LOCK_FILE

    def read_args(self) -> tuple[str, str, str]:
        """The ``Stacks`` read's arguments (the container's one read folds it)."""
        return (self.venv_path, self.lock_file, state_path(self.service))


# --- probation (``upgrade_probation_s``): a new stack stays on trial after its verdict --------


class Probation(Enum):
    """What the verify phase does with a stack on trial that served and answered
    (``probation``)."""

    NONE = "none"  # no stack on trial (or the link names another one)
    START = "start"  # judged good now: on trial until upgrade_probation_s from now
    WAIT = "wait"  # judged good before, its probation still runs: stays on trial
    PASSED = "passed"  # served the whole window without a crash or restart: the trial ends


def probation(trial: str | None, current: str | None, until: float | None, now: float,
              probation_s: int) -> Probation:
    """
    The trial of stack TRIAL (the link names CURRENT) after a good verdict at NOW: UNTIL is the
    end of its probation (the record's ``trial_until``, set at its first good verdict; None:
    never judged good). PROBATION_S: ``upgrade_probation_s`` (0: the trial ends at the verdict).
    """
    if trial is None or trial != current:
        return Probation.NONE
    if until is None:
        return Probation.START if probation_s > 0 else Probation.PASSED
    return Probation.WAIT if window_open(until, now) else Probation.PASSED


def failed_on_probation(trial: str | None, current: str | None, until: float | None, now: float,
                        restarts: int, active: str | None) -> str | None:
    """
    Why the stack on trial failed since its switch, as a later run sees it (before it changes
    anything), or None: the link names TRIAL, its trial runs (``window_open``: UNTIL, the
    record's ``trial_until``, is None, never judged, or after NOW), and its unit restarted on its
    own (RESTARTS: ``NRestarts``, counted since the last start the deploy made: the switch's) or
    failed for good (ACTIVE: ``failed``). A failure after the probation is not an upgrade's.
    """
    if trial is None or trial != current or not window_open(until, now):
        return None
    # Never judged: the run that switched was cut short before its verdict, whatever
    # upgrade_probation_s says.
    when = ("before its verdict (the run that switched to it was cut short)" if until is None
            else "while on probation (upgrade_probation_s)")
    if active == "failed":
        return (f"the server failed for good on its own (its start limit, after {restarts} "
                f"automatic restarts) {when}")
    if restarts > 0:
        return (f"the server restarted on its own {restarts} time{'s' if restarts > 1 else ''} "
                f"since the switch, {when}")
    return None
