"""Retention in a host's wheel store (``stack.store_retention``): each container's record of the
locks it holds, written by its host, and the removal of the sets, layers and wheels no container
holds, beyond the newest."""

from __future__ import annotations

import time
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha1
from pyinfra.context import state as pyinfra_state

from pve_sglang.facts.installed_stacks import Stacks
from pve_sglang.facts.wheel_store import FolderSizes, WheelStoreState
from pve_sglang.operations import paths, stack_switch
from pve_sglang.stack import switch_rules
from pve_sglang.stack.switch_rules import StacksAt
from pve_sglang.stack.store_retention import (
    LOCKS,
    REMOVING, USERS, Prune, StoreLock, decide, mounting, user_path, user_text,
)


def held(raw: dict, wanted: str) -> set[str]:
    """The locks a container holds (RAW: its ``Stacks`` read): every stack in its folder (the
    serving one, the rollback target, those retention keeps), the state record's previous and
    trial, and WANTED (built or waiting for its switch)."""
    record = raw.get("state") or {}
    found = set(raw.get("stacks") or {}) | {wanted, record.get("previous"), record.get("trial")}
    return {i for i in found if i and switch_rules.STACK_NAME.match(i)}


def held_after_retention(venv_path: str, raw: dict, wanted: str, keep: int,
                         restart_on_change: bool) -> set[str]:
    """What ``held`` reads after this run's switch and retention (``operations.stack_switch.retention``,
    the same rule), for a plan made before either ran: the verdict taken as good (retention
    waits for it). RAW: the container's ``Stacks`` read."""
    found = switch_rules.found_of(venv_path, raw)
    current = found.named
    serving, rollback = switch_rules.after_switch(current, found.previous, wanted, restart_on_change)
    mtimes = {name: info.get("mtime", 0.0) for name, info in (raw.get("stacks") or {}).items()}
    mtimes.setdefault(wanted, time.time())
    failed = tuple((raw.get("state") or {}).get("failed") or {})
    gone = set(switch_rules.to_remove(mtimes, keep, serving, rollback, wanted, failed))
    kept = {i for i in mtimes if i not in gone} | {serving, rollback, wanted}
    return {i for i in kept if i and switch_rules.STACK_NAME.match(i)}


@operation()
def holds(store: str, key: str, stacks: StacksAt, wanted: str):
    """
    The container's record in its host's wheel store says which locks its stacks hold, as they
    are after this run's switch and retention: the store keeps them (``pruned``). The container
    mounts the store read-only: its host writes the record (a temporary file, then a rename).

    + store: the wheel store, mounted read-only at the same path in the container
    + key: the container's key on its host (``store_retention.user_key``)
    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` setting, beside which they
      are, the service that names their state record, the lock file that names a venv made
      before stacks)
    + wanted: the settings' stack (held even before its switch: restart pending)

    **Example:**

    .. code:: python

        from pve_sglang.operations import wheel_store
        from pve_sglang.stack.switch_rules import StacksAt

        wheel_store.holds(name="The wheel store knows this container's locks",
                          store="/var/cache/pve-sglang/wheels", key="pct-105",
                          stacks=StacksAt("/opt/sglang/venv", "sglang"), wanted="68a87c7696509d54")
    """
    # After retention (it forgets the read when it removes a stack).
    yield from _record(store, key, held(stack_switch.read_stacks(stacks), wanted))


@operation()
def holds_locks(store: str, key: str, locks: list[str]):
    """
    The record in its host's wheel store of a container that installs LOCKS as they are, with
    no stacks to switch (a gateway: its smg set): the store keeps them (``pruned``), and the
    container, which mounts the store, no longer blocks its pruning.

    + store: the wheel store, mounted read-only at the same path in the container
    + key: the container's key on its host (``store_retention.user_key``)
    + locks: the ids of the locks it installs (``Lock.id``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import wheel_store

        wheel_store.holds_locks(name="The wheel store knows the gateway's lock",
                                store="/var/cache/pve-sglang/wheels", key="pct-110",
                                locks=["3f1c9a0e5b7d2468"])
    """
    yield from _record(store, key, set(locks))


def _record(store: str, key: str, locks: set[str]):
    path, text = user_path(store, key), user_text(key, locks)
    # Read through the read-only mount, with the container's other watched paths.
    now = paths.state(path)
    if now and now.get("sha1") == get_file_sha1(StringIO(text)):
        host.noop(f"{path} names locks {', '.join(sorted(locks))}")
        return
    yield FunctionCommand(_write_record, (store, path, text), {})
    paths.forget(path)


def _write_record(state, host, store: str, path: str, text: str) -> bool:
    """At execution: the host writes the record (the container cannot: a read-only mount)."""
    if not hasattr(host.connector, "run_on_host"):
        logger.warning(f"{host.name}: {path} is not written (the container is not reached "
                       "through its host's @pct or @lxc connector): the wheel store of its host "
                       "is not pruned while the container mounts it")
        return True
    ok, output = host.connector.run_on_host(record_command(store, path, text))
    if not ok:
        logger.error(f"{host.name}: {path}: {output.stderr or output.stdout}")
    return ok


def record_command(store: str, path: str, text: str) -> StringCommand:
    """The host-side command that writes a container's record TEXT at PATH in STORE whole."""
    users = QuoteString(f"{store.rstrip('/')}/{USERS}")
    temporary = QuoteString(f"{path}.tmp")
    return StringCommand(
        "mkdir -p", users, "&& chmod 755", users, "&& printf '%s'", QuoteString(text), ">",
        temporary, "&& chmod 644", temporary, "&& mv -f", temporary, QuoteString(path))


