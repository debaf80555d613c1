"""The one per-run cache: what this run learnt about each host, kept until an operation changes it.

pyinfra 3 caches no fact. What several operations or phases read the same way is read once per
run here, under a KIND, per host:

- per stage (``per_stage=True``, facts): the container's managed paths (``paths``), its venv
  (``venv``), a Proxmox container's config (``pct_config``), the other parts of a container's
  one read (``operations/container_state.py``: ``debs``, ``uv``, ``unit``, ``hostname``), a plain
  LXC host's one read of its containers (``operations/host_state.py``: ``lxc_status``,
  ``file_contents``, ``lxc_files``, ``lxc_cgroup``, ``cgroup_limits``). Prepare (``--dry``) and execute
  keep apart: execute must see the real host. An operation that changes what it read forgets
  it (``forget``, ``changed``), so the next one reads it again.
- for the whole run (``per_stage=False``): what does not change while the deploy runs or must
  hold across both stages: the validated settings, the GPU host's driver and GPUs, the paths a
  deploy watches, which diffs and log lines were shown.

Entries live with pyinfra's ``State``: a new run (or test) starts empty.
"""

from __future__ import annotations

from collections.abc import Hashable
from weakref import WeakKeyDictionary

from pyinfra import host as current_host
from pyinfra.api.host import Host

_RUNS: WeakKeyDictionary = WeakKeyDictionary()


def _host(of: Host | None) -> Host:
    return current_host if of is None else of


def memo(kind: str, of: Host | None = None, per_stage: bool = True) -> dict:
    """The cache of KIND for host OF (the current host when None): of this run stage when
    PER_STAGE, else of the whole run."""
    h = _host(of)
    stage = h.state.is_executing if per_stage else None
    return _RUNS.setdefault(h.state, {}).setdefault((kind, h.name, stage), {})


def forget(kind: str, *keys: Hashable, of: Host | None = None) -> None:
    """Forget KEYS (all, when none are given) of the host's KIND cache, in every stage."""
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
                  if kind == "depends" and name == h.name for dep in known.get(path, ())}
    for (_, name, stage), known in caches.items():
        if name == h.name and stage is not None:
            known.pop(path, None)
    for kind, key in dependents:
        forget(kind, key, of=h)


def depends(path: str, kind: str, key: Hashable, of: Host | None = None) -> None:
    """KEY of the host's KIND cache was read through the file PATH (the venv's state runs a
    script uploaded there): ``changed(PATH)`` forgets it too."""
    memo("depends", of).setdefault(path, set()).add((kind, key))


def once(kind: str, key: Hashable, of: Host | None = None) -> bool:
    """True the first time KIND/KEY is asked for this host in this run (a log line, a diff
    shown once), False after."""
    seen = memo(kind, of, per_stage=False)
    if key in seen:
        return False
    seen[key] = True
    return True
