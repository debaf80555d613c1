"""The test suite's downloads retry (tests/wheels.py, devtools/lxc_env.py): a failure of the
package index or of a Debian mirror is tried again, and only a failure of every try fails.

Real tools: pip against an index that has nothing (a local folder), and a stand-in for
debootstrap first on PATH that fails on its first run (named so in the test's name).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools import lxc_env
import wheels


def test_retried_returns_the_first_success_after_failures(capsys):
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError(f"read timed out ({len(calls)})")
        return "wheel"

    assert wheels.retried(flaky, "a flaky download", pauses_s=(0, 0)) == "wheel"
    assert len(calls) == 3
    err = capsys.readouterr().err
    assert "a flaky download: try 1 failed (read timed out (1)); again in 0s" in err
    assert "try 2 failed" in err


def test_retried_raises_the_last_failure_once_every_try_failed():
    calls = []

    def down() -> None:
        calls.append(1)
        raise OSError(f"unreachable ({len(calls)})")

    with pytest.raises(OSError, match=r"unreachable \(3\)"):
        wheels.retried(down, "a download", pauses_s=(0, 0))
    assert len(calls) == 3


def test_pip_download_from_an_index_without_the_package_fails_after_every_try(tmp_path, capsys):
    empty = tmp_path / "index"
    empty.mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"pip download of nothing-here==1\.0 failed, "
                                                    r"3 tries"):
        wheels.pip_download(["--index-url", empty.as_uri(), "--no-deps", "nothing-here==1.0",
                             "-d", str(tmp_path / "out")], "nothing-here==1.0", pauses_s=(0, 0))
    err = capsys.readouterr().err
    assert "nothing-here==1.0: try 1 failed" in err and "try 2 failed" in err


# Fails on its first run (after leaving a file in the rootfs), succeeds on the next; counts runs.
STANDIN_DEBOOTSTRAP = """#!/bin/sh
for rootfs; do :; done
runs=$(($(cat "$COUNT" 2>/dev/null || echo 0) + 1))
echo "$runs" > "$COUNT"
[ -e "$rootfs/half-done" ] && { echo "left over from the failed run" >&2; exit 2; }
mkdir -p "$rootfs"
if [ "$runs" -le "$FAILURES" ]; then
  touch "$rootfs/half-done"
  echo "E: Couldn't download packages: systemd" >&2
  exit 1
fi
touch "$rootfs/complete"
"""


@pytest.fixture
def standin_debootstrap(tmp_path, monkeypatch):
    """A debootstrap stand-in first on PATH; sets how many runs fail, returns the run count."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "debootstrap").write_text(STANDIN_DEBOOTSTRAP)
    (bin_dir / "debootstrap").chmod(0o755)
    count = tmp_path / "runs"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COUNT", str(count))

    def runs(failures: int):
        monkeypatch.setenv("FAILURES", str(failures))
        return lambda: int(count.read_text())

    return runs


def test_rootfs_build_tries_debootstrap_again_from_scratch_via_standin(standin_debootstrap,
                                                                       tmp_path):
    runs = standin_debootstrap(failures=1)
    rootfs = tmp_path / "rootfs"
    lxc_env.debootstrap(rootfs, pauses_s=(0, 0))
    assert runs() == 2
    assert sorted(p.name for p in rootfs.iterdir()) == ["complete"]


def test_rootfs_build_fails_naming_the_tries_via_standin(standin_debootstrap, tmp_path):
    runs = standin_debootstrap(failures=3)
    with pytest.raises(RuntimeError, match=r"(?s)debootstrap failed \(1\), 3 tries:\n.*Couldn't "
                                           r"download packages"):
        lxc_env.debootstrap(Path(tmp_path / "rootfs"), pauses_s=(0, 0))
    assert runs() == 3
