"""The shared layer's copy out of the building container into the host's store
(``layer.copy_command``), run for real by ``sh``: the container's side is a local ``sh -c``
(as ``lxc-attach ... -- sh -c`` and ``pct exec ... -- sh -c`` run it), STAGING and the store
are folders of this test.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pyinfra.api import QuoteString, StringCommand

from pve_sglang.operations import layer
from pve_sglang.stack.store_retention import LOCKS
from pve_sglang.stack.lock import lock_for, default_key


class LocalExec:
    """A container's exec tool, here: the inner command in its own ``sh -c``; ROOTFS, what
    the host's tool says of the container's root (None: it cannot tell)."""

    def __init__(self, rootfs: str | None = None):
        self.rootfs = rootfs

    def make_exec_command(self, inner: StringCommand) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(inner))

    def make_rootfs_command(self) -> StringCommand | None:
        if self.rootfs is None:
            return None
        return StringCommand("echo", QuoteString(f"lxc.rootfs.path = dir:{self.rootfs}"))


LOCK = lock_for(default_key())


def copy(store: Path, staging: Path, rootfs: str | None = None) -> subprocess.CompletedProcess:
    (store / LOCKS).mkdir(parents=True, exist_ok=True)  # the wheel store's, made before
    command = layer.copy_command(LocalExec(rootfs), str(store), LOCK, staging=str(staging))
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True)


def staged(tmp_path: Path) -> Path:
    staging = tmp_path / "pve-sglang-layer"
    (staging / "torch" / "lib").mkdir(parents=True)
    (staging / "torch" / "lib" / "libtorch.so").write_bytes(b"\0" * 4096)
    (staging / "torch" / "__init__.py").write_text("x = 1\n")
    (staging / "torch-2.14.1.dist-info").mkdir()
    (staging / "torch-2.14.1.dist-info" / "METADATA").write_text("Name: torch\n")
    return staging


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_staging_moves_into_the_store_and_leaves_the_container(tmp_path):
    staging = staged(tmp_path)
    before = files(staging)
    store = tmp_path / "store"
    done = copy(store, staging)
    assert done.returncode == 0, done.stderr
    final = Path(layer.path(str(store), LOCK))
    assert files(final) == before
    assert Path(layer.marker(str(store), LOCK)).is_file()
    assert not list(store.glob(".incoming-layer-*"))
    # The staging's files went as they were copied: the copy never needs the layer's size
    # twice in the container's filesystem and the store's (10 GB each for a 0.5.23 set).
    assert not staging.exists() or files(staging) == {}
    assert all(not p.stat().st_mode & 0o022 for p in final.rglob("*"))


def test_a_copy_that_fails_leaves_no_marker_and_no_layer(tmp_path):
    store = tmp_path / "store"
    done = copy(store, tmp_path / "no-such-staging")  # the archive fails
    assert done.returncode != 0
    assert not Path(layer.marker(str(store), LOCK)).exists()
    assert not Path(layer.path(str(store), LOCK)).exists()


def test_a_staging_the_host_reaches_through_a_symlink_is_copied_and_the_target_left(tmp_path):
    """The container's root may point a symlink anywhere on the host: the host's view of the
    staging through one is never renamed (nor its target touched); tar copies the staging."""
    staging = staged(tmp_path / "container")
    before = files(staging)
    root = tmp_path / "rootfs"
    decoy = tmp_path / "host-folder"
    (decoy / "pve-sglang-layer").mkdir(parents=True)
    (decoy / "pve-sglang-layer" / "host-file").write_text("the host's\n")
    # The host's view of the staging's folder, a symlink to the decoy.
    seen = Path(str(root) + str(staging.parent))
    seen.parent.mkdir(parents=True)
    seen.symlink_to(decoy)
    store = tmp_path / "store"
    done = copy(store, staging, rootfs=str(root))
    assert done.returncode == 0, done.stderr
    assert layer.RENAMED not in done.stdout.split()
    assert files(Path(layer.path(str(store), LOCK))) == before
    assert files(decoy) == {"pve-sglang-layer/host-file": b"the host's\n"}


def test_a_root_the_host_cannot_find_falls_back_to_the_copy(tmp_path):
    staging = staged(tmp_path)
    before = files(staging)
    store = tmp_path / "store"
    done = copy(store, staging, rootfs=str(tmp_path / "no-such-root"))
    assert done.returncode == 0, done.stderr
    assert files(Path(layer.path(str(store), LOCK))) == before
