"""The pure parts of model_store/model_fetch.py, in the fast tier: no huggingface_hub, no hub.
What the hub's answer may name on disk, what the check re-fetches, when the marker is written,
which half-fetched commits are the deploy's to remove, a moved branch kept at its pin."""

from __future__ import annotations

import pytest

from pve_sglang.model_store import model_fetch as mf

COMMIT = "a" * 40


@pytest.mark.parametrize(("name", "problem"), [
    ("model-00001-of-00004.safetensors", None),
    ("tokenizer/vocab.json", None),
    (".gitattributes", None),
    ("../../victim.txt", "has an empty, '.' or '..' part"),
    ("a/../../b", "has an empty, '.' or '..' part"),
    ("a//b", "has an empty, '.' or '..' part"),
    ("./config.json", "has an empty, '.' or '..' part"),
    ("/etc/passwd", "is absolute"),
    ("", "is empty"),
    (None, "is empty"),
    ("a\nb", "holds a control character"),
    (".cache/pve-sglang/verified.json", "is where the fetcher keeps its own state"),
    (mf.MARKER, "is where the fetcher keeps its own state"),
])
def test_name_problem(name, problem):
    assert mf.name_problem(name) == problem


@pytest.mark.parametrize(("commit", "ok"), [
    (COMMIT, True), ("0123456789abcdef0123456789abcdef01234567", True), ("A" * 40, False),
    ("a" * 39, False), ("../../victim", False), ("a" * 40 + "\n", False), (None, False), (7, False),
])
def test_commit_problem(commit, ok):
    assert (mf.commit_problem(commit) is None) is ok


@pytest.mark.parametrize(("entry", "problem"), [
    ({"name": "c.json", "size": 3, "sha256": None, "blob": "b" * 40}, None),
    ({"name": "m.safetensors", "size": 3, "sha256": "c" * 64, "blob": "b" * 40}, None),
    ({"name": "c.json", "size": -1, "sha256": None, "blob": "b" * 40}, "file 'c.json' has size -1"),
    ({"name": "c.json", "size": 3, "sha256": "../x", "blob": None}, "file 'c.json' has sha256 '../x'"),
    ({"name": "../c", "size": 3, "sha256": None, "blob": None}, "file name '../c' has an empty"),
])
def test_entry_problem(entry, problem):
    found = mf.entry_problem(entry)
    assert (found is None) if problem is None else found.startswith(problem)


@pytest.mark.parametrize(("repo", "ok"), [
    ("Qwen/Qwen3-30B-A3B", True), ("gpt2", True), ("org/name.v2_x", True),
    ("org/bad name", False), ("a/b/c", False), ("org/--x", False), ("org/x..y", False),
    ("org/x.git", False), ("-org/x", False), ("org/" + "x" * 97, False), ("", False),
])
def test_repo_problem(repo, ok):
    problem = mf.repo_problem(repo)
    assert (problem is None) is ok
    if problem:
        assert repr(repo) in problem and "ORG/NAME" in problem


def test_forget_file_never_removes_outside_the_folder(tmp_path):
    folder, outside = tmp_path / "m", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "f").write_text("kept")
    (folder / "sub").symlink_to(outside)  # a link in the way is not followed out
    for name in ("../outside/f", "sub/f"):
        with pytest.raises(mf.HubError):
            mf.forget_file(str(folder), name)
    assert (outside / "f").read_text() == "kept"


def model(folder, **texts: bytes) -> list[dict]:
    """FOLDER holding TEXTS (name -> bytes), and the hub's entries of them (LFS: sha256)."""
    import hashlib

    files = []
    for name, data in texts.items():
        (folder / name).write_bytes(data)
        files.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "blob": None})
    return files


def test_check_hashes_again_a_same_size_edit_with_its_mtime_put_back(tmp_path):
    files = model(tmp_path, **{"a.safetensors": b"x" * 1000, "b.safetensors": b"y" * 1000})
    records: dict = {}
    assert mf.check(str(tmp_path), files, records) == []
    shard = tmp_path / "a.safetensors"
    before = shard.stat()
    shard.write_bytes(b"z" * 1000)  # same size
    import os

    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # touch -r
    assert [e["name"] for e in mf.check(str(tmp_path), files, records)] == ["a.safetensors"]
    assert "a.safetensors" not in records


