"""Where the tests keep what they build once (wheels, venvs, the release sets' wheels), and the
lock that has one pytest worker build a thing while the others wait for it.

``PVE_SGLANG_TEST_CACHE`` names the folder (the Makefile's ``make test`` sets it, as root, to
/var/cache/pve-sglang-tests, so that a fresh clone on the same machine finds what an earlier one
built); without it, the checkout's ``.cache/``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
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


#: Written into a cached venv once its sources are compiled (``bytecode``).
BYTECODE_STAMP = ".pvs-bytecode"


def bytecode(venv: Path) -> None:
    """Compile the cached VENV's sources to bytecode once (call it under the venv's lock).
    uv installs without .pyc files, and where ``PYTHONDONTWRITEBYTECODE`` is set (as on the
    CI machines) an import never writes them: every process that imports torch from the venv
    compiled it again (about 10 s of CPU an import of sglang's server_args, 5 s with .pyc)."""
    stamp = venv / BYTECODE_STAMP
    if stamp.exists():
        return
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", str(venv / "lib")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # A file that does not compile (a test's data, another Python's syntax) stays a source;
    # the rest is compiled, which is all this is for.
    stamp.write_text(f"compileall exit {done.returncode}\n")
