"""The rollback rule, written once: when a failed stack on trial goes back to the previous stack,
and what a server that keeps failing gets instead, with the stacks' folder and the link that
names one (pure functions, the standard library only).

Both sides decide with this module: the deploy (``stack.switch_rules``, the verify phase and the
start of each run) and the server's own fallback, which systemd runs without a deploy run
(``stack_fallback.py``, uploaded with this module beside it: ``remote.COMPANIONS``). Every rule
is a row of ``tests/unit/test_stacks.py``, which also runs the uploaded copy and the deploy's side on
one table.
"""

from __future__ import annotations

import posixpath
import re
from enum import Enum

#: A stack's name: a lock id (16 hex digits). Nothing else in the stacks folder is ours.
STACK_NAME = re.compile(r"^[0-9a-f]{16}$")
#: The folder of a deploy's stacks, beside ``venv_path``.
SUFFIX = ".stacks"
#: What a stack says about itself, written once it is complete (built, locked, patched).
RELEASE_FILE = "pve-sglang-stack.json"
#: A crash loop after probation: the server's fallback starts it again after a pause that
#: doubles from the unit's ``RestartSec`` at each start limit, up to MAX_PAUSE_S, and never gives
#: up; a failure more than LOOP_RESET_S after its last such start begins a new loop.
MAX_PAUSE_S = 600.0
LOOP_RESET_S = 3600.0


def stacks_dir(venv_path: str) -> str:
    """The folder of VENV_PATH's stacks: ``/opt/sglang/venv`` -> ``/opt/sglang/venv.stacks``."""
    return venv_path.rstrip("/") + SUFFIX


def link_target(venv_path: str, stack_id: str) -> str:
    """What the ``venv_path`` symlink holds: relative, so that it reads the same from the
    container's host (``<rootfs>/opt/sglang/venv``)."""
    return f"{posixpath.basename(venv_path.rstrip('/'))}{SUFFIX}/{stack_id}"


def linked_id(venv_path: str, target: str | None) -> str | None:
    """The stack a ``venv_path`` symlink's TARGET names (relative or absolute), or None when it
    names none of ours."""
    if not target:
        return None
    folder, _, name = target.rstrip("/").rpartition("/")
    ours = (posixpath.basename(stacks_dir(venv_path)), stacks_dir(venv_path))
    return name if folder in ours and STACK_NAME.match(name) else None


class RollbackVerdict(Enum):
    GOOD = "good"  # served and answered: nothing to do (or the trial ends)
    ROLL_BACK = "roll_back"  # a failed upgrade: switch back to the previous stack
    KEEP_FAILED = "keep_failed"  # a failed upgrade kept on purpose (upgrade_rollback: false)
    NO_TARGET = "no_target"  # a failed upgrade with no stack to go back to
    NOT_AN_UPGRADE = "not_an_upgrade"  # failed, but no stack is on trial: reported as today


def window_open(until: float | None, now: float) -> bool:
    """Whether a trial still runs at NOW: UNTIL is the end of its probation (the record's
    ``trial_until``; None: not judged yet, on trial until its verdict). The second of UNTIL
    itself is after the window: a release that served until then served its whole window."""
    return until is None or now < float(until)


def judged_on_probation(until: float | None, now: float) -> bool:
    """Whether a trial was judged good (UNTIL set at its verdict) and its probation runs at NOW."""
    return until is not None and window_open(until, now)


def has_target(current: str | None, previous: str | None, stacks) -> bool:
    """Whether there is a stack to go back to: PREVIOUS, complete (in STACKS), not CURRENT."""
    return previous is not None and previous != current and previous in stacks


