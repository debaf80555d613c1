"""The container's one read (``ContainerState``): the same values as each fact read alone, and
what an operation changes is read again (``operations/container_reads.py``)."""

from __future__ import annotations

import shutil
import sys

import pytest
from pyinfra.context import ctx_host, ctx_state

from harness import FoldingHost, sh
from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.facts.one_read import (
    PARTS,
    ContainerState,
    PartFailed,
    part_command,
    part_values,
)
from pve_sglang.operations import debs, paths, venv
from pve_sglang.operations import container_reads as container_state
from pve_sglang.runtime.pyinfra_private import operation_function


def alone(kind: str, args: tuple):
    fact = PARTS[kind][0]()
    lines = sh(part_command(kind, args))
    return fact.process(lines) if lines else fact.default()


def test_one_read_gives_each_fact_its_own_value(tmp_path):
    (tmp_path / "f").write_text("x\n")
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\nprintf 'uv 0.13.8 (x)'\n")  # no newline: the section still ends
    uv.chmod(0o755)
    tools = tmp_path / "tools"
    tools.mkdir()
    parts = (("paths", ((str(tmp_path / "f"), str(tmp_path), str(tmp_path / "nope")),)),
             ("uv", (str(uv),)),
             ("uv", (str(tmp_path / "no-uv"),)),
             # SglangVenv's `exit 0` (no such Python) ends its own part only.
             ("venv", (str(tmp_path / "no-venv/bin/python"), str(tools))),
             ("venv", (sys.executable, str(tools))),
             ("unit", ("sglang.service",)),
             ("hostname", ()))
    if shutil.which("dpkg"):
        parts += (("debs", ()),)
    values = part_values(parts, ContainerState().process(sh(ContainerState().command(parts))))
    assert list(values) == list(parts)
    for (kind, args), value in values.items():
        assert value == alone(kind, args), kind
    assert values[parts[1]] == "0.13.8" and values[parts[2]] is None
    assert values[parts[3]] == {"packages": {}, "patch": None}
    assert values[parts[0]][str(tmp_path / "nope")] is None


def test_a_failing_part_is_a_failure_of_that_part_only(tmp_path):
    script = tmp_path / "venv_python"
    script.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    script.chmod(0o755)
    parts = (("venv", (str(script), str(tmp_path))), ("uv", (str(tmp_path / "uv"),)))
    values = part_values(parts, ContainerState().process(sh(ContainerState().command(parts))))
    assert isinstance(values[parts[0]], PartFailed) and values[parts[0]].rc == 3
    assert values[parts[1]] is None


class ContainerFoldingHost(FoldingHost):
    """A host whose connector folds (as a container connector does); paths as
    ``{path: state}`` in VALUES["paths"]."""

    FOLD, PARTS = ContainerState, PARTS

    def __init__(self, values: dict):
        super().__init__(values, "ct")

    def lookup(self, kind, args):
        if kind == "paths":
            return {p: self.values["paths"].get(p) for p in args[0]}
        return self.values[(kind, args)]


PY, TOOLS, UNIT = "/opt/sglang/venv/bin/python", "/opt/sglang", "sglang.service"
EXPECTED = [("debs", ()), ("uv", (container_state.TOOLS_UV,)), ("venv", (PY, TOOLS)),
            ("unit", (UNIT,))]


@pytest.fixture
def folding(monkeypatch):
    values = {
        "paths": {"/etc/hostname": {"type": "file", "mode": "644", "sha1": "0", "mtime": 1}},
        ("debs", ()): {"curl": ["1"]},
        ("uv", (container_state.TOOLS_UV,)): "0.13.8",
        ("venv", (PY, TOOLS)): {"packages": {"sglang": "0.5.9"}, "patch": "already-patched"},
        ("unit", (UNIT,)): {"active": "inactive", "enabled": "disabled"},
    }
    host = ContainerFoldingHost(values)
    monkeypatch.setattr(container_state, "_folds", lambda: True)
    monkeypatch.setattr(container_state, "expected", lambda: EXPECTED)
    monkeypatch.setattr("pve_sglang.operations.container_reads.part_values",
                        lambda parts, raw: {p: host.lookup(*p) for p in parts})
    with ctx_state.use(host.state), ctx_host.use(host):
        paths.watch("/etc/hostname")
        yield host


def test_the_first_ask_reads_every_part_and_later_asks_read_nothing(folding):
    assert paths.state("/etc/hostname")["mode"] == "644"
    assert folding.reads == [("paths", "debs", "uv", "venv", "unit")]
    assert container_state.read("debs") == {"curl": ["1"]}
    assert container_state.read("uv", container_state.TOOLS_UV) == "0.13.8"
    assert venv.venv_state(PY, TOOLS)["patch"] == "already-patched"
    assert container_state.read("unit", UNIT)["enabled"] == "disabled"
    assert folding.reads == [("paths", "debs", "uv", "venv", "unit")]


def test_what_an_operation_changed_is_read_again_alone(folding):
    container_state.read("debs")
    folding.reads.clear()
    # An install forgets the packages: the next ask reads them alone, with their own fact.
    container_state.forget(Kind.DEBS)
    folding.values[("debs", ())] = {"curl": ["1"], "python3-venv": ["2"]}
    assert "python3-venv" in container_state.read("debs")
    assert folding.reads == [("debs",)]
    # The venv changed (an install, the patch): read again.
    venv.venv_changed()
    venv.venv_state(PY, TOOLS)
    assert folding.reads[1:] == [("venv",)]
    # The patch script the venv's read runs was written: its answer is forgotten too.
    paths.forget(f"{TOOLS}/autotune_patch.py")
    venv.venv_state(PY, TOOLS)
    assert folding.reads[1:] == [("venv",), ("venv",)]
    venv.venv_state(PY, TOOLS)
    assert folding.reads[1:] == [("venv",), ("venv",)]
    # The unit file was written: its NeedDaemonReload moved, the unit is read again.
    container_state.read("unit", UNIT)
    reads = len(folding.reads)
    paths.forget(f"/etc/systemd/system/{UNIT}")
    container_state.read("unit", UNIT)
    assert folding.reads[reads:] == [("unit",)]
    assert len(folding.reads) == reads + 1


def test_a_failed_part_fails_the_asking_operation(folding):
    from pyinfra.api import OperationError

    folding.values[("uv", (container_state.TOOLS_UV,))] = PartFailed(2, ["boom"])
    with pytest.raises(OperationError, match="exit status 2"):
        container_state.read("uv", container_state.TOOLS_UV)


def test_tools_venv_and_deb_packages_forget_what_they_installed(folding):
    folding.values[("uv", (container_state.TOOLS_UV,))] = "0.1.0"
    folding.values[("debs", ())] = {}
    list(operation_function(venv.tools_venv)(path="/opt/sglang/tools", uv_version="0.13.8"))
    list(operation_function(debs.deb_packages)(packages=["curl"]))
    assert container_state.TOOLS_UV not in cache.memo(Kind.UV) and None not in cache.memo(Kind.DEBS)
