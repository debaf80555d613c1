"""CONTRIBUTING's naming promise, checked on the source: a module's name says what it holds,
no two modules share a stem a newcomer could mix up (one topic's modules across pyinfra's
layers aside, and the shared stems listed below with their reason), no module of ours is named
like a pyinfra operation or fact module it would shadow, and no name bound in a module (an
argument, a local, a nested function) shadows a module the file imports at its top
(``files = server_files(...)`` beside ``from pyinfra.operations import files``)."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from collections import defaultdict
from pathlib import Path

import pyinfra.facts
import pyinfra.operations
import pytest

import pve_sglang

PACKAGE = Path(pve_sglang.__file__).resolve().parent
ROOT = PACKAGE.parent
#: The deploy files pyinfra runs (``pyinfra inventory.py deploy.py``): modules a newcomer reads.
ENTRY_POINTS = ("deploy.py", "deploy_p2p.py", "inventory.py", "status.py", "tune.py")


# --- no stem for two things -------------------------------------------------------------------

#: Folders whose modules are one topic's parts as pyinfra lays them out (its own
#: ``connectors/docker.py``, ``facts/docker.py``, ``operations/docker.py``): a stem shared only
#: between them names one topic (``facts/wheel_store.py`` reads what ``operations/wheel_store.py``
#: changes; ``connectors/pct.py`` reaches the containers ``operations/pct.py`` makes).
PYINFRA_LAYERS = frozenset({"pve_sglang/connectors", "pve_sglang/facts", "pve_sglang/operations"})

#: Each other stem more than one module bears: its modules, and why a newcomer reads them as one
#: topic. A new module with one of these stems is refused until it is added here.
SHARED_STEMS: dict[str, tuple[frozenset[str], str]] = {
    "container": (frozenset({"pve_sglang/connectors/container.py", "pve_sglang/facts/container.py",
                             "tasks/container.py"}),
                  "the GPU container: the way into it (the @pct and @lxc connectors' core), what is "
                  "read inside it, and its phase"),
    "gateway": (frozenset({"pve_sglang/config/gateway.py", "pve_sglang/facts/gateway.py",
                           "pve_sglang/gateway/", "pve_sglang/operations/gateway.py",
                           "tasks/gateway.py"}),
                "the gateway: its settings, its rules (the package), its facts, its operations and "
                "its phase"),
    "monitoring": (frozenset({"pve_sglang/config/monitoring.py", "pve_sglang/monitoring/",
                              "tasks/monitoring.py"}),
                   "the monitoring container: its settings, its rules (the package) and its phase"),
    "status": (frozenset({"pve_sglang/facts/status.py", "pve_sglang/server/status.py",
                          "tasks/status.py", "status.py"}),
               "make status: its one read (the fact), its rows (pure), its phase and its deploy "
               "file"),
    "verify": (frozenset({"pve_sglang/facts/verify.py", "pve_sglang/operations/verify.py",
                          "tasks/verify.py"}),
               "the verify phase: its checks as facts, its operations and its steps"),
    "tune": (frozenset({"tasks/tune.py", "tune.py"}), "make tune: its steps and its deploy file"),
    "roll": (frozenset({"pve_sglang/gateway/roll.py", "pve_sglang/operations/roll.py"}),
             "the roll behind a gateway: its plan (pure, with the gateway's rules) and the "
             "operation that runs each replica's turn"),
    "render": (frozenset({"pve_sglang/gateway/render.py", "pve_sglang/monitoring/render.py",
                          "pve_sglang/server/render.py"}),
               "one role in three topics: each renders its topic's files from its settings, and "
               "is imported with its topic's name (gateway_render) where two meet"),
    "facts": (frozenset({"pve_sglang/facts/", "pve_sglang/model_store/facts.py"}),
              "pyinfra's facts: the deploy's, and the model store's kept with its topic"),
    "operations": (frozenset({"pve_sglang/operations/", "pve_sglang/model_store/operations.py"}),
                   "pyinfra's operations: the deploy's, and the model store's kept with its topic"),
}


def project_modules(root: Path = ROOT) -> dict[str, list[str]]:
    """Stem -> the modules bearing it (paths from ROOT; a package as ``its/folder/``): every
    module and package of ``pve_sglang/``, ``tasks/`` and the deploy files, ``__init__`` aside."""
    found: dict[str, list[str]] = defaultdict(list)
    package = root / "pve_sglang"
    for path in sorted([*package.rglob("*.py"), *(root / "tasks").glob("*.py"),
                        *(root / name for name in ENTRY_POINTS if (root / name).exists())]):
        if "__pycache__" in path.parts:
            continue
        relative = path.relative_to(root)
        if path.stem == "__init__":
            if path.parent != package and path.parent != root / "tasks":
                found[path.parent.name].append(f"{relative.parent.as_posix()}/")
        else:
            found[path.stem].append(relative.as_posix())
    return dict(found)


def stem_problems(modules: dict[str, list[str]],
                  shared: dict[str, tuple[frozenset[str], str]]) -> list[str]:
    """The stems MODULES bears more than once that are neither one topic across pyinfra's layers
    nor listed in SHARED with exactly those modules, and the listed stems no longer shared."""
    problems = []
    for stem, paths in sorted(modules.items()):
        folders = [path.rstrip("/").rpartition("/")[0] for path in paths]
        if len(paths) < 2 or (set(folders) <= PYINFRA_LAYERS and len(set(folders)) == len(paths)):
            continue
        listed = shared.get(stem, (frozenset(), ""))[0]
        if set(paths) != listed:
            problems.append(f"{stem}: {', '.join(paths)}"
                            + (f" (listed: {', '.join(sorted(listed))})" if listed else ""))
    problems += [f"{stem}: listed but borne by {', '.join(modules.get(stem, [])) or 'none'}"
                 for stem in sorted(shared) if len(modules.get(stem, [])) < 2]
    return problems


def test_no_two_modules_share_a_stem_unless_one_topic():
    assert stem_problems(project_modules(), SHARED_STEMS) == []


def test_a_shared_stem_is_found(tmp_path):
    for path in ("pve_sglang/facts/store.py", "pve_sglang/operations/store.py",
                 "pve_sglang/connectors/pct.py", "pve_sglang/operations/pct.py",
                 "pve_sglang/server/render.py", "pve_sglang/gateway/render.py",
                 "pve_sglang/stack/store.py", "tasks/verify.py", "pve_sglang/facts/verify.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    modules = project_modules(tmp_path)
    assert modules["pct"] == ["pve_sglang/connectors/pct.py", "pve_sglang/operations/pct.py"]
    shared = {"render": SHARED_STEMS["render"], "verify": SHARED_STEMS["verify"]}
    # store: a facts/operations pair, but a third module joins it; render: two of the three
    # listed; verify: tasks' and facts' (operations' missing); pct: one topic's layers.
    assert stem_problems(modules, shared) == [
        "render: pve_sglang/gateway/render.py, pve_sglang/server/render.py (listed: "
        "pve_sglang/gateway/render.py, pve_sglang/monitoring/render.py, "
        "pve_sglang/server/render.py)",
        "store: pve_sglang/facts/store.py, pve_sglang/operations/store.py, "
        "pve_sglang/stack/store.py",
        "verify: pve_sglang/facts/verify.py, tasks/verify.py (listed: pve_sglang/facts/verify.py, "
        "pve_sglang/operations/verify.py, tasks/verify.py)",
    ]
    assert stem_problems({"tune": ["tune.py"]}, {"tune": SHARED_STEMS["tune"]}) == [
        "tune: listed but borne by tune.py"]


# --- no pyinfra module's name -----------------------------------------------------------------

#: The modules a deploy imports by their bare names (``from pyinfra.operations import apt,
#: files, server``): one of ours so named would take that name in the files importing both.
PYINFRA_NAMES = frozenset(module.name for package in (pyinfra.operations, pyinfra.facts)
                          for module in pkgutil.iter_modules(package.__path__))

#: Ours that bear one of those names anyway, and why no file mixes them up.
PYINFRA_NAMED: dict[str, str] = {
    "server": "pve_sglang/server/ is a package: its modules are imported by their own names "
              "(server.render's server_files), the package never as a bare `server`",
}


def plain_imports_of_ours(root: Path = ROOT) -> set[str]:
    """The names our modules are bound to where a file imports one whole (``from pve_sglang
    import server``, ``from pve_sglang.operations import apt``, ``import tasks.x as y``)."""
    bound = set()
    for path in [*(root / "pve_sglang").rglob("*.py"), *(root / "tasks").glob("*.py"),
                 *(root / "tests").rglob("*.py"), *(root / "devtools").rglob("*.py"),
                 *(root / "bench").rglob("*.py"), *(root / name for name in ENTRY_POINTS)]:
        if not path.exists() or "__pycache__" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] in ("pve_sglang", "tasks"):
                bound |= {alias.asname or alias.name for alias in node.names
                          if is_module(f"{node.module}.{alias.name}")}
            elif isinstance(node, ast.Import):
                bound |= {alias.asname for alias in node.names
                          if alias.asname and alias.name.split(".")[0] in ("pve_sglang", "tasks")}
    return bound


def is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def pyinfra_named(modules: dict[str, list[str]], named: dict[str, str]) -> list[str]:
    """Our stems that are a pyinfra operation or fact module's name, unless NAMED says why."""
    return sorted(f"{stem}: {', '.join(modules[stem])}"
                  for stem in set(modules) & PYINFRA_NAMES if stem not in named)


