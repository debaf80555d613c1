"""The stack lock made by uv against the real package index: a user's set gets its lock made once
on this machine and reused, a set uv cannot resolve or without a wheel for every package is
refused at lock time and leaves no lock, and the newest release locks for Debian 12. The
repository's locks and the checks that need no index: tests/unit/test_stack_lock_checks.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pve_sglang.stack import lock as stack_lock


def test_the_lock_of_a_users_set_is_made_once_here_and_reused(tmp_path, package_index):
    """Another release set than the repository's: uv makes its lock (real index, with uv's
    retries and the first run tried again) into this machine's cache; a later run (another
    process) finds it there and makes nothing."""
    env = {**os.environ, "PVE_SGLANG_CACHE": str(tmp_path)}
    script = ("from pve_sglang.stack import lock as s; k = s.LockKey(pins=(('sglang', '0.5.8'), "
              "('torch', '2.9.1'), ('flashinfer-python', '0.6.1')), python='3.11'); "
              "l = s.lock_for(k); print(l.path, l.packages['sglang'], len(l.packages))")

    def make() -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done

    first = package_index(make, "the lock of sglang 0.5.8 (uv pip compile)")
    path, version, count = first.stdout.split()
    assert Path(path).parent == tmp_path / "locks" and version == "0.5.8" and int(count) > 100
    made = Path(path).stat().st_mtime_ns
    # uv could not make it again: an index that does not answer.
    offline = {**env, "UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple", "UV_OFFLINE": "1"}
    again = subprocess.run([sys.executable, "-c", script], env=offline, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and Path(path).stat().st_mtime_ns == made


def test_a_set_uv_cannot_resolve_says_so_and_leaves_no_lock(tmp_path, package_index):
    key = stack_lock.LockKey(pins=(("sglang", "0.0.0"), ("torch", "2.9.1"),
                                   ("flashinfer-python", "0.6.3")), python="3.11")
    with pytest.raises(stack_lock.LockError, match=r"(?s)could not make the lock of sglang==0\.0\.0 .*"
                       r"give a lock in stack_lock"):
        stack_lock.compile_lock(key, tmp_path / key.name)
    assert list(tmp_path.iterdir()) == []


def test_the_newest_release_locks_for_debian_12(tmp_path, package_index):
    """Issue 21: from 0.5.11 sglang ships manylinux_2_34 wheels only, which a lock for
    manylinux_2_28 could not take. Locked here with uv against the real index."""
    values = {"sglang_version": "0.5.23", "torch_version": None, "flashinfer_version": None,
              "stack_python": "3.11", "pip_index_url": None, "torch_index_url": None}
    key = stack_lock.key_of(values)
    assert key.platform == "x86_64-manylinux_2_36"
    lock = stack_lock.compile_lock(key, tmp_path / key.name)
    assert (lock.platform, lock.python) == ("x86_64-manylinux_2_36", "3.11")
    assert {n: lock.packages[n] for n in ("sglang", "torch", "flashinfer-python", "sglang-kernel")} == {
        "sglang": "0.5.23", "torch": "2.14.1", "flashinfer-python": "0.7.2", "sglang-kernel": "0.4.10"}
    assert stack_lock.parse(lock.path).platform == "x86_64-manylinux_2_36"


@pytest.mark.parametrize("sglang, python, missing", [
    # outlines 0.1.11 (0.5.23's pin) pins outlines-core 0.1.26: no cp313 wheel (Debian 13).
    ("0.5.23", "3.13", "outlines-core==0.1.26 has no usable wheels"),
    # 0.5.19 to 0.5.21 pin cuda-tile 1.6.0rc5, published as an sdist only.
    ("0.5.21", "3.11", "cuda-tile==1.6.0rc5 has no usable wheels"),
])
def test_a_set_without_a_wheel_for_every_package_is_refused_at_lock_time(tmp_path, sglang, python,
                                                                        missing, package_index):
    """The store and the containers install wheels only: a lock naming an sdist would fail
    later, when its wheels are fetched; uv names the package now."""
    values = {"sglang_version": sglang, "torch_version": None, "flashinfer_version": None,
              "stack_python": python, "pip_index_url": None, "torch_index_url": None}
    key = stack_lock.key_of(values)
    with pytest.raises(stack_lock.LockError) as caught:
        stack_lock.compile_lock(key, tmp_path / key.name)
    assert missing in str(caught.value)
    assert list(tmp_path.iterdir()) == []