def rollback_verdict(failed: bool, trial: str | None, current: str | None, previous: str | None,
                     stacks, rollback: bool) -> RollbackVerdict:
    """
    What follows a judgement of the server's start and answer.

    + failed: the server failed (the startup watch or the generation check; for a node of
      several: on any node of its group)
    + trial: the stack on trial (switched to and not through its window yet), from the record
    + current: the stack the link names; previous: the rollback target
    + stacks: the complete stacks in the folder
    + rollback: ``upgrade_rollback``
    """
    if not failed:
        return RollbackVerdict.GOOD
    if trial is None or trial != current:
        return RollbackVerdict.NOT_AN_UPGRADE
    if not rollback:
        return RollbackVerdict.KEEP_FAILED
    if not has_target(current, previous, stacks):
        return RollbackVerdict.NO_TARGET
    return RollbackVerdict.ROLL_BACK


def failure_verdict(record: dict, current: str | None, stacks, now: float,
                    rollback: bool) -> RollbackVerdict:
    """The verdict on a failure of the server at NOW, seen after the run that switched (the
    next run, or the server's fallback): an upgrade's while the stack the link names (CURRENT)
    is the RECORD's trial and its window runs (``window_open``); else not an upgrade's."""
    if not window_open(record.get("trial_until"), now):
        return RollbackVerdict.NOT_AN_UPGRADE
    return rollback_verdict(True, record.get("trial"), current, record.get("previous"), stacks,
                            rollback)


class Act(Enum):
    """What the server's fallback does when the server's process ends or its start limit
    stopped it."""

    SWITCH_BACK = "switch_back"  # back to the previous stack, started at once
    RESTART = "restart"  # the best there is: started again after a growing pause
    LEAVE = "leave"  # nothing: a clean stop, a trial the deploy is judging, a release kept


def at_exit(record: dict, current: str | None, stacks, now: float, rollback: bool,
            result: str, restart_prevented: bool = False) -> Act:
    """
    The server's process ended with RESULT (systemd's ``$SERVICE_RESULT``, the unit's
    ``ExecStopPost=``): a stack judged good and on probation is switched back at its first
    crash, the previous release started at once. Before its verdict the run that switched it
    is judging it (a run cut short before it leaves it to the start limit, ``at_start_limit``).
    RESTART_PREVENTED: its exit status is one the unit is not restarted on (a missing secret:
    no release's fault).
    """
    if result == "success" or restart_prevented or \
            not judged_on_probation(record.get("trial_until"), now):
        return Act.LEAVE
    verdict = failure_verdict(record, current, stacks, now, rollback)
    return Act.SWITCH_BACK if verdict is RollbackVerdict.ROLL_BACK else Act.LEAVE


def at_start_limit(record: dict, current: str | None, stacks, now: float, rollback: bool,
                   restart_prevented: bool) -> Act:
    """
    The start limit stopped the server (the unit's ``OnFailure=``): a stack on trial goes back
    to the previous one (``failure_verdict``); a failed upgrade kept on purpose stays down; any
    other (a release that served its whole window, no stack to go back to) is the best there
    is: started again after a growing pause, unless RESTART_PREVENTED (its exit status is one
    the unit does not restart on: a missing secret).
    """
    verdict = failure_verdict(record, current, stacks, now, rollback)
    if verdict is RollbackVerdict.ROLL_BACK:
        return Act.SWITCH_BACK
    if verdict is RollbackVerdict.KEEP_FAILED or restart_prevented:
        return Act.LEAVE
    return Act.RESTART


def loop_after(loop: dict | None, now: float, restart_s: float) -> dict:
    """The crash loop's record once the fallback starts the server again at NOW: LOOP, the
    record's ``crash_loop`` (None, or its last start LOOP_RESET_S or more ago: a new loop),
    counted one more, with the pause before this start: RESTART_S (the unit's ``RestartSec``)
    doubled at each, up to MAX_PAUSE_S."""
    if loop is None or now - float(loop.get("last", 0)) >= LOOP_RESET_S:
        loop = {"since": now, "restarts": 0}
    restarts = int(loop.get("restarts", 0)) + 1
    pause = min(max(restart_s, 1.0) * 2 ** restarts, MAX_PAUSE_S)
    return {**loop, "restarts": restarts, "last": now + pause, "pause_s": pause}