@pytest.mark.parametrize(("damage", "missing"), [
    (None, []), ("remove", ["b.safetensors"]), ("short", ["b.safetensors"]), ("flip", ["b.safetensors"]),
])
def test_check_names_what_is_fetched_again_and_removes_nothing(tmp_path, damage, missing):
    files = model(tmp_path, **{"a.safetensors": b"x" * 100, "b.safetensors": b"y" * 100})
    shard = tmp_path / "b.safetensors"
    if damage == "remove":
        shard.unlink()
    elif damage == "short":
        shard.write_bytes(b"y" * 50)
    elif damage == "flip":
        shard.write_bytes(b"y" * 99 + b"Y")
    assert [e["name"] for e in mf.check(str(tmp_path), files, {})] == missing
    assert shard.exists() == (damage != "remove")


def test_invalidate_removes_the_marker_before_any_file(tmp_path):
    folder, outside = tmp_path / "m", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "f").write_text("x")
    (folder / "sub").symlink_to(outside)  # a file that cannot be removed: the step fails
    marker = folder / mf.MARKER
    marker.write_text("{}")
    with pytest.raises(mf.HubError):
        mf.invalidate(str(folder), str(marker), [{"name": "sub/f"}])
    assert not marker.exists()  # a kill or an error there leaves no marker over a changed file


FILES = [{"name": "a", "size": 1, "sha256": None, "blob": None},
         {"name": "b", "size": 2, "sha256": None, "blob": None}]


@pytest.mark.parametrize(("marker", "current"), [
    (mf.marker_of("o/m", COMMIT, FILES), True),
    ({**mf.marker_of("o/m", COMMIT, FILES), "verified_at": 5}, True),
    (None, False),
    (mf.marker_of("o/m", "b" * 40, FILES), False),  # flat: an older commit's marker
    (mf.marker_of("o/m", "b" * 40, FILES + [{"name": "c", "size": 3}]), False),  # ... that had one file more
    (mf.marker_of("o/m", COMMIT, FILES[:1]), False),
    ({k: v for k, v in mf.marker_of("o/m", COMMIT, FILES).items() if k != "sizes"}, False),  # before sizes
    (mf.marker_of("o/other", COMMIT, FILES), False),
])
def test_marker_current(marker, current):
    assert mf.marker_current(marker, "o/m", COMMIT, FILES) is current


B, C, D = "b" * 40, "c" * 40, "d" * 40


@pytest.mark.parametrize(("folders", "pinned", "gone"), [
    ({COMMIT: False, B: False}, set(), [B]),  # a changed pin's half-fetched commit
    ({COMMIT: False, B: True}, set(), []),  # a complete commit is kept (the deploy removes none)
    ({COMMIT: False, B: False}, {B}, []),  # another revision pins it: resumed when it comes back
    ({COMMIT: False}, set(), []),  # the one being fetched
    ({COMMIT: True, B: False, C: False, D: True}, {C}, [B]),
])
def test_leftovers(folders, pinned, gone):
    assert mf.leftovers(folders, pinned, COMMIT) == gone


def test_a_fetch_removes_a_half_fetched_commit_no_pin_names_and_keeps_the_rest(tmp_path):
    layout = mf.Layout(str(tmp_path), flat=False)
    for commit, complete in ((B, False), (C, True), (D, False)):
        (tmp_path / commit).mkdir()
        (tmp_path / commit / "x").write_text("part")
        if complete:
            (tmp_path / commit / mf.MARKER).write_text(f'{{"commit": "{commit}"}}')
    mf.record(layout, "o/m", "main", D)
    mf.remove_leftovers(layout, COMMIT, None)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [C, D]


def test_a_branch_is_pinned_once_and_a_move_reported_not_followed(tmp_path):
    layout = mf.Layout(str(tmp_path), flat=False)
    assert mf.pinned(layout, "o/m", None, B) == (B, None)  # not pinned yet: the hub's
    mf.record(layout, "o/m", None, B)  # the fetch's first step
    assert mf.pinned(layout, "o/m", None, C) == (B, B)  # moved on the hub: kept
    assert mf.pinned(layout, "o/m", C, B) == (C, None)  # a commit is itself
    assert mf.pins(layout) == {B}


@pytest.mark.parametrize(("error", "full"), [
    (OSError(28, "No space left on device"), True),
    (OSError(122, "Disk quota exceeded"), True),
    (OSError(13, "Permission denied"), False),
    (ConnectionError("reset"), False),
])
def test_disk_full_follows_the_chain(error, full):
    assert mf.disk_full(error) is full
    try:
        try:
            raise error
        except Exception as inner:
            raise RuntimeError("wrapped by the client") from inner
    except RuntimeError as outer:
        assert mf.disk_full(outer) is full
