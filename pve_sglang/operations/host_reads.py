"""What a plain LXC host's run checks for its containers, read in one command per run stage.

Per container, the host phase reads its LXC config (planning, and again at execution), the
host's cgroup limits (planning), and at execution the container's status, its network guard's
files and its cgroup values: five facts, each a process on the host (a round trip over SSH),
times the containers. The host phase names what it will read (``expect``: every container's
parts, each for the stage that reads it); the first ask of a stage (``read``) reads every
expected part of that stage not known yet in one ``LxcHostState`` command, and keeps each in
the per-stage cache of its kind, where the operations that change it forget it:

- ``status``: ``memo(Kind.LXC_STATUS)[(lxc_path, container)]``, forgotten by ``lxc.create`` and
  ``lxc.power`` (``forget_container``), with the container's cgroup values;
- ``config``: ``memo(Kind.FILE_CONTENTS)[path]`` (``owned.contents``), forgotten by the
  operation that writes it (``cache.changed``);
- ``files``: ``memo(Kind.LXC_FILES)[paths]``, all forgotten by ``lxc.create`` (a new rootfs);
- ``cgroup``: ``memo(Kind.LXC_CGROUP)[(lxc_path, container, keys)]``, forgotten with the status
  and by ``lxc.cgroup_limits``' own commands;
- ``limits``: ``memo(Kind.CGROUP_LIMITS)[None]``.

Each part is its own fact's command in its own section, processed by that fact: the values
and the checks made on them are the ones of the reads made one by one. A part not expected,
or asked again after it was forgotten, is read alone. Only on a local or SSH host are parts
folded (``@fake`` in the plan tests reads each part with its own fact, as before).
"""

from __future__ import annotations

from collections.abc import Hashable

from pyinfra import host

from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.facts.one_read import checked, part_values
from pve_sglang.facts.lxc_host import HOST_PARTS, HostPart, LxcHostState

#: The per-stage cache each kind is kept in (``cache.memo``).
MEMO = {HostPart.STATUS: Kind.LXC_STATUS, HostPart.CONFIG: Kind.FILE_CONTENTS,
        HostPart.FILES: Kind.LXC_FILES, HostPart.CGROUP: Kind.LXC_CGROUP,
        HostPart.LIMITS: Kind.CGROUP_LIMITS}


def _folds() -> bool:
    from pyinfra.connectors.local import LocalConnector
    from pyinfra.connectors.ssh import SSHConnector

    return isinstance(getattr(host, "connector", None), (LocalConnector, SSHConnector))


def _key(kind: HostPart, args: tuple) -> Hashable:
    """Where part KIND/ARGS is kept in its memo: the keys the operations forget."""
    if kind is HostPart.STATUS:
        container, lxc_path = args
        return (lxc_path, container)
    if kind is HostPart.CGROUP:
        container, lxc_path, keys = args
        return (lxc_path, container, tuple(keys))
    if kind is HostPart.FILES:
        return tuple(args[0])
    return args[0] if args else None


def _part(kind: HostPart | str, args: tuple) -> tuple[HostPart, tuple]:
    """The part, hashable (lists as tuples); KIND a ``HostPart`` or its name (an unknown name
    fails here, not as a cache of its own)."""
    return HostPart(kind), tuple(tuple(a) if isinstance(a, list) else a for a in args)


def expect(parts: list[tuple[HostPart, tuple]], executing: bool) -> None:
    """PARTS (``(kind, args)``) will be read at execution (EXECUTING) or while planning: the
    first read of that stage reads them too."""
    wanted = cache.memo(Kind.LXC_EXPECTED).setdefault(executing, {})
    for kind, args in parts:
        wanted[_part(kind, args)] = True


def _known(kind: HostPart, args: tuple) -> bool:
    return _key(kind, args) in cache.memo(MEMO[kind])


def read(kind: HostPart | str, *args):
    """Part KIND (a ``HostPart``, or its name) for ARGS, as its own fact gives it; the first ask
    of a run stage reads every part expected for that stage not known yet, in one command."""
    kind, args = _part(kind, args)
    if not _known(kind, args):
        wanted = [(kind, args)]
        if _folds():
            expected = cache.memo(Kind.LXC_EXPECTED).get(host.state.is_executing, {})
            wanted += [p for p in expected if p != (kind, args) and not _known(*p)]
        _read(wanted)
    return checked(kind, args, cache.memo(MEMO[kind])[_key(kind, args)], "on the host")


def _read(wanted: list[tuple[HostPart, tuple]]) -> None:
    if len(wanted) == 1:
        kind, args = wanted[0]
        fact, names = HOST_PARTS[kind]
        value = host.get_fact(fact, **{n: list(a) if isinstance(a, tuple) else a
                                       for n, a in zip(names, args)})
        cache.memo(MEMO[kind])[_key(kind, args)] = value
        return
    parts = tuple(wanted)
    values = part_values(parts, host.get_fact(LxcHostState, parts=parts), HOST_PARTS)
    for (kind, args), value in values.items():
        cache.memo(MEMO[kind])[_key(kind, args)] = value


def forget_container(container: str, lxc_path: str, created: bool = False) -> None:
    """Container CONTAINER was started or restarted (CREATED: made): its status and cgroup
    values are read again, and when it was made (a new rootfs) every network guard's files."""
    cache.forget(Kind.LXC_STATUS, (lxc_path, container))
    cgroup = [key for key in cache.memo(Kind.LXC_CGROUP) if key[:2] == (lxc_path, container)]
    if cgroup:
        cache.forget(Kind.LXC_CGROUP, *cgroup)
    if created:
        cache.forget(Kind.LXC_FILES)
