"""The wheel store and the locked install, in real LXC containers, with a small real lock.

The lock is made here with uv (``stack_lock.compile_lock``, the code that makes a user's
lock) for ``requests`` and its dependencies: real wheels from the package index, pure Python
and manylinux ones (charset-normalizer), a few MB, where the deploy's default set is 10 GB.
The deploy is ``pve_sglang/testing/deploys/wheel_store.py``: the deploy's own store and
install operations through the pyinfra CLI, on this machine as the plain LXC host (``@local``)
and in unprivileged containers that have no network (a loopback-only namespace): what they
install can only come from the store, read-only, checked against the lock's hashes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pve_sglang import stack_lock
from pve_sglang.operations.wheels import INCOMING, marker
from pve_sglang.testing.wheel_store_site import UV, WheelStoreSite, installed
from pve_sglang.wheel_fetch import MANIFEST

PINS = (("requests", "2.32.3"),)


@pytest.fixture
def site(tmp_path, lxc_container_factory):
    key = stack_lock.LockKey(pins=PINS, python="3.11")
    lock = stack_lock.compile_lock(key, tmp_path / "small.lock")
    make = lambda **kwargs: lxc_container_factory(**kwargs)[0]  # noqa: E731
    return WheelStoreSite(tmp_path / "site", make, lock, key)


def stray_wheel() -> bytes:
    """A minimal wheel of a package no lock holds."""
    import base64
    import hashlib
    import io
    import zipfile

    files = {"stray.py": b"",
             "stray-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: stray\nVersion: 1.0\n",
             "stray-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()) + "stray-1.0.dist-info/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, data in {**files, "stray-1.0.dist-info/RECORD": record.encode()}.items():
            wheel.writestr(name, data)
    return buffer.getvalue()


def test_store_is_filled_once_and_containers_install_from_it_offline(site):
    first = site.container()
    assert first.attach("ip -o link show | grep -v ': lo:'", check=False).stdout == ""  # no network
    changed = site.deploy(first)
    assert "failed" not in changed, changed
    assert changed["@local"] == [f"Wheel store {site.store}"]
    assert installed(first) == site.lock.packages
    assert f"runs lock {site.lock.id} (small.lock): 5 packages as locked" in site.last.stderr + site.last.stdout
    assert first.attach("/opt/stack/venv/bin/python -c 'import requests, charset_normalizer'").returncode == 0
    # Every locked wheel, each with the lock's sha256, and the marker written last.
    manifest = Path(marker(str(site.store), site.lock)).read_text()
    assert len(manifest.splitlines()) == len(site.lock.packages)
    check = subprocess.run(["sha256sum", "-c", "--quiet", "-"], input=manifest, text=True,
                           cwd=site.store, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert list((site.store / INCOMING).iterdir()) == []
    # Read-only in the container: one container cannot change what another installs.
    attempt = first.attach(f"touch {site.store}/x 2>&1; rm -f {site.store}/*.whl 2>&1", check=False)
    assert "Read-only file system" in attempt.stdout
    assert len(list(site.store.glob("*.whl"))) == len(site.lock.packages)

    assert site.deploy(first) == {}  # converged: nothing changes

    # A second container on the same host: the store is complete, nothing is fetched again.
    fetched = site.cache / "wheels" / site.lock.id
    before = {p.name: p.stat().st_mtime_ns for p in fetched.iterdir()}
    second = site.container()
    changed = site.deploy(first, second)
    assert list(changed) == [second.inventory_name], changed
    assert installed(second) == site.lock.packages
    assert {p.name: p.stat().st_mtime_ns for p in fetched.iterdir()} == before


def test_the_venv_drifting_from_the_lock_is_reconciled(site):
    box = site.container()
    assert "failed" not in site.deploy(box)
    # A package removed and one the lock does not hold: both differ from the lock.
    box.attach(f"{UV} pip uninstall --python /opt/stack/venv/bin/python idna")
    box.attach("cat > /tmp/stray-1.0-py3-none-any.whl", input=stray_wheel())
    box.attach(f"{UV} pip install --offline --python /opt/stack/venv/bin/python "
               "/tmp/stray-1.0-py3-none-any.whl")
    assert "idna" not in installed(box) and "stray" in installed(box)
    changed = site.deploy(box)
    assert changed == {box.inventory_name: ["Stack as locked, from the wheel store"]}, changed
    assert "the venv differs from lock" in site.last.stderr + site.last.stdout
    assert installed(box) == site.lock.packages
    assert site.deploy(box) == {}


def test_a_wheel_that_is_not_the_locked_one_never_enters_the_store(site, monkeypatch):
    # The machine running pyinfra fetched the wheels; one of them is then changed there.
    from pve_sglang.wheel_fetch import fetch
    monkeypatch.setenv("PVE_SGLANG_CACHE", str(site.cache))
    folder, entries = fetch(site.lock, site.key)
    victim = folder / sorted(entries)[0]
    victim.write_bytes(victim.read_bytes() + b"\0")
    changed = site.deploy()
    assert "failed" in changed
    assert "does not have the lock's sha256" in site.last.stderr + site.last.stdout
    assert list(site.store.glob("*.whl")) == []
    assert not Path(marker(str(site.store), site.lock)).exists()
    assert list((site.store / INCOMING).iterdir()) == []
    # Once the machine's copy is right again, the store converges.
    shutil.rmtree(folder)
    assert site.deploy() == {"@local": [f"Wheel store {site.store}"]}
    assert (folder / MANIFEST).exists()
