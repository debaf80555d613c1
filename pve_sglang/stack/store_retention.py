"""
Retention in a host's wheel store (pure decisions): which locked sets, their shared layers and
their wheels a run removes.

A store is shared by every container of the host that mounts it, and maybe by containers the
inventory does not name: the deploy removes only what it can prove no container uses. Each
container the deploy manages says which locks it holds (its stacks: the serving one, the
rollback target, one on trial or waiting for its switch) in a record of its own in the store
(``<store>/.users/<key>.json``, written by its host: the container mounts the store read-only).
A store is pruned only while every container whose config mounts it has such a record; it keeps
every lock a record names and the ``keep`` newest sets besides. A wheel goes only when no kept
lock names it. Every decision here is a row of ``tests/unit/test_store_retention.py``.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import NamedTuple

from pve_sglang.stack.switch_rules import STACK_NAME

#: The locked sets' manifests in the store (``<id>``), and their layers' markers (``<id>.layer``).
LOCKS = ".locks"
#: The containers' records of the locks they hold, in the store.
USERS = ".users"
#: A lock's manifest renamed so while its removal runs: a removal cut short is finished by the
#: next run (it still names the lock's wheels), and the set no longer counts as complete.
REMOVING = ".removing"
#: A container's key in the store: ``pct-<vmid>`` or ``lxc-<name>``.
USER_KEY = re.compile(r"^(pct|lxc)-\w[\w.-]{0,252}\Z")
#: What the deploy ever removes from the store's top folder: a wheel's file name.
WHEEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl\Z")


def user_key(platform: str, name: str | int) -> str:
    """The key of a container (its Proxmox vmid, or its plain LXC name) on its host."""
    key = f"{'pct' if platform == 'pve' else 'lxc'}-{name}"
    if not USER_KEY.match(key):
        raise ValueError(f"{name!r} cannot name a container in a wheel store (letters, digits, "
                         "'_', '.' and '-')")
    return key


def user_path(store: str, key: str) -> str:
    """The record of the locks container KEY holds in STORE."""
    return f"{store.rstrip('/')}/{USERS}/{key}.json"


def user_text(key: str, locks: list[str] | set[str]) -> str:
    """A container's record: the lock ids it holds (sorted: the same set, the same text)."""
    return json.dumps({"container": key, "locks": sorted(locks)}, sort_keys=True) + "\n"


def user_locks(text: str | None) -> set[str] | None:
    """The lock ids of a record's TEXT; None when it is no record of ours (unreadable)."""
    try:
        value = json.loads(text or "")
    except ValueError:
        return None
    locks = value.get("locks") if isinstance(value, dict) else None
    if not isinstance(locks, list) or not all(isinstance(i, str) for i in locks):
        return None
    return {i for i in locks if STACK_NAME.match(i)}


def covers(source: str, store: str) -> bool:
    """A bind mount of host path SOURCE shows the store (it is the store, in it, or above it)."""
    if not source.startswith("/"):
        return False  # a Proxmox volume (``local-lvm:vm-105-disk-1``): not a host folder
    source, store = posixpath.normpath(source), posixpath.normpath(store)
    return (source == store or source.startswith(store.rstrip("/") + "/")
            or store.startswith(source.rstrip("/") + "/"))


def mount_source(platform: str, line: str) -> str | None:
    """The host path a container config LINE mounts, ``"?"`` for a mount table in a file of its
    own (``lxc.mount.fstab``: counted as mounting the store), None for no mount line."""
    key, sep, value = line.partition("=" if platform == "lxc" else ":")
    key, value = key.strip(), value.strip()
    if not sep:
        return None
    if platform == "pve" and re.fullmatch(r"mp\d+", key):
        first = value.split(",", 1)[0]
        return first.removeprefix("volume=")
    if key == "lxc.mount.entry":
        return value.split()[0] if value.split() else None
    if key == "lxc.mount.fstab":
        return "?"
    return None


def mounting(platform: str, configs: dict[str, list[str]], store: str) -> set[str]:
    """The containers (CONFIGS: ``{key: config lines}``) whose config mounts STORE."""
    found = set()
    for key, lines in configs.items():
        for line in lines:
            source = mount_source(platform, line)
            if source == "?" or (source is not None and covers(source, store)):
                found.add(key)
    return found


class StoreLock(NamedTuple):
    """A lock as the store holds it (``facts.wheel_store.WheelStoreState``)."""

    #: When its set came into the store (its manifest's mtime).
    mtime: float = 0.0
    #: The wheels its manifest names.
    wheels: tuple[str, ...] = ()
    #: Its manifest is there (``.locks/<id>``): the set is complete.
    complete: bool = True
    #: A removal of it was cut short (``.locks/<id>.removing``).
    removing: bool = False


class Prune(NamedTuple):
    """What a run removes from a store (nothing when BLOCKED names containers)."""

    #: Containers that mount the store and have no record: nothing is removed.
    blocked: tuple[str, ...] = ()
    #: Locks whose manifest (or cut-short removal), layer marker and layer go.
    locks: tuple[str, ...] = ()
    #: Wheels no kept lock names.
    wheels: tuple[str, ...] = ()
    #: Locks kept: named by a record, or among the newest.
    kept: tuple[str, ...] = ()
    #: Kept locks with a stale ``.removing`` file (a set fetched again): the file goes.
    stale: tuple[str, ...] = ()


def decide(locks: dict[str, StoreLock], users: dict[str, set[str] | None],
           mounts: set[str], keep: int) -> Prune:
    """
    What to remove from a store.

    + locks: ``{lock id: StoreLock}``, the store's sets (complete ones and cut-short removals)
    + users: ``{container key: the lock ids its record names}`` (None: a record not readable)
    + mounts: the containers whose config mounts the store (``mounting``)
    + keep: the newest sets kept besides those a container holds (``stack_retention``)

    A container that mounts the store without a (readable) record blocks every removal: what
    it uses cannot be known. A record of a container that no longer mounts the store holds
    nothing (the container is gone, or uses the store no more).
    """
    blocked = tuple(sorted(key for key in mounts if users.get(key) is None))
    ours = {i: lock for i, lock in locks.items() if STACK_NAME.match(i)}
    if blocked:
        return Prune(blocked=blocked, kept=tuple(sorted(ours)))
    held = set().union(*(users[key] or set() for key in mounts))
    complete = [i for i, lock in ours.items() if lock.complete]
    newest = sorted(complete, key=lambda i: (ours[i].mtime, i), reverse=True)[:keep]
    kept = {i for i in complete if i in held or i in newest}
    gone = sorted(i for i in ours if i not in kept)
    named = {name for i in kept for name in ours[i].wheels}
    wheels = sorted({name for i in gone for name in ours[i].wheels
                     if name not in named and WHEEL_NAME.match(name)})
    stale = sorted(i for i in kept if ours[i].removing)
    return Prune(locks=tuple(gone), wheels=tuple(wheels), kept=tuple(sorted(kept)),
                 stale=tuple(stale))
