"""
Every third-party distribution that the deploy's code imports is declared in pyproject.toml,
not merely brought along by pyinfra: pve_sglang/, tasks/, deploy.py and inventory.py against
``[project] dependencies`` (devtools/ may also use the ``test`` and ``bench`` extras).

An import inside ``try: ... except ImportError`` is optional (``typing_extensions`` where the
standard library lacks ``override``; torch in the scripts that run in the container's venv).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["pve_sglang", "tasks", "deploy.py", "inventory.py"]
#: Folders whose modules serve the tests and benchmarks: the extras count for them too.
TEST_SUPPORT = ["pve_sglang/testing"]
EXTRAS = ("test", "bench")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def local_names(repo: Path) -> set[str]:
    """Top-level modules and packages of the checkout itself."""
    return {p.stem for p in repo.glob("*.py")} | {p.parent.name for p in repo.glob("*/__init__.py")}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def required_imports(source: str) -> set[str]:
    """Top-level names of the absolute imports in SOURCE, except those guarded by
    ``except ImportError``."""
    tree = ast.parse(source)
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                optional |= {id(n) for n in ast.walk(stmt)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def undeclared(source: str, declared: set[str], local: set[str],
               distributions: dict[str, list[str]]) -> list[str]:
    """The imports of SOURCE whose distribution is not in DECLARED (normalised names)."""
    problems = []
    for name in sorted(required_imports(source)):
        if name in sys.stdlib_module_names or name in local:
            continue
        dists = distributions.get(name)
        if not dists:
            problems.append(f"{name} (no installed distribution provides it)")
        elif not {normalise(d) for d in dists} & declared:
            problems.append(f"{name} (from {', '.join(sorted(set(dists)))})")
    return problems


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def requirements(project: dict, extras=()) -> list[Requirement]:
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project.get("optional-dependencies", {}).get(extra, [])
    return [Requirement(line) for line in lines]


def source_files() -> list[Path]:
    files = []
    for entry in SOURCES:
        path = REPO / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_every_imported_distribution_is_declared():
    project = pyproject()["project"]
    core = {normalise(r.name) for r in requirements(project)}
    with_extras = {normalise(r.name) for r in requirements(project, EXTRAS)}
    distributions = importlib.metadata.packages_distributions()
    local = local_names(REPO)
    problems = []
    files = source_files()
    assert len(files) > 20, files
    for path in files:
        relative = path.relative_to(REPO).as_posix()
        support = any(relative.startswith(folder + "/") for folder in TEST_SUPPORT)
        for problem in undeclared(path.read_text(), with_extras if support else core, local,
                                  distributions):
            problems.append(f"{relative}: {problem}")
    assert not problems, "imported but not declared in pyproject.toml:\n" + "\n".join(problems)


def test_installed_versions_meet_the_declared_bounds():
    for requirement in requirements(pyproject()["project"]):
        version = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(version, prereleases=True), (requirement, version)


def test_the_check_sees_direct_and_ignores_guarded_imports():
    distributions = {"pydantic": ["pydantic"], "yaml": ["PyYAML"], "torch": ["torch"]}
    source = (
        "import os\nimport yaml.constructor\nfrom pydantic import BaseModel\nfrom . import x\n"
        "import tasks\ntry:\n    import torch\nexcept (ImportError, OSError):\n    torch = None\n"
        "import nowhere_to_be_found\n"
    )
    assert undeclared(source, {"pyyaml"}, {"tasks"}, distributions) == [
        "nowhere_to_be_found (no installed distribution provides it)",
        "pydantic (from pydantic)",
    ]
    assert undeclared("import yaml\n", {"pyyaml"}, set(), distributions) == []
