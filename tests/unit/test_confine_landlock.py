"""remote/confine.py: a process confined to a folder writes there and nowhere else, whatever
it tries (create, write, truncate, remove, rename or link out, a path through '..'), with the
kernel's Landlock (any user may confine itself); the way chosen from the kernel's ABI, and a
process that already runs threads left unconfined. Each case runs in a process of its own, as
the fetcher does. Where Landlock is missing, the read-only mount namespace (root):
tests/root/test_confine.py.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from pve_sglang.remote import confine

REMOTE = os.path.dirname(confine.__file__)

#: Tried by the confined process: each write it may not make, then what it may.
TRIES = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import confine
inside, outside, abi = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
how = confine.confine([inside], abi=abi)
results = {"how": how}

def attempt(name, action):
    try:
        action()
        results[name] = "done"
    except OSError as error:
        results[name] = error.errno

attempt("create outside", lambda: open(os.path.join(outside, "new"), "w").close())
attempt("append outside", lambda: open(os.path.join(outside, "victim"), "a").close())
attempt("truncate outside", lambda: os.truncate(os.path.join(outside, "victim"), 0))
attempt("remove outside", lambda: os.unlink(os.path.join(outside, "victim")))
attempt("mkdir outside", lambda: os.mkdir(os.path.join(outside, "dir")))
attempt("symlink outside", lambda: os.symlink("/etc/passwd", os.path.join(outside, "link")))
attempt("through dotdot", lambda: open(os.path.join(inside, "..", os.path.basename(outside), "new2"), "w").close())
attempt("rename out", lambda: os.rename(os.path.join(inside, "mine"), os.path.join(outside, "mine")))
attempt("link out", lambda: os.link(os.path.join(inside, "mine"), os.path.join(outside, "hard")))
attempt("rename in", lambda: os.rename(os.path.join(outside, "victim"), os.path.join(inside, "taken")))
attempt("create inside", lambda: open(os.path.join(inside, "new"), "w").close())
attempt("mkdir inside", lambda: os.makedirs(os.path.join(inside, "a", "b")))
attempt("rename across folders inside", lambda: os.rename(os.path.join(inside, "mine"), os.path.join(inside, "a", "b", "mine")))
attempt("remove inside", lambda: os.unlink(os.path.join(inside, "a", "b", "mine")))
attempt("write /dev/null", lambda: open(os.devnull, "w").write("x"))
print(json.dumps(results))
"""

REFUSED = ["create outside", "append outside", "truncate outside", "remove outside",
           "mkdir outside", "symlink outside", "through dotdot", "rename out", "link out",
           "rename in"]
ALLOWED = ["create inside", "mkdir inside", "rename across folders inside", "remove inside",
           "write /dev/null"]


def confined_tries(tmp_path, abi) -> dict:
    inside, outside = tmp_path / "store", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("kept")
    (inside / "mine").write_text("mine")
    done = subprocess.run([sys.executable, "-c", TRIES, REMOTE, str(inside), str(outside),
                           json.dumps(abi)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert (outside / "victim").read_text() == "kept"
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    return results


@pytest.mark.parametrize(("abi", "way"), [(0, "namespace"), (1, "namespace"), (2, "landlock"), (7, "landlock")])
def test_landlock_from_its_abi_2_else_a_namespace(abi, way):
    """ABI 1 refuses a rename from one folder to another: the client would copy each shard."""
    assert confine.way(abi) == way


@pytest.mark.parametrize(("abi", "truncate"), [(2, False), (3, True)])
def test_truncation_is_taken_where_the_kernel_knows_it(abi, truncate):
    assert bool(confine.handled(abi) & confine.TRUNCATE) is truncate
    assert confine.handled(abi) & confine.REFER and confine.handled(abi) & confine.WRITE_FILE


def test_landlock_keeps_every_write_inside_the_folder(tmp_path):
    if confine.way(confine.landlock_abi()) != "landlock":
        pytest.skip(f"this kernel's Landlock ABI is {confine.landlock_abi()} (2 needed)")
    results = confined_tries(tmp_path, None)
    assert results["how"] == "landlock"
    assert {name: results[name] for name in REFUSED} == dict.fromkeys(REFUSED, errno.EACCES)
    assert {name: results[name] for name in ALLOWED} == {name: "done" for name in ALLOWED}


def test_a_process_with_threads_is_not_confined(tmp_path):
    """Landlock and unshare hold for the calling thread and what it starts later only."""
    script = ("import sys, threading, time; sys.path.insert(0, sys.argv[1]); import confine\n"
              "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
              "try:\n    confine.confine([sys.argv[2]])\nexcept confine.Unconfined as error:\n"
              "    print('unconfined:', error)\n")
    done = subprocess.run([sys.executable, "-c", script, REMOTE, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.startswith("unconfined: other threads already run"), done.stdout + done.stderr