def size_text(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


@operation()
def pruned(path: str, keep: int, platform: str, lxc_path: str, planned: dict[str, list[str]],
           wanted: list[str]):
    """
    Remove from wheel store PATH the locked sets no container holds, beyond the KEEP newest:
    each one's manifest, shared layer and the wheels no kept set names. Only while every
    container whose config mounts PATH has a record of what it holds (``holds``): a container
    the deploy knows nothing of blocks every removal, with a warning naming it. A removal cut
    short is finished by the next run (the manifest is renamed first, removed last). Shown by
    ``--dry`` with the bytes it frees; decided again when it runs, from the records this run
    wrote (PLANNED and WANTED are for the plan only).

    + path: the wheel store on this host
    + keep: the newest sets kept besides those a container holds (``stack_retention``)
    + platform: ``pve`` (configs in ``/etc/pve/lxc``) or ``lxc`` (in LXC_PATH)
    + lxc_path: a plain LXC host's container folder
    + planned: ``{key: lock ids}``, the records the inventory's containers of this host will
      write in this run (``planned_record``)
    + wanted: the locks this run brings into the store (new sets count as the newest)

    **Example:**

    .. code:: python

        from pve_sglang.operations import wheel_store

        wheel_store.pruned(name="Wheel store retention", path="/var/cache/pve-sglang/wheels",
                           keep=2, platform="pve", lxc_path="/var/lib/lxc",
                           planned={"pct-105": ["68a87c7696509d54"]},
                           wanted=["68a87c7696509d54"])
    """
    found = host.get_fact(WheelStoreState, store=path, platform=platform, lxc_path=lxc_path)
    locks: dict[str, StoreLock] = dict(found["locks"])
    users = dict(found["users"])
    mounts = mounting(platform, found["configs"], path)
    if not pyinfra_state.is_executing:
        # A plan: the inventory's containers write their records later in this run.
        for key, ids in planned.items():
            users[key] = set(ids)
            mounts.add(key)
        for lock_id in wanted:
            locks.setdefault(lock_id, StoreLock(mtime=time.time()))
    plan = decide(locks, users, mounts, keep)
    if plan.blocked:
        logger.warning(
            f"{host.name}: wheel store {path} is not pruned: {', '.join(plan.blocked)} mount"
            f"{'s' if len(plan.blocked) == 1 else ''} it and the deploy has no record of the "
            f"locks {'it holds' if len(plan.blocked) == 1 else 'they hold'} ({path}/{USERS}/"
            "<key>.json, written by a deploy that manages the container): add it to the "
            "inventory, or stop it mounting the store")
        host.noop(f"wheel store {path} not pruned: unknown containers mount it")
        return
    if not plan.locks and not plan.stale:
        host.noop(f"wheel store {path}: {len(plan.kept)} sets, none to remove")
        return
    if plan.locks:
        logger.info(f"{host.name}: {removal_words(path, plan, found['sizes'])}")
    yield from commands(path, plan)


def planned_record(box, stacks: StacksAt, wanted: str, keep: int,
                   restart_on_change: bool) -> list[str]:
    """What container BOX's record will name once its phase ran (``holds``), for its host's
    plan: read from the container now (its stacks), with this run's switch and retention; when
    it does not run yet, its WANTED lock."""
    ready = getattr(box.connector, "container_ready", None)
    if ready is not None and not ready():
        return [wanted]
    venv_path, lock_file, state = stacks.read_args()
    raw = box.get_fact(Stacks, venv_path=venv_path, lock_file=lock_file, state=state)
    return sorted(held_after_retention(venv_path, raw, wanted, keep, restart_on_change))


def removal_words(path: str, plan: Prune, wheel_sizes: dict[str, int]) -> str:
    """``wheel store ...: removing lock A, lock B (their layers, N wheels): frees X``."""
    layers = host.get_fact(FolderSizes, paths=[f"{path.rstrip('/')}/layers/{i}" for i in plan.locks])
    wheels = sum(wheel_sizes.get(name, 0) for name in plan.wheels)
    freed = wheels + sum(layers.values())
    return (f"wheel store {path}: stack_retention keeps {', '.join(plan.kept) or 'none'}; "
            f"removing lock {', '.join(plan.locks)} ({len(layers)} layer"
            f"{'' if len(layers) == 1 else 's'}, {size_text(sum(layers.values()))}; "
            f"{len(plan.wheels)} wheels no kept lock names, {size_text(wheels)}): frees "
            f"{size_text(freed)} ({freed} bytes)")


def commands(path: str, plan: Prune) -> list[StringCommand]:
    """The removal, in an order a run cut short anywhere finishes: each manifest renamed (the
    set no longer complete, its wheels still named), the layer markers, the layers, the wheels,
    then the renamed manifests."""
    base = path.rstrip("/")
    lock = lambda i, end="": QuoteString(f"{base}/{LOCKS}/{i}{end}")  # noqa: E731
    out = [StringCommand("[ ! -f", lock(i), "] || mv -f", lock(i), lock(i, REMOVING))
           for i in plan.locks]
    if plan.locks:
        out.append(StringCommand("rm -f", *(lock(i, ".layer") for i in plan.locks)))
        out.append(StringCommand("rm -rf", *(QuoteString(f"{base}/layers/{i}")
                                             for i in plan.locks)))
    # A wheel name is one plain file name (``WHEEL_NAME``), in the store's own folder.
    for start in range(0, len(plan.wheels), 200):
        out.append(StringCommand("rm -f --", *(QuoteString(f"{base}/{name}")
                                              for name in plan.wheels[start:start + 200])))
    gone = [lock(i, REMOVING) for i in (*plan.locks, *plan.stale)]
    if gone:
        out.append(StringCommand("rm -f", *gone))
    return out
