"""The one per-run cache: what this run learnt about each host, kept until an operation changes it.

pyinfra 3 caches no fact. What several operations or phases read the same way is read once per
run here, per host, under a ``Kind``: every kind is declared there, once, with how long it is
kept and what forgets it, and the functions below take nothing else (a misspelt kind would be
a cache of its own, silently never forgotten: a stale read).

- per stage (facts): what an operation may change. Prepare (``--dry``) and execute keep apart:
  execute must see the real host. An operation that changes what was read forgets it, next to
  the change (``forget``, ``changed``), so the next one reads it again.
- for the whole run (``WHOLE_RUN``): what does not change while the deploy runs or must hold
  across both stages: the validated settings, the GPU host's driver and GPUs, the paths a
  deploy watches, which diffs and log lines were shown.

Entries live with pyinfra's ``State``: a new run (or test) starts empty.
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum
from weakref import WeakKeyDictionary

from pyinfra import host as current_host
from pyinfra.api.host import Host


class Kind(str, Enum):
    """What the cache holds for a host. Per run stage unless in ``WHOLE_RUN``."""

    # A container's one read (operations/container_reads.py), each a part's fact:
    #: ``PathStates`` per managed path; forgotten by a write of the path (``paths.forget``).
    PATHS = "paths"
    #: ``SglangVenv`` per ``(python, tools)``, and ``"changed"`` (``venv.venv_changed``);
    #: forgotten by the operations that change the venv and by a new autotune patch script.
    VENV = "venv"
    #: ``Stacks`` per ``(venv_path, lock_file, service)``; forgotten by the operations of
    #: ``operations/stack_switch.py`` that change a stack, the link or the state record.
    STACKS = "stacks"
    #: ``DebPackages``; forgotten by ``debs.deb_packages``.
    DEBS = "debs"
    #: ``UvVersion`` per uv binary; forgotten by ``venv.tools_venv``.
    UV = "uv"
    #: ``UnitState`` per unit; forgotten by ``systemd_unit.service_running`` and a write of its file.
    UNIT = "unit"
    #: ``Hostname``; forgotten by ``container_reads.hostname``.
    HOSTNAME = "hostname"
    #: A Proxmox container's ``PctConfig`` per config path; forgotten by a change of the config
    #: (``pct.create``/``config``/``rootfs_size``: ``changed``).
    PCT_CONFIG = "pct_config"
    # A plain LXC host's one read of its containers (operations/host_reads.py):
    #: Container status per ``(lxc_path, container)``; forgotten by ``lxc.create``/``power``.
    LXC_STATUS = "lxc_status"
    #: A container's LXC config lines per path (``owned.contents``); forgotten by a write of
    #: it (``owned.lines``, ``lxc.create``: ``changed``).
    FILE_CONTENTS = "file_contents"
    #: The network guard's files present, per paths; forgotten by ``lxc.network_guard`` and
    #: ``lxc.create`` (a new rootfs).
    LXC_FILES = "lxc_files"
    #: Live cgroup values per ``(lxc_path, container, keys)``; forgotten by
    #: ``lxc.cgroup_limits`` and with the container's status.
    LXC_CGROUP = "lxc_cgroup"
    #: The host's cgroup limits (``None``); no operation changes them.
    CGROUP_LIMITS = "cgroup_limits"
    #: ``path -> {(kind, key)}`` read through that file (``depends``): ``changed`` forgets them.
    DEPENDS = "depends"
    #: A node's failed start or answer (``"failure"``), judged with its group's other nodes
    #: (``stack_switch.group_judged`` reads it for every node); nothing forgets it.
    NODE_FAILURE = "node_failure"

    # For the whole run:
    #: The parts each stage will read, ``{executing: {part: True}}``: a plain LXC host's
    #: (``host_reads.expect``), a container's (``container_reads.expect``).
    LXC_EXPECTED = "lxc_expected"
    #: The paths this host's operations will ask about (``paths.watch``).
    WATCHED = "watched"
    #: The operations whose diff was shown (``paths.diff_wanted``, ``once``).
    DIFF_SHOWN = "diff_shown"
    #: Units whose restart loop was reported (``once``).
    UNIT_LOOPING = "unit_looping"
    #: Units whose pending restart was reported (``once``).
    RESTART_PENDING = "restart_pending"
    #: Restarts whose reason was logged (``once``).
    RESTART_REASON = "restart_reason"
    #: Validated settings per model (``settings.host_settings``).
    SETTINGS = "settings"
    #: The GPU host's driver and GPUs (``preflight.driver_and_gpus``).
    DRIVER_AND_GPUS = "driver_and_gpus"

    def __str__(self) -> str:
        return self.value


#: The kinds kept for the whole run, across both stages; every other kind is kept per stage.
WHOLE_RUN = frozenset({
    Kind.LXC_EXPECTED, Kind.WATCHED, Kind.DIFF_SHOWN, Kind.UNIT_LOOPING, Kind.RESTART_PENDING,
    Kind.RESTART_REASON, Kind.SETTINGS, Kind.DRIVER_AND_GPUS,
})

_RUNS: WeakKeyDictionary = WeakKeyDictionary()


def _kind(kind: object) -> Kind:
    if not isinstance(kind, Kind):
        raise TypeError(
            f"cache kind {kind!r} is not a cache.Kind: pass a member of Kind "
            f"(pve_sglang/runtime/cache.py), where every kind is declared with what forgets it"
        )
    return kind


def _host(of: Host | None) -> Host:
    return current_host if of is None else of


def memo(kind: Kind, of: Host | None = None) -> dict:
    """The cache of KIND for host OF (the current host when None): of this run stage, or of
    the whole run for a kind of ``WHOLE_RUN``."""
    kind = _kind(kind)
    h = _host(of)
    stage = None if kind in WHOLE_RUN else h.state.is_executing
    return _RUNS.setdefault(h.state, {}).setdefault((kind, h.name, stage), {})


def forget(kind: Kind, *keys: Hashable, of: Host | None = None) -> None:
    """Forget KEYS (all, when none are given) of the host's KIND cache, in every stage."""
    kind = _kind(kind)
    h = _host(of)
    for (memo_kind, name, _), known in _RUNS.get(h.state, {}).items():
        if memo_kind == kind and name == h.name:
            for key in keys or list(known):
                known.pop(key, None)


