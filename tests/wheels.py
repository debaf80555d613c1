"""Real sglang wheels from the package index, downloaded once into <repo>/.cache/wheels.

A failed download fails the test that needs the wheel instead of skipping it.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "wheels"

# Pinned so that every host fetches (and caches) the same files as the 3.11 x86_64 containers.
PIP_TARGET = [
    "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
    "--platform", "manylinux_2_34_x86_64",
]


@functools.lru_cache(maxsize=None)
def wheel(version: str) -> Path:
    """Return the cached sglang wheel for VERSION, downloading it first if needed."""
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *PIP_TARGET]
    done = subprocess.run(
        [*command, f"sglang=={version}", "-d", str(CACHE)], capture_output=True, text=True, timeout=600
    )
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if done.returncode != 0 or not found:
        pytest.fail(f"pip download of sglang=={version} failed:\n{done.stdout}\n{done.stderr}")
    return found[0]
