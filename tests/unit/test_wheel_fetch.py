"""The lock's wheels fetched on the machine running pyinfra (``wheel_fetch.fetch``), with the real
pip against a local package index (PEP 503 pages on disk, tiny wheels made here): a wheel an
earlier set of the cache holds is one file on disk, not downloaded again, and never one whose
bytes changed since. The gateway's set from the real index: tests/network/test_wheel_fetch_smg.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pve_sglang.stack import lock as stack_lock
from pve_sglang.stack.lock import LockError, LockKey
from pve_sglang.stack.wheel_fetch import MANIFEST, fetch, read_manifest, wheel_dir
from wheels import tiny_wheel

PACKAGES = {"alpha": "1.0", "beta": "1.0", "gamma": "2.0"}


@pytest.fixture
def index(tmp_path, monkeypatch) -> dict[str, str]:
    """A local index of PACKAGES' wheels; ``{package: sha256}``. The cache is the test's own."""
    monkeypatch.setenv("PVE_SGLANG_CACHE", str(tmp_path / "cache"))
    digests = {}
    for name, version in PACKAGES.items():
        folder = tmp_path / "simple" / name
        folder.mkdir(parents=True)
        file = f"{name}-{version}-py3-none-any.whl"
        data = tiny_wheel(name, version, f"# {name}\n".encode())
        (folder / file).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
        (folder / "index.html").write_text(
            f'<html><body><a href="{file}#sha256={digests[name]}">{file}</a></body></html>')
    return digests


def lock_of(tmp_path: Path, digests: dict[str, str], names: list[str], note: str = ""):
    text = f"# python 3.11{note}\n" + "".join(
        f"{name}=={PACKAGES[name]} --hash=sha256:{digests[name]}\n" for name in names)
    return stack_lock.parse(tmp_path / f"{'-'.join(names)}{note}.lock", text)


def key_at(tmp_path: Path, simple: str = "simple") -> LockKey:
    return LockKey(pins=(), python="3.11", index_url=(tmp_path / simple).as_uri())


def test_a_second_set_links_the_wheels_the_first_holds_and_fetches_the_rest(tmp_path, index):
    first = lock_of(tmp_path, index, ["alpha", "beta"])
    folder, entries = fetch(first, key_at(tmp_path))
    assert entries == {f"{n}-1.0-py3-none-any.whl": index[n] for n in ("alpha", "beta")}

    second = lock_of(tmp_path, index, ["alpha", "gamma"])
    other, entries = fetch(second, key_at(tmp_path))
    assert other == wheel_dir(second) != folder
    assert entries == {"alpha-1.0-py3-none-any.whl": index["alpha"],
                       "gamma-2.0-py3-none-any.whl": index["gamma"]}
    # alpha is one file on disk for both sets; gamma came from the index.
    assert os.path.samefile(folder / "alpha-1.0-py3-none-any.whl",
                            other / "alpha-1.0-py3-none-any.whl")
    assert read_manifest(other / MANIFEST) == entries


def test_a_set_whose_wheels_the_cache_holds_fetches_nothing(tmp_path, index):
    fetch(lock_of(tmp_path, index, ["alpha", "beta"]), key_at(tmp_path))
    again = lock_of(tmp_path, index, ["alpha", "beta"], note=", another resolution")
    # No index at all: only the links can make this set.
    folder, entries = fetch(again, key_at(tmp_path, "gone"))
    assert sorted(entries) == ["alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl"]
    assert (folder / MANIFEST).exists()


def test_a_cached_wheel_changed_since_its_set_is_downloaded_not_linked(tmp_path, index):
    folder, _ = fetch(lock_of(tmp_path, index, ["alpha", "beta"]), key_at(tmp_path))
    changed = folder / "beta-1.0-py3-none-any.whl"
    changed.write_bytes(changed.read_bytes() + b"\0")  # the first set's file, changed in place
    second = lock_of(tmp_path, index, ["beta", "gamma"])
    other, entries = fetch(second, key_at(tmp_path))
    assert entries["beta-1.0-py3-none-any.whl"] == index["beta"]
    assert not os.path.samefile(changed, other / "beta-1.0-py3-none-any.whl")
    # Without the index, the changed file cannot stand in: the set is refused, nothing written.
    third = lock_of(tmp_path, index, ["alpha", "beta"], note=", third")
    os.unlink(other / "beta-1.0-py3-none-any.whl")
    (other / MANIFEST).unlink()  # the only good beta gone: only the changed one is left
    with pytest.raises(LockError, match="beta"):
        fetch(third, key_at(tmp_path, "gone"))
    assert not (wheel_dir(third) / MANIFEST).exists()