def test_no_module_of_ours_is_named_as_a_pyinfra_module():
    assert pyinfra_named(project_modules(), PYINFRA_NAMED) == []


def test_the_pyinfra_names_we_bear_are_never_imported_bare():
    assert set(PYINFRA_NAMED) & plain_imports_of_ours() == set()


def test_a_pyinfra_name_is_found():
    assert {"apt", "files", "server", "systemd", "python"} <= PYINFRA_NAMES
    modules = {"apt": ["pve_sglang/operations/apt.py"], "server": ["pve_sglang/server/"],
               "debs": ["pve_sglang/operations/debs.py"]}
    assert pyinfra_named(modules, PYINFRA_NAMED) == ["apt: pve_sglang/operations/apt.py"]
    assert "stack_switch" in plain_imports_of_ours()


# --- no imported module shadowed --------------------------------------------------------------

def imported_modules(tree: ast.Module) -> dict[str, str]:
    """The names a module's top-level imports bind to modules (``from pyinfra.operations import
    files`` binds ``files``; ``from x import some_function`` binds no module)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = \
                    alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if is_module(f"{node.module}.{alias.name}"):
                    found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def bindings(tree: ast.Module):
    """Each name bound below the module's top-level imports: (line, name, what binds it, the
    module an import binds it to or None)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            yield node.lineno, node.arg, "argument", None
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.lineno, node.id, "assignment", None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name, "definition", None
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.lineno, node.name, "exception", None
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
            for alias in node.names:
                module = alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
                yield node.lineno, alias.asname or alias.name.split(".")[0], "import", module


