"""Real wheels from the package index, downloaded once into <repo>/.cache/wheels.

Tests reach them through tests/conftest.py's fixtures (``sglang_wheel``, ``pypi_wheel``), whose
use marks a test ``network``. A download retries: pip's own retries, timeout and resumed
downloads, then the whole download again after each pause of ``PAUSES_S``. Only when every try
failed does the test that needs the wheel fail (it is never skipped).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from cache_dir import TEST_CACHE, building

CACHE = TEST_CACHE / "wheels"

# Pinned so that every host fetches (and caches) the same files as the 3.11 x86_64 containers.
PIP_TARGET = [
    "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
    "--platform", "manylinux_2_34_x86_64",
]
#: The containers' other tags, after PIP_TARGET's (pip takes each platform tag literally: it
#: does not widen manylinux_2_34 to the older glibc tags a wheel such as uv's carries).
OLDER_TARGETS = [
    "--abi", "abi3", "--abi", "none",
    *[arg for minor in range(33, 4, -1) for arg in ("--platform", f"manylinux_2_{minor}_x86_64")],
    *[arg for tag in ("manylinux2014", "manylinux2010", "manylinux1")
      for arg in ("--platform", f"{tag}_x86_64")],
]
#: pip's own retries: connections and each socket read; and an interrupted download resumed
#: (pip 25.1 and later, through the environment: an older pip ignores it).
PIP_RETRY = ["--retries", "10", "--timeout", "60"]
PIP_RETRY_ENVIRONMENT = {"PIP_RESUME_RETRIES": "5"}
#: Pauses (seconds) before the second and the third try of a whole download.
PAUSES_S = (10, 30)

T = TypeVar("T")


def retried(action: Callable[[], T], what: str, pauses_s: Sequence[float] = PAUSES_S) -> T:
    """ACTION's result; ACTION is called again after each of PAUSES_S while it raises (a
    download: the index answered slowly or not at all). The last failure is raised."""
    for attempt, pause in enumerate([*pauses_s, None]):
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - any failure of a download is tried again
            if pause is None:
                raise
            print(f"[wheels] {what}: try {attempt + 1} failed ({str(error)[-300:]}); "
                  f"again in {pause}s", file=sys.stderr, flush=True)
            time.sleep(pause)
    raise AssertionError("unreachable")


class DownloadError(RuntimeError):
    pass


def pip_download(args: Sequence[str], what: str, timeout: float = 1800,
                 pauses_s: Sequence[float] = PAUSES_S) -> None:
    """``pip download ARGS`` with pip's retries (``PIP_RETRY``), tried again after each of
    PAUSES_S; a failure of every try fails the test, naming WHAT and pip's output."""
    command = [sys.executable, "-m", "pip", "download", *PIP_RETRY, *args]

    def download() -> None:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**PIP_RETRY_ENVIRONMENT, **os.environ})
        if done.returncode != 0:
            raise DownloadError(f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    try:
        retried(download, what, pauses_s)
    except (DownloadError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"pip download of {what} failed, {len(pauses_s) + 1} tries:\n{error}")


@functools.lru_cache(maxsize=None)
def project_wheel(project: str, version: str) -> Path:
    """The cached wheel of PROJECT==VERSION for the containers' Python and platform,
    downloaded first if needed."""
    pattern = f"{project.replace('-', '_')}-{version}-*.whl"
    with building(CACHE / pattern):  # one worker downloads; the others wait and find it
        found = sorted(CACHE.glob(pattern))
        if not found:
            pip_download(["--no-deps", "--only-binary=:all:", *PIP_TARGET, *OLDER_TARGETS,
                          f"{project}=={version}", "-d", str(CACHE)], f"{project}=={version}")
            found = sorted(CACHE.glob(pattern))
    if not found:
        pytest.fail(f"pip download of {project}=={version} left no {pattern} in {CACHE}")
    return found[0]


def wheel(version: str) -> Path:
    """Return the cached sglang wheel for VERSION, downloading it first if needed."""
    return project_wheel("sglang", version)


def locked_wheels(lock: Path) -> Path:
    """A folder holding every file a hashed LOCK names for the containers' Python and platform
    (``pip download --require-hashes``: each file checked), downloaded once per lock."""
    folder = TEST_CACHE / f"locked-wheels-{lock.stem}"
    with building(folder):  # one worker downloads; the others wait and find it
        if not (folder / ".complete").exists():
            pip_download(["--no-deps", "--require-hashes", "--only-binary=:all:", *PIP_TARGET,
                          *OLDER_TARGETS, "-r", str(lock), "-d", str(folder)], lock.name)
            (folder / ".complete").write_text(f"{lock.name}\n")
    return folder


def tiny_wheel(name: str = "stray", version: str = "1.0", body: bytes = b"") -> bytes:
    """A minimal pure-Python wheel of NAME VERSION (one module holding BODY), its RECORD right:
    a package no real lock holds, made here."""
    import base64
    import hashlib
    import io
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": body,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, data in {**files, f"{info}/RECORD": record.encode()}.items():
            wheel.writestr(path, data)
    return buffer.getvalue()
