"""Which stack a container's settings name: the lock of its pinned set, its id, and where it is
built. The one home of that lookup: the host phase's preflight, the container phase and the
verify phase each ask here, so all three name the same stack.
"""

from __future__ import annotations

from typing import Protocol

import gevent.lock

from pve_sglang.runtime.errors import PreflightError
from pve_sglang.stack import switch_rules
from pve_sglang.stack.lock import Lock, LockError, LockKey, key_of, lock_for


class StackSettings(Protocol):
    """What the lookup reads of a container's settings (``config.settings.ContainerSettings``;
    ``lock.key_of`` reads the pins too)."""

    # Read-only: ContainerSettings narrows them (stack_install is a Literal).
    @property
    def stack_install(self) -> str: ...
    @property
    def stack_lock(self) -> str | None: ...
    @property
    def sglang_version(self) -> str: ...
    @property
    def venv_path(self) -> str: ...


# pyinfra prepares hosts in parallel greenlets: one lock is made once, by the first that asks.
_LOCKING = gevent.lock.Semaphore()


def stack_lock_of(where: str, cs: StackSettings) -> tuple[Lock, LockKey]:
    """The lock of a container's pinned set and what it is made for: stack_lock's, the
    repository's, or one made here once (for the first host that needs it)."""
    key = key_of(cs)
    try:
        with _LOCKING:
            return lock_for(key, cs.stack_lock), key
    except LockError as error:
        raise PreflightError(f"{where}: {error}") from None


def settings_stack_id(where: str, cs: StackSettings) -> str:
    """The id of the stack of settings CS of host WHERE: the lock's id, or a digest of
    sglang's pin without one."""
    if cs.stack_install == "pinned":
        return stack_lock_of(where, cs)[0].id
    return switch_rules.unlocked_id(cs.sglang_version)


def settings_stack_path(where: str, cs: StackSettings) -> str:
    """Where the stack of settings CS is built, beside the serving one."""
    return switch_rules.stack_path(cs.venv_path, settings_stack_id(where, cs))
