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
    """A container's exec tool, here: the inner command in its own ``sh -c``."""

    def make_exec_command(self, inner: StringCommand) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(inner))


LOCK = lock_for(default_key())


def copy(store: Path, staging: Path) -> subprocess.CompletedProcess:
    (store / LOCKS).mkdir(parents=True, exist_ok=True)  # the wheel store's, made before
    command = layer.copy_command(LocalExec(), str(store), LOCK, staging=str(staging))
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
