"""
What a run does with the server's systemd unit, decided from what was read (a pure function).

``operations.systemd_unit.service_running`` reads the unit's state, asks whether this run
changed what the server runs, and which of its files changed after the running server started;
``decide`` turns those values into the commands' plan. Every case is a row of
``tests/unit/test_unit_action.py``.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, NamedTuple

#: systemd's ActiveState values of a unit whose process runs (or is on its way up).
RUNNING_STATES = frozenset({"active", "activating", "reloading"})


class Action(Enum):
    NOTHING = "nothing"  # runs, unchanged: a restart would reload the model for nothing
    START = "start"  # down, and the server can run here
    RESTART = "restart"  # runs an old unit, env, stack or patch
    PENDING = "pending"  # needs a restart, but restart_on_change is false: reported only
    RECOVER = "recover"  # failed or between automatic restarts: report it, start (or stop) again
    LEAVE_DOWN = "leave_down"  # down, and no GPU to serve on


class UnitPlan(NamedTuple):
    action: Action
    #: The unit file was written but never loaded (a run killed between write and reload).
    daemon_reload: bool
    #: ``systemctl enable`` / ``disable`` first, or None when the boot setting is right.
    boot: Literal["enable", "disable"] | None
    #: Why a restart is due (for the log), empty when none is.
    why: str = ""


def changed_after(started: int | None, mtimes: dict[str, int | None]) -> list[str]:
    """The names in MTIMES (``{name: mtime}``, microseconds since the epoch, None: not there)
    changed after STARTED (the running server's start, on the same clock): a run that changed
    them was killed before it restarted the server (a restart pending). A file's mtime is never
    later than the write (the kernel stamps it with a coarse clock), so a server started after
    the change is never found pending. Unknown times decide nothing."""
    if started is None:
        return []
    return [name for name, mtime in mtimes.items() if mtime is not None and mtime > started]


def looping(active: str, sub: str | None) -> bool:
    """The unit failed, or waits between two tries of Restart= (auto-restart): it does not serve."""
    return active == "failed" or sub == "auto-restart"


def decide(*, active: str, sub: str | None, enabled: str, stale: bool, start: bool,
           changed: bool, pending: list[str], restart_on_change: bool) -> UnitPlan:
    """
    The plan for a unit in state ACTIVE/SUB (systemd's ActiveState/SubState), ENABLED at boot
    or not, STALE (written, not loaded).

    + start: the server can run here (a GPU); false keeps it stopped and disabled
    + changed: this run changed what the running server runs (asked only when it runs)
    + pending: what changed after the running server started (a killed run's restart)
    + restart_on_change: false never restarts a running server: the restart stays pending
    """
    boot: Literal["enable", "disable"] | None = None
    if start and enabled != "enabled":
        boot = "enable"
    elif not start and enabled == "enabled":
        boot = "disable"
    if looping(active, sub):
        return UnitPlan(Action.RECOVER, stale, boot)
    if active not in RUNNING_STATES:
        return UnitPlan(Action.START if start else Action.LEAVE_DOWN, stale, boot)
    changed = changed or stale
    if not changed and not pending:
        return UnitPlan(Action.NOTHING, stale, boot)
    why = "this run changed what it runs" if changed else (
        ", ".join(pending) + " changed after the server started")
    return UnitPlan(Action.RESTART if restart_on_change else Action.PENDING, stale, boot, why)
