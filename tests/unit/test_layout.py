"""The package's layout keeps its promises: each package names its modules and the README's
layout every top-level one, its imports flow one way (no circle between its
folders and top-level modules), operations and facts get what they check as arguments (none reaches up for the deploy's settings inside a function), the remote scripts kept
beside their topic (``remote.ELSEWHERE``) run stand-alone as those of ``remote/`` do, and the
operations kept beside their topic are documented as those of ``operations/`` are."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import shutil
import subprocess
import sys

from pathlib import Path

import pytest

import pve_sglang
from pve_sglang import remote
from pve_sglang.runtime.pyinfra_private import operation_function
from test_operation_docs import doc_problems

PACKAGE = Path(pve_sglang.__file__).resolve().parent
#: Where pyinfra's side of the deploy is: every operation and fact module.
OPERATIONS_AND_FACTS = sorted({*PACKAGE.glob("operations/*.py"), *PACKAGE.glob("facts/*.py"),
                               *PACKAGE.glob("*/operations.py"), *PACKAGE.glob("*/facts.py")})
#: What an operation or a fact must not import inside a function: the deploy's checks, its
#: phases and its settings models (what it checks comes as arguments, as in pyinfra's own).
ABOVE = ("pve_sglang.preflight", "tasks", "pve_sglang.config.settings", "pve_sglang.config")


def imports_inside_functions(path: Path) -> list[tuple[int, list[str]]]:
    """Each import made inside a function of PATH: its line and the modules it may name
    (``from pve_sglang import preflight`` names ``pve_sglang`` or ``pve_sglang.preflight``)."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found += [(node.lineno, [alias.name]) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.append((node.lineno, [node.module, *(f"{node.module}.{alias.name}"
                                                           for alias in node.names)]))
    return found


def reaches_up(path: Path) -> list[str]:
    """The imports inside PATH's functions of what stands above an operation or a fact."""
    found = set()
    for line, names in imports_inside_functions(path):
        above = [name for name in names if any(name == top or name.startswith(f"{top}.")
                                               for top in ABOVE)]
        if above:
            found.add(f"line {line}: {above[0]}")
    return sorted(found)


def test_the_operations_and_facts_are_found():
    names = {str(path.relative_to(PACKAGE)) for path in OPERATIONS_AND_FACTS}
    assert {"operations/container_reads.py", "facts/one_read.py", "model_store/operations.py",
            "model_store/facts.py"} <= names and len(names) >= 30


@pytest.mark.parametrize("path", OPERATIONS_AND_FACTS, ids=lambda path: path.stem)
def test_no_operation_or_fact_imports_the_deploy_inside_a_function(path):
    assert reaches_up(path) == []


def test_an_import_of_the_settings_inside_a_function_is_found(tmp_path):
    module = tmp_path / "op.py"
    module.write_text("def expected():\n"
                      "    from pve_sglang.config.settings import ContainerSettings\n"
                      "    from pve_sglang import preflight\n    import tasks.container\n")
    assert reaches_up(module) == ["line 2: pve_sglang.config.settings",
                                  "line 3: pve_sglang.preflight", "line 4: tasks.container"]


#: The rooms of the import graph: each top-level module and package of pve_sglang, and tasks/.
ROOT = PACKAGE.parent


def room_of(module: str) -> str | None:
    """The room a dotted module name belongs to (``pve_sglang.stack.lock`` -> ``pve_sglang.stack``;
    ``tasks.container`` -> ``tasks``), or None outside the project."""
    parts = module.split(".")
    if parts[0] == "tasks":
        return "tasks"
    if parts[0] != "pve_sglang" or len(parts) == 1:
        return None
    return f"pve_sglang.{parts[1]}"


