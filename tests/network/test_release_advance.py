"""``make release VERSION=X`` (devtools/release.py ``advance``): the default moves only on
proof, and a release that fails a check leaves the repository as it was. Its proof end to end
(the whole deploy into a real container) is in tests/lxc/test_release_stack_lxc.py, in the default
set's proof container and wheel store: one whole-set deploy's container for both.

Each test runs on a copy of the repository's ``group_data/`` and ``docs/settings.md``: what
``advance`` writes, it writes there. The wheels of a set come from
``$PVE_SGLANG_TEST_CACHE/pyinfra-machine-cache`` (shared with tests/lxc/test_release_stack_lxc.py:
fetched once, found by every later run).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest

from cache_dir import TEST_CACHE

from devtools import release
from pve_sglang.server import startup_log

REPO = Path(__file__).resolve().parents[2]
CACHE = TEST_CACHE
MACHINE_CACHE = CACHE / "pyinfra-machine-cache"


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A copy of the repository's group_data/ and settings doc; this machine's cache shared."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "group_data", copy / "group_data")
    (copy / "docs").mkdir()
    shutil.copy(REPO / "docs" / "settings.md", copy / "docs" / "settings.md")
    monkeypatch.setenv("PVE_SGLANG_CACHE", str(MACHINE_CACHE))
    # This machine's pip configuration (a constraints file) is not the lock's.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return copy


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_release_without_a_wheels_only_lock_is_refused_and_nothing_changes(repo, package_index):
    """0.5.21 pins cuda-tile 1.6.0rc5, published as an sdist only: the store cannot hold it."""
    before = digest(repo)
    with pytest.raises(release.NotProven) as caught:
        release.advance("0.5.21", repo=repo)
    assert str(caught.value).startswith("sglang 0.5.21: lock: ")  # the step that failed
    assert "cuda-tile==1.6.0rc5 has no usable wheels" in str(caught.value)
    assert "the repository is unchanged" in str(caught.value)
    assert digest(repo) == before


def test_a_rendered_flag_the_release_does_not_know_is_refused_and_nothing_changes(repo, package_index):
    before = digest(repo)
    with pytest.raises(release.NotProven) as caught:
        release.advance("0.5.17", repo=repo, overrides={"extra_server_args": ["--no-such-flag"]})
    assert str(caught.value).startswith("sglang 0.5.17: flags: ")  # the step that failed
    assert "sglang 0.5.17 does not know --no-such-flag" in str(caught.value)
    assert digest(repo) == before


def test_the_watch_lines_are_found_in_the_sources_and_a_line_that_is_not_is_named(sglang_wheel, monkeypatch):
    wheel = sglang_wheel("0.5.17")
    assert release.missing_log_lines(wheel) == []
    monkeypatch.setattr(startup_log, "PHASES", [
        *startup_log.PHASES, ("never", re.compile(r"No release prints \d+ of this"))])
    assert release.missing_log_lines(wheel) == [r"phase 'never' (No release prints \d+ of this)"]
