"""Issue 21's proof, without a GPU: the whole deploy of a release's locked set into a real
unprivileged LXC container, from the host's wheel store with the shared layer, up to the
deploy's own flag check; then the release's real argument parser on the unit's flags.

Release: the default (0.5.23, the newest on the index), in a first container (the store
filled, the shared layer built) and a second one of the same host (the layer found: sglang
alone installed). The same proof of 0.5.17, a release the issue does not name (torch 2.11.0,
flashinfer 0.6.15.post1, sglang-kernel 0.4.5, CUDA 13), is ``make release``'s, in
tests/network/test_release_advance.py; ``PVE_SGLANG_PROVE_RELEASES="0.5.17"`` runs this file's for it
too. ``make release``'s own proof end to end (0.5.17) runs last, as an upgrade in the default
set's container and store: one whole-set deploy's container and store for both proofs. The
deploy is ``devtools/release_proof.py``, through pyinfra's CLI, with this machine as
the plain LXC host. Run with ``-s``: each deploy's time, disk peak, and the times of its store,
layer and venv steps.

Downloads: each set is 4 to 4.5 GB of wheels, fetched once by the machine running pyinfra into
``$PVE_SGLANG_TEST_CACHE/pyinfra-machine-cache`` (``.cache/`` without it) and found there by
every later run (the store of each run is filled from it, nothing downloaded). The container
itself downloads nothing (its pip sees only uv's wheel). A proof of 0.5.23 takes 12.1 GB of
free space at its peak (the layer, the container; the store's wheels are links to the cache:
``release_proof.PEAK_BYTES``), given back at its end.

Debian 13 (Proxmox VE 9's ``debian-13-standard``, ``lxc_release: trixie``): its Python 3.13
has no wheels-only lock of 0.5.23's set (outlines-core 0.1.26 has no cp313 wheel:
tests/network/test_stack_lock.py), so its container deploys sglang alone (``sglang-no-deps``), end to
end up to the flag check, from the trixie rootfs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from cache_dir import TEST_CACHE

from devtools import lxc_env
from devtools import release
from devtools.release_proof import (UPGRADE_BYTES, DiskPeak, ReleaseDeploy, changed,
                                     disk_shortfall, failed)
from devtools.wheel_store_site import installed
from pve_sglang.project import load_defaults
from pve_sglang.stack import lock as stack_lock
from test_release_advance import repo  # noqa: F401 - the fixture: a copy of group_data/
from wheels import OLDER_TARGETS, pip_download

REPO = Path(__file__).resolve().parents[2]
CACHE = TEST_CACHE
MACHINE_CACHE = CACHE / "pyinfra-machine-cache"
#: The default release, and those named in PVE_SGLANG_PROVE_RELEASES (``"0.5.17 0.5.22"``: about
#: 2.5 minutes and 4 GB of wheels fetched once each; tests/network/test_release_advance.py proves 0.5.17
#: in the default suite already).
RELEASES = (load_defaults()["sglang_version"],
            *os.environ.get("PVE_SGLANG_PROVE_RELEASES", "").split())
TOOLS_LOCK = "/opt/sglang/venv/pve-sglang.lock"  # the serving stack's (venv_path links to it)


@pytest.fixture(scope="module", params=RELEASES)
def proof(request, tmp_path_factory, lxc_host, pypi_wheel, package_index):
    """The first deploy of the release's set: (the deploy, its CLI run)."""
    version = request.param
    short = disk_shortfall(tmp_path_factory.getbasetemp())
    if short:
        pytest.skip(short)
    deploy = ReleaseDeploy(tmp_path_factory.mktemp(f"release-{version}"), version,
                           pypi_wheel("uv", load_defaults()["uv_version"]), MACHINE_CACHE)
    try:
        with DiskPeak(deploy.root) as disk:
            done = deploy.run_cli()
        print(f"[release {version}] first container: {deploy.seconds:.1f} s, {disk.words()}",
              flush=True)
        show_log(deploy)
        yield deploy, done
    finally:
        deploy.destroy()
        lxc_env.remove_tree(deploy.root)  # the store and the layers: 11-21 GB


def show_log(deploy: ReleaseDeploy) -> None:
    """The run's own lines (the store, the layer, the venv) with their seconds: where the
    time goes (pytest -s shows them)."""
    for at, line in deploy.log:
        if any(word in line for word in ("wheel store", "shared layer", "lock ")):
            print(f"    {at:7.1f} s  {line.strip()[:160]}")


