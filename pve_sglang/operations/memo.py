"""What operations of this run learnt about a host, shared until one of them changes it.

pyinfra 3 caches no fact. Operations that read the same state (a container's files, its
venv) read it once per run stage here and forget it when they change it, so the next one
reads it again. Prepare (``--dry``) and execute keep apart: execute must see the real host.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pyinfra import host

_MEMOS: WeakKeyDictionary = WeakKeyDictionary()


def memo(kind: str) -> dict:
    """This host's memo of KIND for the current run stage."""
    stage = host.state.is_executing
    return _MEMOS.setdefault(host.state, {}).setdefault((kind, host.name, stage), {})


def forget(kind: str, *keys: object) -> None:
    """Forget KEYS (all, when none are given) of this host's KIND memo, in every stage."""
    for (memo_kind, name, _), known in _MEMOS.get(host.state, {}).items():
        if memo_kind == kind and name == host.name:
            for key in keys or list(known):
                known.pop(key, None)
