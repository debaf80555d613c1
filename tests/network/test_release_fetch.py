"""A release not recorded in group_data/releases/ is fetched from the package index once (pip
download --no-deps) and cached. The recorded releases' rules, in the fast tier:
tests/unit/test_releases.py."""

from __future__ import annotations

from pve_sglang.stack import releases
from test_releases import FIXTURES, recorded


def test_a_release_not_recorded_is_fetched_once_with_pip_and_cached(tmp_path, monkeypatch, package_index):
    """0.5.10 is not in group_data/releases/: its wheel comes from the real index (pip
    download --no-deps), its requirements land in this machine's cache, the same lines as the
    recorded METADATA; a second read fetches nothing."""
    monkeypatch.setenv("PVE_SGLANG_CACHE", str(tmp_path))
    release = releases.read_release("0.5.10")
    assert release == recorded("0.5.10")
    [cached] = (tmp_path / "releases").iterdir()
    assert cached.name == "sglang-0.5.10.txt"
    assert cached.read_text() == releases.record_text(
        "0.5.10", "sglang-0.5.10-py3-none-any.whl (METADATA)",
        (FIXTURES / "sglang-0.5.10.METADATA").read_text())
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip could not fetch it again
    assert releases.read_release("0.5.10") == release
