"""Files and directories a container step manages, read in one command for all of them.

Each read through a container connector costs a process on the host (``pct exec`` over SSH,
``lxc-attach``); ``files.put`` reads three facts per file. The deploy names the paths it
manages up front (``watch``); the first operation that asks reads all of them at once, and an
operation that changes a path forgets it, so the next one reads it again.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import IO
from weakref import WeakKeyDictionary

from pyinfra import host
from pyinfra.api import FileUploadCommand, OperationError, operation
from pyinfra.api.util import get_file_sha1

from ..facts.container import PathStates
from .memo import forget as forget_memo
from .memo import memo

_WATCHED: WeakKeyDictionary = WeakKeyDictionary()


def watch(*paths: str) -> None:
    """Name paths this host's operations will ask about, so one read answers them all."""
    _WATCHED.setdefault(host.state, {}).setdefault(host.name, set()).update(paths)


def state(path: str) -> dict | None:
    """What PATH is now (see ``PathStates``), from one read of every watched path not known."""
    known = memo("paths")
    if path not in known:
        watched = _WATCHED.get(host.state, {}).get(host.name, set())
        wanted = tuple(sorted((watched - known.keys()) | {path}))
        known.update(host.get_fact(PathStates, paths=wanted))
    return known.get(path)


def forget(path: str) -> None:
    """An operation changed PATH: the next question about it reads it again."""
    forget_memo("paths", path)


def _mode(mode: str) -> str:
    return mode.lstrip("0").rjust(3, "0")


@operation()
def put(src: str | IO, dest: str, mode: str):
    """
    Upload SRC (a local path or a file-like object) to DEST with MODE when DEST is missing or
    its content differs, and set MODE when only that differs. A new file is created with MODE
    before its content arrives, so a secret is never readable by others, even briefly.
    """
    remote = state(dest)
    if hasattr(src, "seek"):
        src.seek(0)
    same = remote is not None and remote["sha1"] == get_file_sha1(src)
    target = shlex.quote(dest)
    if remote is None:
        directory = shlex.quote(posixpath.dirname(dest) or "/")
        yield f"mkdir -p {directory} && install -m {mode} /dev/null {target}"
    if not same:
        yield FileUploadCommand(src, dest, remote_temp_filename=host.get_temp_filename(dest))
        yield f"chmod {mode} {target}"
    elif remote["mode"] != _mode(mode):
        yield f"chmod {mode} {target}"
    else:
        host.noop(f"{dest} is up to date")
        return
    forget(dest)


@operation()
def directory(path: str, mode: str):
    """A directory at PATH with MODE (parents created as needed)."""
    current = state(path)
    target = shlex.quote(path)
    if current is None:
        yield f"mkdir -p {target} && chmod {mode} {target}"
    elif current["type"] != "dir":
        raise OperationError(f"{path} exists and is not a directory")
    elif current["mode"] != _mode(mode):
        yield f"chmod {mode} {target}"
    else:
        host.noop(f"{path} exists")
        return
    forget(path)
