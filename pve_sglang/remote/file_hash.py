"""A file's digest, written once (the standard library only): the sha256 of a wheel, of a GPU
kit's part, of a model's LFS file, or the git blob id the hub gives a model's small file.

The deploy imports it (``stack.wheel_fetch``), the device kit too (``tests/device/``), and it is
uploaded beside ``model_fetch.py`` (``remote.COMPANIONS``), which imports it where it runs.
``tests/unit/test_file_hash.py`` holds it to ``sha256sum`` and ``git hash-object``.
"""

from __future__ import annotations

import hashlib
import os

#: A file is read in blocks this large (a model's shard does not fit in memory at once).
CHUNK = 8 * 1024 * 1024


def file_digest(path: str | os.PathLike[str], git_blob: bool = False) -> str:
    """The hex sha256 of the file at PATH; with GIT_BLOB, its git blob id (the sha1 of
    ``blob <size>\\0`` and its bytes: what the hub gives a file not in LFS)."""
    if git_blob:
        digest = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
    else:
        digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
