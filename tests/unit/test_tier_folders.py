"""A test file sits in the folder of its tier (tests/tiers.py), and the run stops where one does not."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiers import FOLDERS, Collected, folder_for, misplaced

TESTS = Path(__file__).resolve().parents[1]

LXC, ROOT, NET, MACHINE = "lxc", "root", "network", "machine"


@pytest.mark.parametrize("markers, folder", [
    ((), "unit"),
    (("slow",), "unit"),  # a marker of no tier decides nothing
    ((NET,), "network"),
    ((ROOT,), "root"),
    ((ROOT, NET), "root"),
    ((MACHINE, ROOT), "root"),
    ((LXC, ROOT), "lxc"),
    ((LXC, ROOT, NET, MACHINE), "lxc"),
])
def test_a_tests_markers_give_the_lightest_folder_that_admits_them(markers, folder):
    assert folder_for(markers) == folder


def test_the_folders_go_from_lightest_to_heaviest_each_admitting_the_one_before():
    admitted = list(FOLDERS.values())
    assert all(lighter < heavier for lighter, heavier in zip(admitted, admitted[1:]))


@pytest.mark.parametrize("folder, markers, belongs", [
    ("unit", (NET,), "network"),  # the edge: one marker over
    ("unit", (LXC, ROOT), "lxc"),
    ("network", (ROOT,), "root"),
    ("network", (ROOT, NET), "root"),
    ("root", (LXC, ROOT), "lxc"),
])
def test_a_test_that_needs_more_than_its_folder_names_the_file_and_where_it_belongs(folder, markers, belongs):
    tests = [Collected(f"{folder}/test_x.py", "test_light", frozenset()),
             Collected(f"{folder}/test_x.py", "test_heavy", frozenset(markers), ("lxc_host",))]
    for whole in (True, False):  # chosen tests too: the test itself is there
        [problem] = misplaced(tests, whole)
        assert problem.startswith(f"tests/{folder}/test_x.py: test_heavy gets the markers "
                                  f"{', '.join(sorted(markers))} (from lxc_host)")
        assert f"belongs in tests/{belongs}/" in problem


@pytest.mark.parametrize("folder, markers", [
    ("unit", ()), ("network", (NET,)), ("root", (ROOT,)), ("root", (ROOT, NET, MACHINE)),
    ("lxc", (LXC, ROOT)), ("lxc", (LXC, ROOT, NET, MACHINE)),
])
def test_a_file_whose_heaviest_test_needs_its_folder_is_in_place(folder, markers):
    tests = [Collected(f"{folder}/test_x.py", "test_light", frozenset()),
             Collected(f"{folder}/test_x.py", "test_heavy", frozenset(markers))]
    assert misplaced(tests, whole=True) == []


def test_a_file_heavier_than_its_tests_is_named_only_when_all_its_tests_were_collected():
    tests = [Collected("lxc/test_x.py", "test_a", frozenset({NET})),
             Collected("lxc/test_x.py", "test_b", frozenset())]
    [problem] = misplaced(tests, whole=True)
    assert problem.startswith("tests/lxc/test_x.py: none of its tests needs what tests/lxc/ is for")
    assert "belongs in tests/network/" in problem
    assert misplaced(tests, whole=False) == []  # test_x.py::test_b alone says nothing of test_a


def test_a_test_file_outside_the_tier_folders_is_named():
    [problem] = misplaced([Collected("test_x.py", "test_a", frozenset({ROOT}))], whole=False)
    assert problem.startswith("tests/test_x.py: a test file sits in the folder of its tier")
    assert problem.endswith("belongs in tests/root/")


def test_the_run_stops_on_a_fast_folder_file_whose_test_boots_containers(tmp_path):
    """The real conftest on a copy of the tests' root with one misplaced and one placed file:
    the fast tier's selection stops at collection, naming the one file and where it belongs."""
    tests = tmp_path / "tests"
    for folder in ("unit", "lxc"):
        (tests / folder).mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    (tests / "unit" / "test_boots.py").write_text("def test_boots(lxc_container):\n    pass\n")
    (tests / "lxc" / "test_placed.py").write_text("def test_boots(lxc_container):\n    pass\n"
                                                   "def test_fast():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--basetemp", str(tmp_path / "run"), "--rootdir", str(tmp_path), "-c", os.devnull,
         "-m", "not lxc and not root and not network", str(tests)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode != 0, done.stdout
    assert ("tests/unit/test_boots.py: test_boots gets the markers lxc, root (from lxc_host, as_root), "
            "which tests/unit/ does not admit") in done.stdout
    assert "belongs in tests/lxc/" in done.stdout
    assert "test_placed.py" not in done.stdout.split("short test summary")[0].split("ERRORS")[-1]
    assert "Interrupted: 1 error during collection" in done.stdout
