"""What a container run checks, read in one command per run stage (``ContainerState``).

A converged container run asks its managed paths (``paths.state``), its Debian packages, the
tools venv's uv, the sglang venv (one Python start), the server unit and, on plain LXC, the
hostname: six facts, six processes on the host and in the container. ``read`` answers the
first of them with one read of all that the run will ask (``expect``: what the container
phase's operations ask for these settings, told by the phase) and keeps each answer in the
per-stage cache of its kind (``MEMO``: ``cache.memo``), where the operations' own ``forget``
finds it:

- ``paths``: ``memo(Kind.PATHS)[path]``, forgotten by ``paths.forget`` (``cache.changed``);
- ``venv``: ``memo(Kind.VENV)[(python, tools)]``, forgotten by ``venv.venv_changed``, and when
  the autotune patch script it runs is written (``cache.depends``);
- ``debs``, ``uv``, ``hostname``: forgotten by the operation that installs or sets them;
- ``unit``: ``memo(Kind.UNIT)[unit]``, forgotten when the unit file is written (its
  ``NeedDaemonReload`` moves) and by ``service_running``'s own commands;
- ``stacks``: ``memo(Kind.STACKS)[args]``, forgotten by the operations of
  ``operations/stack_switch.py`` that move a stack, the link or the record.

A part not expected, or asked again after it was forgotten, is read alone, with its own fact.
Only through a container connector are parts folded: that is where a read is a process on the
host and in the container; any other connector (SSH into a machine, ``@fake`` in the plan
tests) reads each part with its own fact, as before.
"""

from __future__ import annotations

from collections.abc import Hashable

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pve_sglang import remote

from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.facts.one_read import (
    PARTS,
    ContainerState,
    Part,
    checked,
    part_values,
)

#: The per-stage cache each part is kept in (``cache.memo``).
MEMO = {Part.PATHS: Kind.PATHS, Part.VENV: Kind.VENV, Part.DEBS: Kind.DEBS, Part.UV: Kind.UV,
        Part.UNIT: Kind.UNIT, Part.HOSTNAME: Kind.HOSTNAME, Part.STACKS: Kind.STACKS}

#: The tools venv's uv, as ``tasks/container.py`` installs it (``venv.tools_venv``).
TOOLS_UV = f"{remote.TOOLS}/tools/bin/uv"


def _folds() -> bool:
    from pve_sglang.connectors.container import ContainerConnector

    return isinstance(getattr(host, "connector", None), ContainerConnector)


def expect(parts: list[tuple[Part, tuple]]) -> None:
    """PARTS (``(kind, args)``, paths aside: ``paths.watch`` names those) will be asked by this
    host's phases, in both stages: the first ask of each reads them too. Told by the phase that
    knows the settings (``tasks.common.expect_container_reads``), as ``host_reads.expect`` is."""
    wanted = cache.memo(Kind.LXC_EXPECTED)
    for executing in (False, True):
        wanted.setdefault(executing, {}).update(dict.fromkeys(
            ((Part(kind), args) for kind, args in parts), True))


def expected() -> list[tuple[Part, tuple]]:
    """The parts this host's phases said they will ask in this stage (``expect``)."""
    return list(cache.memo(Kind.LXC_EXPECTED).get(host.state.is_executing, {}))


def _key(kind: Part, args: tuple) -> Hashable:
    """Where part KIND/ARGS is kept in its memo: the keys the operations forget."""
    if kind in (Part.VENV, Part.STACKS):
        return args
    return args[0] if args else None


def _pending_paths(asked: tuple[str, ...] = ()) -> tuple[str, ...]:
    known = cache.memo(Kind.PATHS)
    watched = cache.memo(Kind.WATCHED).keys()
    return tuple(sorted((watched - known.keys()) | set(asked)))


def _store(kind: Part, args: tuple, value) -> None:
    if kind is Part.PATHS:
        if isinstance(value, dict):
            cache.memo(Kind.PATHS).update(value)
        else:  # failed: every asked path holds the failure
            cache.memo(Kind.PATHS).update(dict.fromkeys(args[0], value))
        return
    key, through = _key(kind, args), _read_through(kind, args)
    cache.memo(MEMO[kind])[key] = value
    if through is not None:
        cache.depends(through, MEMO[kind], key)


def _read_through(kind: Part, args: tuple) -> str | None:
    """The file part KIND/ARGS is read through: a write of it forgets the part."""
    if kind is Part.VENV:
        # It runs the patch script's --check: a new script forgets what the old one said.
        return remote.path(remote.AUTOTUNE_PATCH, args[1])
    if kind is Part.UNIT:
        # Writing the unit file moves its NeedDaemonReload (``server.unit_text.unit_path``).
        return f"/etc/systemd/system/{args[0]}"
    return None


def _read_alone(kind: Part, args: tuple):
    fact, names = PARTS[kind]
    return host.get_fact(fact, **dict(zip(names, args)))


def read(kind: Part | str, *args):
    """Part KIND (a ``Part``, or its name) for ARGS, as its own fact gives it; the first ask of a
    run stage reads every expected part not known yet, in one command."""
    kind = Part(kind)  # an unknown name fails here, not as a cache of its own
    if kind is Part.PATHS:
        raise TypeError("paths are read with path_state")
    known = cache.memo(MEMO[kind])
    key = _key(kind, args)
    if key not in known:
        wanted: list[tuple[Part, tuple]] = [(kind, args)]
        if _folds():
            wanted += [p for p in expected()
                       if p != (kind, args) and _key(*p) not in cache.memo(MEMO[p[0]])]
            paths = _pending_paths()
            if paths:
                wanted.append((Part.PATHS, (paths,)))
        _read(wanted)
    return checked(kind, args, known[key])


def path_state(path: str) -> dict | None:
    """What PATH is (``PathStates``), from ``memo(Kind.PATHS)``; when it is not known, one read of
    it, every watched path not known and, when the connector folds, every expected part not
    known."""
    known = cache.memo(Kind.PATHS)
    if path not in known:
        wanted = [(Part.PATHS, (_pending_paths((path,)),))]
        if _folds():
            wanted += [p for p in expected() if _key(*p) not in cache.memo(MEMO[p[0]])]
        _read(wanted)
    return checked(Part.PATHS, (path,), known.get(path))


def _read(wanted: list[tuple[Part, tuple]]) -> None:
    wanted = [(Part(kind), args) for kind, args in wanted]
    if len(wanted) == 1:
        kind, args = wanted[0]
        values = {(kind, args): _read_alone(kind, args)}
    else:
        parts = tuple(wanted)
        values = part_values(parts, host.get_fact(ContainerState, parts=parts))
    for (kind, args), value in values.items():
        _store(kind, args, value)


def forget(kind: Kind) -> None:
    """An operation changed what a part of KIND (``MEMO``) reads: the next ask reads it again."""
    cache.forget(kind)


@operation()
def hostname(hostname: str):
    """
    Set the container's running hostname to HOSTNAME when it differs (``hostname NAME``; not
    pyinfra's ``server.hostname``: its hostnamectl needs D-Bus, which is not up yet right after
    a (re)start). Read with the run's one read of the container (``read``).

    + hostname: the name

    **Example:**

    .. code:: python

        from pve_sglang.operations import container_reads

        container_reads.hostname(name="Hostname gpu-box (now)", hostname="gpu-box")
    """
    if read(Part.HOSTNAME) == hostname:
        host.noop(f"hostname is {hostname}")
        return
    yield StringCommand("hostname", QuoteString(hostname))
    forget(Kind.HOSTNAME)
