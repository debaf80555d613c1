"""The pure parts of model_store/model_fetch.py, in the fast tier: no huggingface_hub, no hub.
What the hub's answer may name on disk, what the check re-fetches, when the marker is written,
which half-fetched commits are the deploy's to remove, a moved branch kept at its pin."""

from __future__ import annotations

import errno
import json

import pytest

from pve_sglang.model_store import model_fetch as mf
from pve_sglang.model_store import rules

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


# --- the fetcher's pure parts at their edges (issue 47) ------------------------------------


@pytest.mark.parametrize(("name", "problem"), [
    ("a\x1fb", "holds a control character"),  # the last C0 control
    ("a b", None),  # the first character after them
    ("a~b", None),  # the last before DEL
    ("a\x7fb", "holds a control character"),  # DEL
    ("a\x9fb", "holds a control character"),  # the last C1 control
    ("a\xa0b", None),  # the first after them
    ("a\ud800b", "is not text (a lone surrogate)"),
    ("tok\\vocab.json", "holds a backslash (a folder on Windows: huggingface_hub refuses it)"),
    ("C:config.json", "has a part that is a Windows drive (huggingface_hub refuses it)"),
    ("sub/c:x", "has a part that is a Windows drive (huggingface_hub refuses it)"),
    ("ab:c", None),
    ("x" * mf.NAME_PART_MAX, None),
    ("x" * (mf.NAME_PART_MAX + 1), f"has a part of {mf.NAME_PART_MAX + 1} bytes"),
    ("d/" + "é" * (mf.NAME_PART_MAX // 2), None),  # two bytes each: 246 in all
    ("d/" + "é" * (mf.NAME_PART_MAX // 2) + "x", f"has a part of {mf.NAME_PART_MAX + 1} bytes"),
    (".cache", "is where the fetcher keeps its own state"),
    (".cachex/a", None),
])
def test_name_problem_at_its_edges(name, problem):
    found = mf.name_problem(name)
    assert (found is None) if problem is None else found.startswith(problem), found


@pytest.mark.parametrize(("size", "ok"), [
    (0, True),  # an empty file
    (-1, False), (1, True), (True, False), (False, False), (1.0, False), ("3", False), (None, True),
])
def test_entry_sizes_at_their_edges(size, ok):
    entry = {"name": "c.json", "size": size, "sha256": None, "blob": "b" * 40}
    assert (mf.entry_problem(entry) is None) is ok


@pytest.mark.parametrize(("names", "problem"), [
    (["a", "b/a", "b/c"], None),
    (["a", "a"], "file 'a' twice"),
    (["a", "a/b"], "both 'a' and 'a/b'"),
    (["x/y/z", "x/y"], "both 'x/y' and 'x/y/z'"),
    (["ab", "a/b"], None),
])
def test_listing_problem(names, problem):
    found = mf.listing_problem(names)
    assert (found is None) if problem is None else found.startswith(problem)


def entry(name="m.safetensors", size=3, sha256="c" * 64, blob=None) -> dict:
    return {"name": name, "size": size, "sha256": sha256, "blob": blob}


@pytest.mark.parametrize(("item", "lacks"), [
    (entry(), None),
    (entry(sha256=None, blob="b" * 40), None),
    (entry(size=0), None),
    (entry(size=None), "no size"),
    (entry(sha256=None), "no sha256 or git blob id"),
    (entry(size=None, sha256=None), "no size and no sha256 or git blob id"),
])
def test_unverifiable(item, lacks):
    assert mf.unverifiable(item) == lacks


@pytest.mark.parametrize(("files", "problem"), [
    ([], "no files"),
    ([entry("config.json", blob="b" * 40, sha256=None)], "1 files and no weights"),
    ([entry("model.safetensors.index.json")], "1 files and no weights"),
    ([entry(size=0)], "1 files and no weights"),  # an empty shard is no weights
    ([entry(size=1)], None),
    ([entry(size=None)], None),  # a mirror without sizes: checked by unverifiable
    ([entry("pytorch_model.bin")], None),
    ([entry("model.gguf")], None),
])
def test_weights_problem(files, problem):
    found = mf.weights_problem(files)
    assert (found is None) if problem is None else found.startswith(problem)


SHA = "c" * 64


@pytest.mark.parametrize(("listed", "answer", "problem"), [
    (entry(), (COMMIT, SHA, 3), None),
    (entry(), (COMMIT, SHA, None), None),  # no size in the answer: the hash checks it after
    (entry(), ("b" * 40, SHA, 3), "commit 'bbbb"),
    (entry(), (None, SHA, 3), "commit None"),
    (entry(), (COMMIT, "x/../../OUTSIDE", 3), "ETag 'x/../../OUTSIDE'"),
    (entry(), (COMMIT, SHA[:-1] + "d", 3), "ETag 'cccc"),
    (entry(), (COMMIT, SHA, 2), "size 2"),
    (entry(), (COMMIT, SHA, 4), "size 4"),
    (entry(sha256=None, blob="b" * 40), (COMMIT, "b" * 40, 3), None),
    (entry(sha256=None, blob="b" * 40), (COMMIT, SHA, 3), "ETag 'cccc"),
    (entry(sha256=None, size=None), (COMMIT, "w" * 128, 9), None),  # unhashed: a word
    (entry(sha256=None, size=None), (COMMIT, "w" * 129, 9), "ETag 'www"),
    (entry(sha256=None, size=None), (COMMIT, "x/../y", 9), "ETag 'x/../y'"),
    (entry(sha256=None, size=None), (COMMIT, "a.b", 9), "ETag 'a.b'"),
    (entry(sha256=None, size=None), (COMMIT, None, 9), "ETag None"),
])
def test_answer_problem(listed, answer, problem):
    found = mf.answer_problem(listed, COMMIT, *answer)
    assert (found is None) if problem is None else found.startswith(problem), found


@pytest.mark.parametrize(("sizes", "resumed", "need"), [
    ([10, 20], 0, 30),
    ([10, 20], 7, 23),  # the bytes of a cut download are not fetched again
    ([10, 20], 30, 0),
    ([10, 20], 31, 0),  # never below nothing
    ([10, None], 0, 10),  # a size the hub did not say counts none
    ([], 0, 0),
])
def test_bytes_to_fetch(sizes, resumed, need):
    missing = [entry(f"m{i}.safetensors", size=size) for i, size in enumerate(sizes)]
    assert mf.bytes_to_fetch(missing, resumed) == need


@pytest.mark.parametrize(("need", "free", "ok"), [(100, 100, True), (101, 100, False), (0, 0, True)])
def test_fits_at_its_edge(need, free, ok):
    assert mf.fits(need, free) is ok


def wrapped(error: BaseException) -> BaseException:
    """ERROR as a client raises it: from within its own."""
    try:
        try:
            raise error
        except BaseException as inner:
            raise RuntimeError("the client's own") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(("error", "kind"), [
    (OSError(errno.ENOSPC, "No space left on device"), "disk-full"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk-full"),
    (OSError(errno.ENAMETOOLONG, "File name too long", "/m/x"), "name-too-long"),
    (FileExistsError(errno.EEXIST, "File exists", "/m/tokenizer"), "in-the-way"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/m/tokenizer/v"), "in-the-way"),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "/m/config.json"), "in-the-way"),
    (PermissionError(errno.EACCES, "Permission denied", "/outside"), "denied"),
    (PermissionError(errno.EPERM, "Operation not permitted", "/outside"), "denied"),
    (OSError(errno.EROFS, "Read-only file system", "/outside"), "denied"),
    (ValueError("Invalid filename 'a\\\\..\\\\b': cannot contain a '..' path segment."), "invalid-name"),
    (mf.HubError("untrusted", "the hub answered ..."), "untrusted"),
    (ValueError("some other value"), None),
    (ConnectionError("reset by peer"), None),  # the network's: hub_error's
    (OSError(errno.ECONNRESET, "Connection reset by peer"), None),
    (TimeoutError("timed out"), None),
])
def test_local_failure(error, kind):
    for raised in (error, wrapped(error)):
        found = mf.local_failure(raised, "/store/o--m")
        assert (found and found[0]) == kind, found
        if kind in ("name-too-long", "in-the-way", "denied"):
            assert repr(error.filename) in found[1] and "resumes" not in found[1]


@pytest.mark.parametrize(("kind", "resumes"), [
    ("network", True), ("download", True), ("disk-full", True),
    ("untrusted", False), ("unverifiable", False), ("no-weights", False), ("name-too-long", False),
    ("in-the-way", False), ("denied", False), ("invalid-name", False), ("unconfined", False),
    ("verify", False), ("interrupted", False),
])
def test_a_fetch_error_says_the_next_run_resumes_only_where_it_does(kind, resumes):
    text = rules.fetch_failure("host h", "o/m", COMMIT, {"kind": kind, "message": "what happened"})
    assert text.startswith(f"host h: model o/m at commit {COMMIT}: what happened")
    assert text.endswith("; the next run resumes") is resumes


def test_a_relative_root_is_made_absolute_and_its_existing_folder_found(tmp_path, monkeypatch):
    """plan --root rel/missing looped for ever looking for an existing folder above ''."""
    monkeypatch.chdir(tmp_path)
    layout = mf.Layout("rel/missing", flat=False)
    assert layout.root == str(tmp_path / "rel" / "missing")
    assert mf.existing_folder(layout.files(COMMIT)) == str(tmp_path)
    assert mf.existing_folder("/no/such/folder") == "/"


def test_watch_reads_a_log_cut_for_its_last_line_from_its_start(tmp_path, capsys):
    """On a full disk the fetch cuts its log to write its last line (``Log.last``): a watch
    that had read past the new end reads it from the start, and learns how the fetch ended."""
    log = tmp_path / "fetch.log"
    log.write_text('{"error": {"kind": "disk-full", "message": "full"}}\n')
    assert mf.main(["watch", "--log", str(log), "--offset", "4096", "--max-wait", "5"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed[0] == {"error": {"kind": "disk-full", "message": "full"}}
    assert printed[-1] == {"offset": log.stat().st_size, "running": False}
