"""pyinfra's private names are used only through ``runtime/pyinfra_private.py``, for one version.

A private name of pyinfra (``_get_fact``, ``OperationMeta._hash``, ``StringCommand``'s
``_separator``, a module global replaced inside pyinfra) may change in any release. The source
is scanned for every such use outside that module, against the names pyinfra itself defines;
and a pyinfra of another version, as its installed metadata says, is refused on import with
an error naming both versions, not used silently.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyinfra.api.arguments import all_global_arguments

from pve_sglang.runtime import pyinfra_private

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
#: Everything of the checkout that imports pyinfra.
SOURCES = ["pve_sglang", "tasks", "devtools", "tests", "bench", "deploy.py", "deploy_p2p.py",
           "inventory.py"]
THE_MODULE = REPO / "pve_sglang" / "runtime" / "pyinfra_private.py"
PYINFRA_PACKAGES = ("pyinfra", "pyinfra_cli")


def defined_private_names(package_dir: Path) -> set[str]:
    """Every ``_name`` (not dunder) a package's source defines: functions, classes, module and
    class variables, attributes it assigns, parameters."""
    names = set()
    for path in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.startswith("__") and n != "_"}


def package_dir(name: str) -> Path:
    """Where package NAME is, found without importing it (importing pyinfra_cli patches the
    standard library for gevent)."""
    spec = importlib.util.find_spec(name)
    assert spec and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations)))


#: pyinfra's private names; its global arguments (``_sudo``, ``_retries``) are its public API.
PYINFRA_PRIVATE = set().union(*(defined_private_names(package_dir(p)) for p in PYINFRA_PACKAGES)) - {
    name for name, _ in all_global_arguments()}


def sources() -> Iterator[Path]:
    for root in SOURCES:
        path = REPO / root
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(path.rglob("*.py"))


def _is_pyinfra(dotted: str) -> bool:
    return dotted.split(".")[0] in PYINFRA_PACKAGES


def _is_module(dotted: str) -> bool:
    """Whether DOTTED (of a pyinfra package) names a module, from its files (not imported)."""
    top, *rest = dotted.split(".")
    path = package_dir(top).joinpath(*rest)
    return (path / "__init__.py").is_file() or path.with_suffix(".py").is_file()


def private_uses(source: str) -> Iterator[tuple[int, str]]:
    """``(line, what)`` of each use of a pyinfra private name in SOURCE: an import of one, an
    attribute of that name (but on a module of ours or the standard library's, or our own
    ``self._name``), a keyword of that name, a ``getattr``-style string of it, and a
    replacement of any name in one of pyinfra's modules."""
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # local name -> what it names, dotted
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _is_pyinfra(node.module):
            for alias in node.names:
                if alias.name.startswith("_"):
                    yield node.lineno, f"imports {alias.name} from {node.module}"
        elif isinstance(node, ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            dotted = imported.get(base or "", "")
            if isinstance(node.ctx, ast.Store) and _is_pyinfra(dotted) and _is_module(dotted):
                yield node.lineno, f"replaces {node.attr} in {dotted}"
            elif node.attr in PYINFRA_PRIVATE:
                if dotted and not _is_pyinfra(dotted) or base in ("self", "cls") and node.attr in own:
                    continue
                yield node.lineno, f"uses .{node.attr}"
        elif isinstance(node, ast.keyword) and node.arg in PYINFRA_PRIVATE:
            yield node.lineno, f"passes {node.arg}="
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value in PYINFRA_PRIVATE:
                yield node.lineno, f"names {name.value!r}"


def test_the_scan_finds_each_kind_of_private_use():
    source = (
        "from pyinfra.api.facts import _MISSING_COMMAND_MARKER\n"
        "from pyinfra.api import util, StringCommand\n"
        "import os\n"
        "h = meta._hash\n"
        "c = StringCommand('a', 'b', _separator='')\n"
        "f = getattr(op, '_inner', None)\n"
        "util.stack = None\n"
        "os._exit(0)\n"                       # the standard library's own
        "class C:\n"
        "    def _commands(self): return self._commands\n"  # our own name
        "x = op(_sudo=True)\n"                # a global argument: public
    )
    assert sorted(line for line, _ in private_uses(source)) == [1, 4, 5, 6, 7]


def test_every_pyinfra_private_use_goes_through_pyinfra_private():
    found = [f"{path.relative_to(REPO)}:{line}: {what}"
             for path in sources() if path != THE_MODULE
             for line, what in private_uses(path.read_text())]
    assert found == [], (
        "pyinfra's private names are used only through pve_sglang/runtime/pyinfra_private.py "
        "(checked against the pinned pyinfra):\n" + "\n".join(found)
    )


def test_the_supported_version_is_the_pinned_and_installed_one():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert f"pyinfra=={pyinfra_private.SUPPORTED}" in pyproject["project"]["dependencies"]
    assert pyinfra_private.installed_version() == pyinfra_private.SUPPORTED


@pytest.mark.parametrize("installed", ["3.11.0", "3.10.1", "3.10.0rc1", "2.9"])
def test_another_version_is_refused_naming_both(installed):
    with pytest.raises(pyinfra_private.UnsupportedPyinfraVersion) as error:
        pyinfra_private.check_version(installed)
    assert f"pyinfra {installed} is installed" in str(error.value)
    assert "supports pyinfra 3.10.0 only" in str(error.value)
    assert "pip install 'pyinfra==3.10.0'" in str(error.value)


def test_no_installed_pyinfra_is_refused():
    with pytest.raises(pyinfra_private.UnsupportedPyinfraVersion, match="no installed pyinfra"):
        pyinfra_private.check_version(None)


def test_a_pyinfra_of_another_version_fails_the_deploy_on_import(tmp_path):
    # The metadata of a pyinfra 3.11.0 first on the path: the version the check reads, from
    # the installed distribution, is that one (pyinfra's code itself is still 3.10.0's).
    info = tmp_path / "pyinfra-3.11.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pyinfra\nVersion: 3.11.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    # What deploy.py imports first.
    result = subprocess.run(
        [sys.executable, "-c", "import pve_sglang.runtime.pyinfra_per_op"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("pve_sglang.runtime.pyinfra_private.UnsupportedPyinfraVersion: ")
    assert "supports pyinfra 3.10.0 only, and pyinfra 3.11.0 is installed" in last
