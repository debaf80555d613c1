"""The scripts of ``pve_sglang/remote/`` run stand-alone where they are uploaded: a module of
``remote/`` that one imports must be uploaded beside it (``remote.COMPANIONS``), and each script
must run from a folder that holds it and its companions alone, as the deploy leaves them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pve_sglang import remote

HERE = Path(remote.__file__).resolve().parent
SCRIPTS = sorted(p.name for p in HERE.glob("*.py") if p.name != "__init__.py")


def sibling_imports(script: str) -> set[str]:
    """The modules of ``remote/`` that SCRIPT imports by their plain name (as it runs uploaded)."""
    tree = ast.parse((HERE / script).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {f"{name}.py" for name in names if f"{name}.py" in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_module_a_script_imports_is_uploaded_beside_it(script):
    assert sibling_imports(script) == set(remote.COMPANIONS.get(script, ()))


def test_companions_of_companions_go_beside_a_script_before_what_imports_them():
    assert remote.companions(remote.GPU_TEXTFILE) == (remote.SERVER_METRICS, remote.GPU_SAMPLER)
    assert remote.companions(remote.SERVER_METRICS) == ()


@pytest.mark.parametrize("script", sorted(remote.COMPANIONS))
def test_a_script_runs_beside_its_companions_alone(script, tmp_path):
    remote.stage(script, tmp_path)
    # -E -s -S: no PYTHONPATH, no site-packages (where the editable install puts pve_sglang on
    # the path): only the standard library and what was uploaded.
    done = subprocess.run([sys.executable, "-E", "-s", "-S", str(tmp_path / script), "--help"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
