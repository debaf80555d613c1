"""Which folder of tests/ a test file belongs in: the tier of the most any of its tests needs.

A test's markers come from the fixtures it uses (tests/conftest.py ``TIER_OF_FIXTURE``); the
folder says, from the path alone, the most a file's tests need: ``unit`` nothing (the fast
tier), ``network`` the package index, ``root`` root but no container (chroots, lxc-net),
``lxc`` containers. Its lighter tests run in their own tier all the same: ``make test-fast``
selects by markers, not by folder.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

#: Folder -> the markers its tests may get, lightest folder first: a file belongs in the first
#: that admits every marker of every test in it.
FOLDERS: dict[str, frozenset[str]] = {
    "unit": frozenset(),
    "network": frozenset({"network"}),
    "root": frozenset({"root", "network", "machine"}),
    "lxc": frozenset({"lxc", "root", "network", "machine"}),
}
#: The markers that decide a folder (pyproject.toml registers them).
TIER_MARKERS = frozenset().union(*FOLDERS.values())


class Collected(NamedTuple):
    """One collected test: its file relative to tests/ (``unit/test_x.py``), its name, its
    tier markers and the fixtures that gave them."""

    file: str
    name: str
    markers: frozenset[str]
    fixtures: tuple[str, ...] = ()


def folder_for(markers: Iterable[str]) -> str:
    """The lightest folder that admits MARKERS (tier markers only; others are ignored)."""
    wanted = frozenset(markers) & TIER_MARKERS
    return next(folder for folder, admitted in FOLDERS.items() if wanted <= admitted)


def misplaced(tests: Iterable[Collected], whole: bool) -> list[str]:
    """One message per test file not in the folder its tests' markers give: a test that needs
    more than its folder admits always; a file none of whose tests needs its folder only where
    WHOLE (every test of every file was collected: a run of chosen tests says nothing of the
    others)."""
    by_file: dict[str, list[Collected]] = {}
    for test in tests:
        by_file.setdefault(test.file, []).append(test)
    problems = []
    for file, collected in sorted(by_file.items()):
        folder, _, _ = file.rpartition("/")
        most = frozenset().union(*(test.markers for test in collected))
        belongs = folder_for(most)
        if folder not in FOLDERS:
            problems.append(f"tests/{file}: a test file sits in the folder of its tier "
                            f"({', '.join(f'tests/{f}/' for f in FOLDERS)}): this one belongs in "
                            f"tests/{belongs}/")
            continue
        over = [test for test in collected if not test.markers <= FOLDERS[folder]]
        if over:
            test = over[0]
            given = f" (from {', '.join(test.fixtures)})" if test.fixtures else ""
            problems.append(
                f"tests/{file}: {test.name} gets the markers {', '.join(sorted(test.markers))}"
                f"{given}, which tests/{folder}/ does not admit ({len(over)} test(s) so): the file "
                f"belongs in tests/{belongs}/ (git mv it there; CONTRIBUTING.md, Tiers)")
        elif whole and belongs != folder:
            problems.append(
                f"tests/{file}: none of its tests needs what tests/{folder}/ is for (the most they "
                f"get: {', '.join(sorted(most)) or 'no marker'}): the file belongs in "
                f"tests/{belongs}/ (git mv it there; CONTRIBUTING.md, Tiers)")
    return problems
