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
