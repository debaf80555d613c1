"""Where the tests keep what they build once (wheels, venvs, the release sets' wheels), and the
lock that has one pytest worker build a thing while the others wait for it.

``PVE_SGLANG_TEST_CACHE`` names the folder (the Makefile's ``make test`` sets it, as root, to
/var/cache/pve-sglang-tests, so that a fresh clone on the same machine finds what an earlier one
built); without it, the checkout's ``.cache/``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_CACHE = Path(os.environ.get("PVE_SGLANG_TEST_CACHE") or REPO / ".cache")


@contextmanager
def building(target: Path) -> Iterator[None]:
    """Hold the lock of TARGET (a file or folder in a cache) while it is looked for and built:
    a second worker that wants it waits, then finds it built."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