def import_graph() -> dict[str, set[str]]:
    """Room -> the rooms its files import (every import, those inside functions too)."""
    graph: dict[str, set[str]] = {}
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tasks").glob("*.py")]
    for path in files:
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        here = room_of(dotted)
        if here is None:
            continue
        targets = graph.setdefault(here, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                there = room_of(name)
                if there is not None and there != here:
                    targets.add(there)
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of GRAPH (its rooms in order, the first again at the end), or [] when none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(room: str) -> list[str]:
        state[room] = 1
        path.append(room)
        for there in sorted(graph.get(room, ())):
            if state.get(there) == 1:
                return path[path.index(there):] + [there]
            if there not in state:
                found = visit(there)
                if found:
                    return found
        state[room] = 2
        path.pop()
        return []

    for room in sorted(graph):
        if room not in state:
            found = visit(room)
            if found:
                return found
    return []


def test_the_imports_flow_one_way():
    graph = import_graph()
    assert {"pve_sglang.stack", "pve_sglang.model_store", "pve_sglang.operations", "tasks"} <= set(graph)
    assert circle(graph) == []


def test_a_circle_is_found():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


REMOTE_NAMES = {name for name in vars(remote).values() if isinstance(name, str) and name.endswith(".py")}


def plain_imports(path) -> set[str]:
    """The top-level module names PATH imports (``import x``, ``from x import y``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("script", sorted(remote.ELSEWHERE))
def test_a_script_kept_elsewhere_imports_only_its_companions_of_the_remote_scripts(script):
    imported = {f"{name}.py" for name in plain_imports(remote.source(script))} & REMOTE_NAMES
    assert imported == set(remote.COMPANIONS.get(script, ()))


@pytest.mark.parametrize("script", sorted(remote.ELSEWHERE))
def test_a_script_kept_elsewhere_runs_beside_its_companions_alone(script, tmp_path):
    for name in (script, *remote.companions(script)):
        shutil.copy(remote.source(name), tmp_path / name)
    # -E -s -S: no PYTHONPATH, no site-packages (where the editable install puts pve_sglang on
    # the path): only the standard library and what was uploaded.
    done = subprocess.run([sys.executable, "-E", "-s", "-S", str(tmp_path / script), "--help"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def operations_outside_the_operations_package() -> list:
    """Every ``@operation`` of a module kept with its topic (``model_store/operations.py``):
    ``test_operation_docs`` scans ``pve_sglang.operations`` only."""
    modules = [importlib.import_module(info.name)
               for info in pkgutil.walk_packages(pve_sglang.__path__, "pve_sglang.")
               if info.name.endswith(".operations") and info.name != "pve_sglang.operations"]
    return [pytest.param(value, id=f"{module.__name__}.{name}") for module in modules
            for name, value in vars(module).items()
            if getattr(operation_function(value), "__module__", None) == module.__name__]


def test_the_operations_kept_with_their_topic_are_found():
    assert len(operations_outside_the_operations_package()) >= 3


@pytest.mark.parametrize("op", operations_outside_the_operations_package())
def test_an_operation_kept_with_its_topic_documents_arguments_and_example(op):
    assert doc_problems(op) == []


def modules_of(package: Path) -> list[str]:
    """The modules and sub-packages of PACKAGE, by name."""
    return sorted(p.stem for p in package.iterdir()
                  if (p.suffix == ".py" and p.stem != "__init__")
                  or (p.is_dir() and (p / "__init__.py").exists()))


def unnamed_modules(package: Path) -> list[str]:
    """The modules of PACKAGE that its ``__init__`` docstring does not name (as ``name`` or
    ``name.py``)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return [name for name in modules_of(package)
            if f"``{name}``" not in doc and f"``{name}.py``" not in doc]


@pytest.mark.parametrize("package", sorted(p.parent.relative_to(PACKAGE.parent).as_posix()
                                           for p in PACKAGE.rglob("__init__.py")
                                           if "__pycache__" not in p.parts))
def test_each_package_names_its_modules(package):
    assert unnamed_modules(PACKAGE.parent / package) == []


def test_a_module_a_package_does_not_name_is_found(tmp_path):
    (tmp_path / "__init__.py").write_text('"""Holds ``named``."""\n')
    (tmp_path / "named.py").write_text("")
    (tmp_path / "forgotten.py").write_text("")
    assert unnamed_modules(tmp_path) == ["forgotten"]


def test_the_readme_layout_lists_every_top_level_module():
    readme = (PACKAGE.parent / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    listed = {line.split()[0].rstrip("/").removesuffix(".py") for line in layout.splitlines()
              if line.startswith("  ") and not line.startswith("   ")}
    assert set(modules_of(PACKAGE)) - listed == set()