def test_the_locked_set_deploys_from_the_store_with_the_shared_layer(proof):
    deploy, done = proof
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    results = json.loads(done.stdout)
    version = deploy.container["sglang_version"]
    assert failed(results) == []
    names = changed(results)
    # The container's steps run nested (the container is created in this run): bare names.
    assert any(name.startswith("Shared stack layer") for name in names), names
    # The container's root is a folder of this host (the deploy made it with LXC's dir
    # backend) on the store's filesystem: its 10 GB layer was renamed into the store.
    assert re.search(r"the shared layer of lock \w+ renamed into", done.stderr), done.stderr[-3000:]
    assert any("sglang stack as locked" in name and "from the host's wheel store" in name
               for name in names), names
    # The deploy's own flag check ran against the installed release, before the unit.
    ops = [op["name"] for op in results["results"]["operations"]]
    check = ops.index(f"Server flags exist in sglang {version}")
    assert check < ops.index("systemd unit sglang.service")
    # The venv is the lock, package for package: sglang its own, the rest from the layer.
    lock = stack_lock.parse(Path(TOOLS_LOCK), deploy.attach(f"cat {TOOLS_LOCK}").stdout)
    assert lock.packages["sglang"] == version
    assert installed(deploy, "/opt/sglang/venv/bin/python") == lock.packages
    torch_at = deploy.attach("/opt/sglang/venv/bin/python -c 'import importlib.util as u; "
                             "print(u.find_spec(\"torch\").origin)'").stdout
    assert torch_at.startswith(str(deploy.store)), torch_at
    assert "Python 3.11" in deploy.attach("/opt/sglang/venv/bin/python --version").stdout
    # The layer's staging and uv's cache of it are gone from the container (10 GB each).
    left = deploy.attach("find / -xdev \\( -name archive-v0 -o -name '*.uv-cache' -o -path "
                         "/var/tmp/pve-sglang-layer \\) -prune -print 2>/dev/null; true").stdout
    assert left.split() == []


def test_the_releases_real_parser_takes_every_flag_of_the_unit(proof):
    deploy, done = proof
    assert done.returncode == 0
    args = deploy.unit_args()
    assert "--model-path" in args and "--tp-size" in args
    print(f"[release {deploy.container['sglang_version']}] the unit's server flags: {args}")
    verdict = deploy.real_parser(args)
    assert verdict.version == deploy.container["sglang_version"]
    assert verdict.error is None, verdict
    # A flag the release does not know is refused by the same parser (the check can fail).
    assert deploy.real_parser([*args, "--no-such-flag"]).error is not None
    # Deprecated spellings are the flag helpers' (pve_sglang/server); shown, not asserted here.
    print(f"[release {verdict.version}] deprecation warnings: {verdict.deprecated}")


def test_a_second_run_changes_nothing(proof):
    deploy, done = proof
    assert done.returncode == 0
    again = deploy.run_cli()
    assert again.returncode == 0, again.stderr[-3000:]
    print(f"[release {deploy.container['sglang_version']}] converged run: {deploy.seconds:.1f} s")
    assert changed(json.loads(again.stdout)) == []


def test_a_second_container_of_the_host_installs_sglang_alone(proof, tmp_path_factory,
                                                               pypi_wheel):
    """A second container on the same host, from the same store: the layer is found, not
    built; the venv installs sglang only, and is the lock."""
    deploy, done = proof
    assert done.returncode == 0
    version = deploy.container["sglang_version"]
    second = ReleaseDeploy(tmp_path_factory.mktemp(f"release-{version}-second"), version,
                           pypi_wheel("uv", load_defaults()["uv_version"]), MACHINE_CACHE,
                           name="pvs-release-2", store=deploy.store)
    try:
        with DiskPeak(second.root) as disk:
            again = second.run_cli()
        print(f"[release {version}] second container: {second.seconds:.1f} s, {disk.words()}")
        show_log(second)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-6000:]
        results = json.loads(again.stdout)
        assert failed(results) == []
        assert "building the shared layer" not in again.stderr
        ops = [op["name"] for op in results["results"]["operations"]]
        assert f"Server flags exist in sglang {version}" in ops
        lock = stack_lock.parse(Path(TOOLS_LOCK), second.attach(f"cat {TOOLS_LOCK}").stdout)
        assert installed(second, "/opt/sglang/venv/bin/python") == lock.packages
        assert second.real_parser().error is None
    finally:
        second.destroy()
        lxc_env.remove_tree(second.root)


# --- make release, in the same container and store ---------------------------------------------