def shadowing(source: str) -> list[str]:
    """Where SOURCE binds again a name its top-level imports bound to a module."""
    tree = ast.parse(source)
    modules = imported_modules(tree)
    return sorted({f"line {line}: {name} ({what}) shadows the module {modules[name]}"
                   for line, name, what, module in bindings(tree)
                   if name in modules and module != modules[name]},
                  key=lambda text: int(text.split(":")[0].split()[1]))


SCANNED = sorted(path.relative_to(ROOT).as_posix()
                 for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tasks").glob("*.py"),
                              *(ROOT / "devtools").rglob("*.py"), *(ROOT / "bench").rglob("*.py"),
                              *(ROOT / name for name in ENTRY_POINTS)]
                 if "__pycache__" not in path.parts)


@pytest.mark.parametrize("path", SCANNED)
def test_no_name_shadows_an_imported_module(path):
    assert shadowing((ROOT / path).read_text()) == []


def test_a_shadowed_module_is_found():
    source = ("from pyinfra.operations import files, server\n"
              "from pve_sglang.operations import paths\n"
              "from pve_sglang.server.render import server_files\n"
              "def step(server):\n"
              "    files = server_files()\n"
              "    def server_files(): ...\n"
              "    from pve_sglang.operations import paths\n"
              "    from pve_sglang.facts import status as paths\n"
              "    return files\n")
    assert shadowing(source) == [
        "line 4: server (argument) shadows the module pyinfra.operations.server",
        "line 5: files (assignment) shadows the module pyinfra.operations.files",
        "line 8: paths (import) shadows the module pve_sglang.operations.paths",
    ]
