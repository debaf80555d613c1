"""The wheel store and the locked install, in real LXC containers, with a small real lock.

The lock is made here with uv (``stack_lock.compile_lock``, the code that makes a user's
lock) for ``requests`` and its dependencies: real wheels from the package index, pure Python
and manylinux ones (charset-normalizer), a few MB, where the deploy's default set is 10 GB.
The deploy is ``devtools/deploys/wheel_store.py``: the deploy's own store and
install operations through the pyinfra CLI, on this machine as the plain LXC host (``@local``)
and in unprivileged containers that have no network (a loopback-only namespace): what they
install can only come from the store, read-only, checked against the lock's hashes. Its
downloads (the lock, the store's wheels) retry: the test is in the ``network`` tier.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pve_sglang.stack import lock as stack_lock
from pve_sglang.operations import layer
from pve_sglang.operations.wheels import INCOMING, marker
from devtools.wheel_store_site import UV, WheelStoreSite, installed, own_site_packages
from pve_sglang.stack.wheel_fetch import MANIFEST
from wheels import tiny_wheel

PINS = (("requests", "2.32.3"),)


@pytest.fixture
def site(tmp_path, lxc_container_factory, package_index):
    """The lock (made with retries) and the site; the store's own downloads (the deploy's pip)
    retry as ``package_index`` tells every pip this session starts."""
    key = stack_lock.LockKey(pins=PINS, python="3.11")
    lock = package_index(lambda: stack_lock.compile_lock(key, tmp_path / "small.lock"),
                         "the small lock (uv pip compile)")
    make = lambda **kwargs: lxc_container_factory(**kwargs)[0]  # noqa: E731
    return WheelStoreSite(tmp_path / "site", make, lock, key)


def test_store_is_filled_once_and_containers_install_from_it_offline(site):
    first = site.container()
    assert first.attach("ip -o link show | grep -v ': lo:'", check=False).stdout == ""  # no network
    changed = site.deploy(first)
    assert "failed" not in changed, changed
    assert changed["@local"] == [f"Wheel store {site.store}"]
    assert installed(first) == site.lock.packages
    assert f"runs lock {site.lock.id} (small.lock): 5 packages as locked" in site.last.stderr + site.last.stdout
    assert first.attach("/opt/stack/venv/bin/python -c 'import requests, charset_normalizer'").returncode == 0
    assert uv_caches(first) == [], "the container keeps no uv cache of the venv's install"
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
    box.attach("cat > /tmp/stray-1.0-py3-none-any.whl", input=tiny_wheel())
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
    from pve_sglang.stack.wheel_fetch import fetch
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


OWN = ("requests",)


@pytest.fixture
def layered(site):
    site.own = OWN
    return site


def layer_folder(site) -> Path:
    return Path(layer.path(str(site.store), site.lock))


def uv_caches(box) -> list[str]:
    """uv's caches left in BOX, wherever uv put them: the folders of unpacked wheels
    (``archive-v0``, a 10 GB copy of the layer for a 0.5.23 set) and the deploy's scratch
    caches (``*.uv-cache``)."""
    found = box.attach("find / -xdev \\( -name archive-v0 -o -name '*.uv-cache' \\) -type d "
                       "-print -prune 2>/dev/null; true").stdout
    return found.split()


def builds_layer(changed: dict, box) -> bool:
    """Whether BOX's changed operations include the shared layer's."""
    return any(name.startswith("Shared stack layer") for name in changed.get(box.inventory_name, []))


def test_the_shared_layer_is_built_once_owned_by_the_host_and_read_only(layered):
    site = layered
    first = site.container()
    changed = site.deploy(first)
    assert "failed" not in changed, changed
    assert builds_layer(changed, first)
    # The layer: every locked package but the venv's own, the host's root's, marker last.
    folder = layer_folder(site)
    names = {p.name for p in folder.iterdir()}
    assert {"idna", "urllib3", "certifi", "charset_normalizer"} <= names
    assert not any(n.startswith("requests") for n in names)
    assert all(p.stat().st_uid == 0 and not p.stat().st_mode & 0o022 for p in folder.rglob("*"))
    assert Path(layer.marker(str(site.store), site.lock)).is_file()
    assert list(folder.rglob("*.pyc")), "bytecode compiled once, in the layer"
    assert not list(site.store.glob(".incoming-layer-*"))
    # These containers' roots are overlays (lxc_env): the host cannot rename the staging out
    # of one, so it was copied (tests/lxc/test_release_stack_lxc.py sees the rename).
    assert f"the shared layer of lock {site.lock.id} copied into" in site.last.stderr + site.last.stdout
    # The venv holds only its own part and imports the rest from the layer.
    own = own_site_packages(first)
    assert any(n.startswith("requests") for n in own) and not any(n.startswith("idna") for n in own)
    assert installed(first) == site.lock.packages
    assert first.attach("/opt/stack/venv/bin/python -c 'import idna; print(idna.__file__)'"
                        ).stdout.startswith(str(folder))
    assert f"runs lock {site.lock.id} (small.lock): 5 packages as locked" in site.last.stderr + site.last.stdout
    assert first.attach("test -e /var/tmp/pve-sglang-layer", check=False).returncode != 0
    assert uv_caches(first) == [], "the container keeps no uv cache of the layer or the venv"
    attempt = first.attach(f"touch {folder}/idna/x 2>&1; rm -rf {folder}/idna 2>&1", check=False)
    assert "Read-only file system" in attempt.stdout
    assert (folder / "idna" / "__init__.py").exists()

    assert site.deploy(first) == {}  # converged

    # A second container finds the layer: it installs its own part only.
    second = site.container()
    changed = site.deploy(first, second)
    assert list(changed) == [second.inventory_name], changed
    assert not builds_layer(changed, second)
    assert installed(second) == site.lock.packages
    assert not any(n.startswith("idna") for n in own_site_packages(second))


def test_containers_new_and_old_in_one_run_share_one_layer_build(site):
    # A container whose venv holds the whole set (shared layer off), then the layer turned on
    # with a new container beside it: one build, and the old venv gives up its copies.
    old = site.container()
    assert "failed" not in site.deploy(old)
    assert any(n.startswith("idna") for n in own_site_packages(old))
    site.own = OWN
    new = site.container()
    changed = site.deploy(old, new)
    assert "failed" not in changed, changed
    out = site.last.stderr + site.last.stdout
    assert out.count("building the shared layer") == 1, out
    assert out.count("was built by another container") == 1, out
    assert "in the venv, not the shared layer: idna" in out
    for box in (old, new):
        assert installed(box) == site.lock.packages
        assert not any(n.startswith("idna") for n in own_site_packages(box))
    assert site.deploy(old, new) == {}


def test_a_layered_venv_drifting_is_reconciled(layered):
    site = layered
    box = site.container()
    assert "failed" not in site.deploy(box)
    # A copy of a layer's package in the venv itself, and a package the lock does not hold.
    box.attach(f"{UV} pip install --offline --no-index --find-links {site.store} --no-deps "
               f"--python /opt/stack/venv/bin/python idna=={site.lock.packages['idna']}")
    box.attach("cat > /tmp/stray-1.0-py3-none-any.whl", input=tiny_wheel())
    box.attach(f"{UV} pip install --offline --python /opt/stack/venv/bin/python "
               "/tmp/stray-1.0-py3-none-any.whl")
    changed = site.deploy(box)
    assert changed == {box.inventory_name: ["Stack as locked, from the wheel store"]}, changed
    out = site.last.stderr + site.last.stdout
    assert "in the venv, not the shared layer: idna" in out and "not in the lock: stray" in out
    assert installed(box) == site.lock.packages
    assert not any(n.startswith(("idna", "stray")) for n in own_site_packages(box))
    assert site.deploy(box) == {}

    # A copy cut short (no marker yet, a half-filled incoming folder): the next run builds it
    # again, and what the cut left goes.
    Path(layer.marker(str(site.store), site.lock)).unlink()
    cut = site.store / f".incoming-layer-{site.lock.id}"
    cut.mkdir()
    (cut / "half-copied.py").write_text("")
    changed = site.deploy(box)
    assert builds_layer(changed, box), changed
    assert Path(layer.marker(str(site.store), site.lock)).is_file() and not cut.exists()
    assert not (layer_folder(site) / "half-copied.py").exists()
    assert installed(box) == site.lock.packages
    assert site.deploy(box) == {}


def test_a_damaged_layer_is_built_again(layered):
    """A package's files gone from the host's layer (a disk error, a clean-up by hand): the
    venv no longer finds it as locked, so the layer is built again, once, and the container
    runs the locked set; the run after changes nothing."""
    site = layered
    box = site.container()
    assert "failed" not in site.deploy(box)
    folder = layer_folder(site)
    for gone in [folder / "idna", *folder.glob("idna-*.dist-info")]:
        shutil.rmtree(gone)
    changed = site.deploy(box)
    assert builds_layer(changed, box), changed
    out = site.last.stderr + site.last.stdout
    assert f"the shared layer of lock {site.lock.id}" in out and "lacks what the venv should find" in out
    assert "idna" in out and out.count("building the shared layer") == 1, out
    assert (folder / "idna" / "__init__.py").exists()
    assert installed(box) == site.lock.packages
    assert site.deploy(box) == {}
