"""Operations' plain cases as data: facts in, commands out, one JSON file a case.

As pyinfra's own tests/operations: ``operations/MODULE.OPERATION/CASE.json`` holds one call of
``pve_sglang.operations.MODULE.OPERATION`` and the exact commands it yields (``[]``: converged),
or the error it raises. Adding a case is adding a file. Its keys:

- ``kwargs``: the operation's arguments, read as pyinfra_testing reads a case's
  (``"io:TEXT"`` a file object of TEXT, ``"path:P"`` a Path), and ``"returns:JSON"`` a
  function that returns JSON's value (``restart``);
- ``facts``: a list, each ``{"fact": "dotted.path.Class", "args": [...]}`` (its arguments as the
  operation asks, none: any) with its value: ``"value"`` as it is, or ``"recorded"`` (a file
  under tests/fixtures: a real command output) or ``"output"`` (the output inline) parsed by
  the real fact class; ``"plus"`` adds keys to a parsed dict;
- ``commands``: what pyinfra_testing's ``parse_commands`` gives (a string a shell command,
  ``["upload", data, dest]``); or ``exception``: ``{"name": "pyinfra.api.OperationError", "match": regex}``;
- ``about``: why the case is there (optional, free text).

A case that needs more than this (a log line, a command run for real, a fact's own value) stays
a Python test beside its operation's others (tests/unit/test_operations_*.py).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyinfra_testing.util import parse_value

from harness import fact_value, op_commands

CASES = Path(__file__).parent / "operations"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KEYS = {"about", "kwargs", "facts", "commands", "exception"}


def load(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def frozen(value: Any) -> Any:
    """JSON's lists as the tuples a fact's arguments are."""
    return tuple(frozen(item) for item in value) if isinstance(value, list) else value


def argument(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("returns:"):
        result = json.loads(value.removeprefix("returns:"))
        return lambda: result
    return parse_value(value)


def fact_entry(entry: dict) -> tuple[Any, Any]:
    """One fact of a case: (the key harness.op_commands looks it up by, its value)."""
    cls = load(entry["fact"])
    if "recorded" in entry:
        value = fact_value(cls, (FIXTURES / entry["recorded"]).read_text())
    elif "output" in entry:
        value = fact_value(cls, entry["output"])
    else:
        value = entry["value"]
    if "plus" in entry:
        value = {**value, **entry["plus"]}
    return ((cls, frozen(entry["args"])) if "args" in entry else cls), value


def case_files() -> list[Path]:
    return sorted(CASES.glob("*/*.json"))


@pytest.mark.parametrize("path", case_files(), ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_operation_case(path):
    case = json.loads(path.read_text())
    assert set(case) <= KEYS and ("commands" in case) != ("exception" in case), \
        f"{path}: keys {sorted(case)}; allowed {sorted(KEYS)}, one of commands and exception"
    module, _, name = path.parent.name.partition(".")
    op = load(f"pve_sglang.operations.{module}.{name}")
    kwargs = {key: argument(value) for key, value in case.get("kwargs", {}).items()}
    facts = dict(fact_entry(entry) for entry in case.get("facts", []))
    if "exception" in case:
        with pytest.raises(load(case["exception"]["name"]), match=case["exception"]["match"]):
            op_commands(op, facts=facts, **kwargs)
        return
    assert op_commands(op, facts=facts, **kwargs) == case["commands"]


def test_every_case_folder_names_an_operation():
    """A folder is MODULE.OPERATION of pve_sglang.operations: a misspelt one is no silent skip."""
    from pve_sglang.runtime.pyinfra_private import operation_function

    folders = sorted({path.parent.name for path in case_files()})
    assert folders, f"no case under {CASES}"
    for folder in folders:
        module, _, name = folder.partition(".")
        assert re.fullmatch(r"\w+", module) and re.fullmatch(r"\w+", name), folder
        assert operation_function(load(f"pve_sglang.operations.{module}.{name}")), folder
    strays = [path for path in CASES.rglob("*") if path.is_file() and path.suffix != ".json"
              or path.is_file() and path.parent.parent != CASES]
    assert not strays, f"not a case (operations/MODULE.OPERATION/CASE.json): {strays}"
