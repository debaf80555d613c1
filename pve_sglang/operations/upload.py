"""Uploads into a container with one read each (``files.put`` reads three facts per file)."""

from __future__ import annotations

import posixpath
import shlex
from typing import IO

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation
from pyinfra.api.util import get_file_sha1

from ..facts.container import FileDigest


@operation()
def put(src: str | IO, dest: str, mode: str):
    """
    Upload SRC (a local path or a file-like object) to DEST with MODE when DEST is missing or
    its content differs, and set MODE when only that differs. A new file is created with MODE
    before its content arrives, so a secret is never readable by others, even briefly.
    """
    remote = host.get_fact(FileDigest, path=dest)
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
    elif remote["mode"] != mode.lstrip("0").rjust(3, "0"):
        yield f"chmod {mode} {target}"
    else:
        host.noop(f"{dest} is up to date")
