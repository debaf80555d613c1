"""model_store/model_fetch.py with the real huggingface_hub client against tests/standin_hub.py,
where it needs root: a full disk (a tmpfs), named in the plan and the fetch and ending a first
fetch in a last line, a verified model on a disk filled since; and a read-only mount namespace
alone keeping a hostile ETag inside the store. The runner, the stand-in hub and the other cases:
tests/network/test_model_fetch_client.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from pve_sglang.model_store.rules import FetchVerdict, preflight
import test_model_fetch_client as client_cases
from test_model_fetch_client import NAME, Runner, SHARD, fetched_from_a_hostile_mirror, gets, tree

REPO = Path(__file__).resolve().parents[2]
# The fixtures these tests share with the client's other cases (pytest finds a module's fixtures
# among its names; assigned, not imported: the linter takes a test's argument named as an import
# for its redefinition).
hub, script, shards = client_cases.hub, client_cases.script, client_cases.shards


@pytest.fixture
def disk(as_root, tmp_path):
    """``disk(size)``: a filesystem of SIZE (tmpfs, e.g. ``6m``), unmounted after."""
    mounted = []

    def make(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:  # lazily: a fetch a failed test left running does not keep it
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


@pytest.fixture
def small_disk(disk):
    """A 2 MiB filesystem: too small for the 16 MiB of shards, and for one of 4 MiB."""
    return disk("2m")


def fill(folder: Path) -> None:
    """FOLDER's filesystem full, to its last byte (a write that does not fit writes what does)."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 65536):
                pass
    finally:
        os.close(fd)
    assert os.statvfs(folder).f_bavail == 0


def test_a_full_disk_is_named_in_plan_and_fetch(hf_python, script, hub, shards, small_disk):
    small = Runner(hf_python, script, hub, small_disk / "standin-org--Standin-7B")
    commit = small.plan()["commit"]
    # fetch by itself checks the space before any byte (16 MiB of shards into 6 MiB)
    status, lines, _err = small.call("fetch", "--commit", commit)
    error = lines[-1]["error"]
    assert status == 1 and error["kind"] == "disk-full", error
    assert f"the filesystem of {small.root / commit} is full" in error["message"]
    assert not gets(hub)
    # a hub whose sizes are too small, in its listing and its answers alike: the disk fills
    # during the download
    lying = [name for name in shards if name.endswith(".safetensors")]
    hub.repos[NAME].declared = dict.fromkeys(lying, 1)
    hub.repos[NAME].answers = {name: {"X-Linked-Size": "1"} for name in lying}
    error = small.fetch(commit)["error"]
    assert error["kind"] == "disk-full" and "bytes free" in error["message"], error
    # plan on the full disk: it answers (its cache is only a cache), and the preflight refuses
    hub.repos[NAME].declared = hub.repos[NAME].answers = {}
    fill(small_disk)
    status, lines, err = small.call("plan")
    assert "Traceback" not in err, err
    plan = lines[-1]
    assert status == 0 and not plan["complete"] and plan["free_bytes"] < SHARD, plan
    verdict, text = preflight(plan, "host h", NAME, None, "the store")
    assert verdict is FetchVerdict.REFUSE and "free" in text and "larger filesystem" in text
    assert not [p for p in small.root.rglob("*.tmp*")]  # no empty temp file left


@pytest.mark.parametrize("background", [False, True])
def test_a_first_fetch_onto_a_full_disk_ends_in_a_last_line(hf_python, script, hub, small_disk, background):
    """Not a traceback: the foreground fetch's last line, or the background one's before it
    leaves (the deploy's watch would find no log line to read)."""
    small = Runner(hf_python, script, hub, small_disk / "standin-org--Standin-7B")
    commit = small.plan()["commit"]
    fill(small_disk)
    status, lines, err = small.call("fetch", "--commit", commit, *(["--background"] if background else []))
    assert "Traceback" not in err, err
    assert status == 1 and lines[-1]["error"]["kind"] == "disk-full", lines
    assert "is full" in lines[-1]["error"]["message"]


def test_a_verified_model_on_a_disk_filled_since_needs_nothing(hf_python, script, hub, shards, disk):
    """Neither the plan nor the fetch fails rewriting its cache, and the deploy's preflight
    takes the model as it is."""
    store = disk("24m")
    runner = Runner(hf_python, script, hub, store / "standin-org--Standin-7B")
    commit = runner.plan()["commit"]
    assert "done" in runner.fetch(commit)
    fill(store)
    shard = runner.root / commit / "model-00001-of-00004.safetensors"
    os.utime(shard)  # its stat moves: hashed again, and the cache would be written again
    status, lines, err = runner.call("plan")
    assert "Traceback" not in err and status == 0, err
    assert lines[-1]["complete"] and lines[-1]["missing_files"] == 0, lines
    assert preflight(lines[-1], "host h", NAME, None, "the store").verdict is FetchVerdict.READY
    status, lines, err = runner.call("fetch", "--commit", commit)
    assert "Traceback" not in err and status == 0, (lines, err)
    assert lines[-1]["done"]["fetched_files"] == 0


def test_watch_reads_the_last_line_of_a_fetch_that_ends_while_it_looks(tmp_path, monkeypatch,
                                                                        capsys):
    """The fetch writes its last line and ends (its lock released) just as the watch asks
    whether it runs: the watch still prints that line, so the operation does not take a fetch
    that finished for one that was killed (this raced under load in the suite)."""
    from pve_sglang.model_store import model_fetch

    log = tmp_path / "fetch.log"
    log.write_text('{"p": {"done": 1, "total": 2}}\n')

    def ends_now(lock_path: str) -> bool:
        with log.open("a") as handle:
            handle.write('{"done": {"commit": "c", "files": 1}}\n')
        return False

    monkeypatch.setattr(model_fetch, "running", ends_now)
    assert model_fetch.main(["watch", "--log", str(log), "--max-wait", "5"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed[-2] == {"done": {"commit": "c", "files": 1}}
    assert printed[-1] == {"offset": log.stat().st_size, "running": False}


# --- issue 47: a hostile ETag, with the mount namespace alone -------------------------------


def test_a_read_only_mount_namespace_alone_keeps_a_hostile_etag_inside_the_store(
        as_root, hf_python, script, hub, shards, tmp_path):
    """Where the kernel has no Landlock (stood in for by its ABI read as 0) and the answers are
    not checked: the fetch's own mount namespace, read-only but the store, holds."""
    runner = Runner(hf_python, script, hub, tmp_path / "store" / "standin-org--Standin-7B",
                    without="model_fetch.Answers.install = lambda self, hub: None; "
                            "confine.landlock_abi = lambda: 0")
    status, error, err, victim, before, _ = fetched_from_a_hostile_mirror(
        runner, hub, shards, "etag", tmp_path)
    assert status == 1 and error["kind"] == "denied" and "Read-only file system" in error["message"], (error, err)
    assert victim.read_text() == "not the model's\n"
    assert tree(tmp_path, runner.root) == before
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
