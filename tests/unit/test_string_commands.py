"""pyinfra's ``StringCommand`` takes its bits, ``_separator`` and connector arguments (``_sudo``,
``_env`` ...) as keywords: any other keyword is kept silently as a connector argument, so a
misspelt ``separator=`` changes nothing and says nothing (issue 47, item 16). Every
``StringCommand`` the project builds gets only keywords pyinfra knows."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.command import StringCommand

from pve_sglang.facts.lxc_host import LxcCgroupValues

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(path for folder in ("pve_sglang", "tasks", "devtools", "bench")
                 for path in (ROOT / folder).rglob("*.py")) + sorted(ROOT.glob("*.py"))
#: What StringCommand takes by keyword besides its bits.
KNOWN = {"_separator", *typing.get_type_hints(ConnectorArguments)}


def unknown_keywords(path: Path) -> list[str]:
    """``LINE: NAME`` of each keyword a StringCommand call in PATH gives that pyinfra does not
    take."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "StringCommand":
            found += [f"{node.lineno}: {kw.arg}" for kw in node.keywords
                      if kw.arg is not None and kw.arg not in KNOWN]
    return found


def test_the_sources_are_found():
    names = {str(path.relative_to(ROOT)) for path in SOURCES}
    assert {"pve_sglang/facts/lxc_host.py", "tasks/host.py", "deploy.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_string_command_gets_only_keywords_pyinfra_takes(path):
    assert unknown_keywords(path) == []


def test_the_check_finds_a_misspelt_separator(tmp_path):
    module = tmp_path / "fact.py"
    module.write_text("StringCommand('a', 'b', separator=' ')\n"
                      "api.StringCommand('a', _separator='', _sudo=True)\n")
    assert unknown_keywords(module) == ["1: separator"]


def test_lxc_cgroup_values_command_carries_no_connector_argument():
    """The command as pyinfra runs it, and no connector argument kept on any part of it
    (``separator=" "`` sat there as one)."""
    command = LxcCgroupValues().command("ct 1", "/var/lib/lxc", ["memory.max", "cpuset.cpus"])
    assert command.get_raw_value() == (
        "printf '%s: %s\\n' memory.max \"$(lxc-cgroup -P /var/lib/lxc -n 'ct 1' memory.max "
        "2>/dev/null)\"; printf '%s: %s\\n' cpuset.cpus \"$(lxc-cgroup -P /var/lib/lxc -n 'ct 1' "
        "cpuset.cpus 2>/dev/null)\"; true")
    parts = [command, *(bit for bit in command.bits if isinstance(bit, StringCommand))]
    assert len(parts) == 3
    assert [part.connector_arguments for part in parts] == [{}, {}, {}]
