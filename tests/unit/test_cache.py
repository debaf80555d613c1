"""The per-run cache takes only declared kinds (``cache.Kind``), each kept as declared.

A kind misspelt as a string would be a cache of its own, never forgotten by the operation that
changes what it holds: a stale read, silently. The cache's functions refuse anything but a
``Kind``; the source is scanned so that every kind it names is declared, every declared kind
is used, and each part of a one-command read has its kind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State

from pve_sglang.facts.one_read import PARTS
from pve_sglang.facts.lxc_host import HOST_PARTS
from pve_sglang.operations import container_reads as container_state, host_reads as host_state
from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import WHOLE_RUN, Kind

REPO = Path(__file__).resolve().parents[2]
CACHE_PY = REPO / "pve_sglang" / "runtime" / "cache.py"
#: The cache's functions that take a kind, and where: (name, position of the kind argument).
TAKES_KIND = {"memo": 0, "forget": 0, "once": 0, "depends": 1}
#: The modules whose functions of those names take a kind (``container_state.forget``).
RECEIVERS = ("cache", "container_state")


def sources() -> list[Path]:
    return sorted((REPO / "pve_sglang").rglob("*.py")) + sorted((REPO / "tasks").glob("*.py"))


def _declaration_nodes(tree: ast.Module) -> set[int]:
    """Ids of the nodes of cache.py that declare kinds (the class, ``WHOLE_RUN``): not uses."""
    ids: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Kind" or (
                isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "WHOLE_RUN"
                                                     for t in node.targets)):
            ids |= {id(n) for n in ast.walk(node)}
    return ids


def kinds_named(path: Path) -> list[tuple[int, str]]:
    """``(line, NAME)`` of each ``Kind.NAME`` in PATH, declarations left out."""
    tree = ast.parse(path.read_text())
    skip = _declaration_nodes(tree) if path == CACHE_PY else set()
    return [(node.lineno, node.attr) for node in ast.walk(tree)
            if id(node) not in skip and isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "Kind"]


def string_kinds(path: Path) -> list[tuple[int, str]]:
    """``(line, call)`` of each call of a cache function given a string constant as its kind."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and getattr(func.value, "id", None) in RECEIVERS:
            name = func.attr
        elif isinstance(func, ast.Name):
            name = func.id
        else:  # paths.forget(path) and the like: not the cache's
            continue
        position = TAKES_KIND.get(name)
        if position is None or len(node.args) <= position:
            continue
        kind = node.args[position]
        if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_finds_string_kinds_and_named_kinds(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('cache.memo("venv")\nforget("unit", key)\ncache.depends(p, "uv", k)\n'
                      'cache.changed("/etc/x")\nmemo(Kind.VENV)\nonce(Kind.NOPE, 1)\n'
                      'container_state.forget("debs")\npaths.forget("/etc/x")\n')
    assert [line for line, _ in string_kinds(sample)] == [1, 2, 3, 7]
    assert kinds_named(sample) == [(5, "VENV"), (6, "NOPE")]


def test_no_cache_function_is_given_a_string_kind():
    found = [f"{path.relative_to(REPO)}:{line}: {call}"
             for path in sources() for line, call in string_kinds(path)]
    assert found == [], "cache kinds are cache.Kind members:\n" + "\n".join(found)


def test_every_kind_named_is_declared_and_every_declared_kind_is_used():
    named = {(path.relative_to(REPO), line, name)
             for path in sources() for line, name in kinds_named(path)}
    undeclared = sorted(f"{path}:{line}: Kind.{name}" for path, line, name in named
                        if name not in Kind.__members__)
    assert undeclared == []
    unused = set(Kind.__members__) - {name for _, _, name in named}
    assert unused == set()


def test_each_part_of_a_one_command_read_has_its_declared_kind():
    assert set(container_state.MEMO) == set(PARTS)
    assert set(host_state.MEMO) == set(HOST_PARTS)
    for kind in (*container_state.MEMO.values(), *host_state.MEMO.values()):
        assert isinstance(kind, Kind) and kind not in WHOLE_RUN


@pytest.fixture
def local():
    state = State(Inventory((["@local"], {})), Config())
    return state.inventory.get_host("@local")


@pytest.mark.parametrize("kind", ["venv", "vnev", None])
@pytest.mark.parametrize("call", [
    lambda kind, h: cache.memo(kind, of=h),
    lambda kind, h: cache.forget(kind, of=h),
    lambda kind, h: cache.once(kind, "key", of=h),
    lambda kind, h: cache.depends("/etc/x", kind, "key", of=h),
], ids=["memo", "forget", "once", "depends"])
def test_a_kind_not_declared_fails_loudly(local, call, kind):
    # Even a declared kind's own value: a string is not checked against the declarations.
    with pytest.raises(TypeError, match=r"is not a cache\.Kind: pass a member of Kind"):
        call(kind, local)


def test_once_takes_a_kind_kept_for_the_whole_run(local):
    with pytest.raises(ValueError, match="VENV is kept per stage"):
        cache.once(Kind.VENV, "key", of=local)
    assert cache.once(Kind.RESTART_REASON, "sglang.service", of=local)
    assert not cache.once(Kind.RESTART_REASON, "sglang.service", of=local)


def test_a_kind_is_kept_per_stage_or_for_the_whole_run_as_declared(local):
    # The kinds asked with per_stage=False (and once's) before kinds were declared.
    assert {kind.value for kind in WHOLE_RUN} == {
        "lxc_expected", "watched", "diff_shown", "unit_looping", "restart_pending",
        "restart_reason", "settings", "driver_and_gpus"}
    local.state.is_executing = False
    planned = {kind: cache.memo(kind, of=local) for kind in Kind}
    for kind in Kind:
        planned[kind]["k"] = True
    local.state.is_executing = True
    for kind in Kind:
        assert ("k" in cache.memo(kind, of=local)) == (kind in WHOLE_RUN), kind


def test_forget_and_changed_forget_what_was_kept_in_every_stage(local):
    for executing in (False, True):
        local.state.is_executing = executing
        cache.memo(Kind.PATHS, of=local)["/etc/x"] = {"type": "file"}
        cache.memo(Kind.UNIT, of=local)["a.service"] = {"active": "active"}
        cache.memo(Kind.UV, of=local)["/uv"] = "0.1"
        cache.depends("/etc/x", Kind.UNIT, "a.service", of=local)
    cache.forget(Kind.UV, "/uv", of=local)
    cache.changed("/etc/x", of=local)
    for executing in (False, True):
        local.state.is_executing = executing
        assert cache.memo(Kind.PATHS, of=local) == {}
        assert cache.memo(Kind.UNIT, of=local) == {}
        assert cache.memo(Kind.UV, of=local) == {}
