"""The package's layout keeps its promises: the remote scripts kept beside their topic
(``remote.ELSEWHERE``) run stand-alone as those of ``remote/`` do, and the operations kept
beside their topic are documented as those of ``operations/`` are."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import shutil
import subprocess
import sys

import pytest

import pve_sglang
from pve_sglang import remote
from pve_sglang.runtime.pyinfra_private import operation_function
from test_operation_docs import doc_problems

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
    for name in (script, *remote.COMPANIONS.get(script, ())):
        shutil.copy(remote.source(name), tmp_path / name)
    # -E -s: no PYTHONPATH, no user site: pve_sglang cannot be imported, only what was uploaded.
    done = subprocess.run([sys.executable, "-E", "-s", str(tmp_path / script), "--help"],
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