def test_make_release_proves_a_release_end_to_end_in_the_same_container_and_store(proof, repo):  # noqa: F811 - the imported fixture
    """``make release VERSION=0.5.17`` (devtools/release.py ``advance``; 0.5.17 recorded
    already): its lock, its wheels, the watch's lines, the flags, the whole deploy with the real
    parser on the unit and a second run changing nothing, here as an upgrade in the default
    set's proof container and wheel store (one whole-set deploy's container for both proofs);
    then the copy's default is 0.5.17, with its lock beside the tuned preset's. Last of the
    proof's tests: the container serves 0.5.17 after it."""
    deploy, done = proof
    assert done.returncode == 0
    if deploy.container["sglang_version"] != RELEASES[0]:
        pytest.skip("make release is proven once, in the default set's proof")
    short = disk_shortfall(deploy.root, UPGRADE_BYTES)
    if short:
        pytest.skip(short)
    try:
        report = release.advance("0.5.17", repo=repo, site=deploy)
    except release.DiskShort as error:
        # advance checks the disk again a minute later (after the lock and the watch's lines),
        # while the other pytest worker's tests write GBs: a machine short of room then is this
        # check's skip, not a failed proof (13.1 of 15 GB free once, where this one had passed).
        pytest.skip(str(error))
    steps = [name for name, _, _ in report.steps]
    assert steps == ["requirements", "settings", "lock", "log lines", "flags", "deploy", "repository"]
    print("[release 0.5.17] steps:", report.steps)
    assert load_defaults(repo / "group_data" / "all.py")["sglang_version"] == "0.5.17"
    assert {p.name for p in (repo / "group_data" / "locks").glob("*.txt")} == {
        "sglang-0.5.17-torch-2.11.0-flashinfer-0.6.15.post1-py3.11.txt",
        "sglang-0.5.9-torch-2.9.1-flashinfer-0.6.3-py3.11.txt"}
    recorded = "group_data/releases/sglang-0.5.17.txt"
    assert (repo / recorded).read_text() == (REPO / recorded).read_text()  # the same METADATA
    assert '| `sglang_version` | container | `"0.5.17"` |' in (repo / "docs" / "settings.md").read_text()
    # The proof ran in this container: it serves 0.5.17's set now, beside the default's stack.
    lock = stack_lock.parse(Path(TOOLS_LOCK), deploy.attach(f"cat {TOOLS_LOCK}").stdout)
    assert lock.packages["sglang"] == "0.5.17"
    assert installed(deploy, "/opt/sglang/venv/bin/python") == lock.packages


# --- Debian 13 --------------------------------------------------------------------------------

def cp313_sglang_wheel(version: str) -> Path:
    """sglang VERSION's wheel for Python 3.13 (Debian 13), downloaded once."""
    folder = CACHE / "wheels-cp313"
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        pip_download(["--no-deps", "--only-binary=:all:", "--python-version", "3.13",
                      "--implementation", "cp", "--abi", "cp313", "--platform",
                      "manylinux_2_34_x86_64", *OLDER_TARGETS, f"sglang=={version}", "-d",
                      str(folder)], f"sglang=={version} for Python 3.13")
        found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    return found[0]


def test_a_debian_13_container_deploys_end_to_end(tmp_path, lxc_host, pypi_wheel, package_index):
    version = load_defaults()["sglang_version"]
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    shutil.copy(cp313_sglang_wheel(version), wheelhouse)
    deploy = ReleaseDeploy(
        tmp_path / "site", version, pypi_wheel("uv", load_defaults()["uv_version"]),
        MACHINE_CACHE, suite="trixie", name="pvs-trixie",
        lxc_config=[f"lxc.mount.entry = {wheelhouse} opt/wheelhouse none bind,ro,create=dir 0 0"])
    deploy.container.update({"stack_install": "sglang-no-deps", "wheel_store": None,
                             "wheelhouse": "/opt/wheelhouse"})
    lxc_env.reachable_by_container_root(wheelhouse)
    try:
        done = deploy.run_cli()
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        results = json.loads(done.stdout)
        assert failed(results) == []
        names = changed(results)
        assert any("Create container pvs-trixie" in name for name in names), names
        assert 'VERSION_ID="13"' in deploy.attach("cat /etc/os-release").stdout
        # stack_python followed lxc_release: the venv is Debian 13's Python.
        assert "Python 3.13" in deploy.attach("/opt/sglang/venv/bin/python --version").stdout
        assert deploy.attach("/opt/sglang/venv/bin/python -c 'import importlib.metadata as m; "
                             "print(m.version(\"sglang\"))'").stdout.strip() == version
        ops = [op["name"] for op in results["results"]["operations"]]
        assert f"Server flags exist in sglang {version}" in ops  # nested: the container is new
        assert "--model-path" in deploy.unit_args()
        again = deploy.run_cli()
        assert again.returncode == 0 and changed(json.loads(again.stdout)) == []
    finally:
        deploy.destroy()