def changed(path: str, of: Host | None = None) -> None:
    """An operation changed the file PATH: every per-stage cache of the host forgets what it
    read from it (a managed path's state, a Proxmox config read through ``pct``), and what was
    read through it (``depends``)."""
    h = _host(of)
    caches = _RUNS.get(h.state, {})
    dependents = {dep for (kind, name, stage), known in caches.items()
                  if kind == Kind.DEPENDS and name == h.name for dep in known.get(path, ())}
    for (_, name, stage), known in caches.items():
        if name == h.name and stage is not None:
            known.pop(path, None)
    for kind, key in dependents:
        forget(kind, key, of=h)


def depends(path: str, kind: Kind, key: Hashable, of: Host | None = None) -> None:
    """KEY of the host's KIND cache was read through the file PATH (the venv's state runs a
    script uploaded there): ``changed(PATH)`` forgets it too."""
    memo(Kind.DEPENDS, of).setdefault(path, set()).add((_kind(kind), key))


def once(kind: Kind, key: Hashable, of: Host | None = None) -> bool:
    """True the first time KIND/KEY (a kind of ``WHOLE_RUN``) is asked for this host in this
    run (a log line, a diff shown once), False after."""
    if _kind(kind) not in WHOLE_RUN:
        raise ValueError(f"once() counts for the whole run: {kind.name} is kept per stage")
    seen = memo(kind, of)
    if key in seen:
        return False
    seen[key] = True
    return True
