"""Facts read inside a GPU container: user-space driver, venv packages, the autotune patch."""

from __future__ import annotations

import json
import re
import shlex

from pyinfra.api import FactBase
from typing_extensions import override

_LIBCUDA = re.compile(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")
# Directories where NVIDIA's runfile and Debian's packages put libcuda.
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


class NvidiaUserspaceVersion(FactBase[str | None]):
    """
    Returns the version of the NVIDIA user-space driver installed in the container, from the
    ``libcuda.so.VERSION`` file name (it works without a GPU, unlike nvidia-smi), or None.
    """

    @override
    def command(self) -> str:
        dirs = " ".join(LIB_DIRS)
        return f"for d in {dirs}; do ls -1 $d 2>/dev/null | grep '^libcuda\\.so\\.' ; done; true"

    @override
    def process(self, output: list[str]) -> str | None:
        versions = [m.group(1) for m in map(_LIBCUDA.match, (o.strip() for o in output)) if m]
        return max(versions, key=lambda v: [int(p) for p in v.split(".")]) if versions else None


class PythonPackages(FactBase[dict[str, str]]):
    """
    Returns the distributions installed in the Python at PYTHON as ``{normalised name:
    version}`` (``{}`` when that Python does not exist, e.g. before the venv is made).
    """

    @override
    def command(self, python: str) -> str:
        script = (
            "import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
        )
        return f"if [ -x {shlex.quote(python)} ]; then {shlex.quote(python)} -c {shlex.quote(script)}; fi"

    @staticmethod
    @override
    def default() -> dict[str, str]:
        return {}

    @override
    def process(self, output: list[str]) -> dict[str, str]:
        raw = json.loads("".join(output) or "{}")
        return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in raw.items()}


class AutotunePatchState(FactBase[str | None]):
    """
    Returns what ``autotune_patch.py --check`` says of the sglang package in the venv at
    PYTHON: ``needs-patch``, ``already-patched``, ``upstream-enabled``, ``unrecognised: ...``;
    None when sglang or the script is not there yet.
    """

    @override
    def command(self, python: str, script: str) -> str:
        find = (
            "import importlib.util as u; s = u.find_spec('sglang'); "
            "print(s.submodule_search_locations[0] if s else '')"
        )
        py, sc = shlex.quote(python), shlex.quote(script)
        return (
            f"[ -x {py} ] && [ -f {sc} ] || exit 0; "
            f"dir=$({py} -c {shlex.quote(find)}); [ -n \"$dir\" ] || exit 0; "
            f"{py} {sc} --check \"$dir\"; true"
        )

    @override
    def process(self, output: list[str]) -> str | None:
        lines = [line.strip() for line in output if line.strip()]
        return lines[-1] if lines else None


class SglangServerFlags(FactBase["set[str] | None"]):
    """
    Returns the ``--flag`` spellings the sglang installed for PYTHON accepts, as printed by
    SCRIPT (``server_command.flags_script()``, uploaded by the deploy), with the release as
    attribute ``version``; None when sglang or the script is not there yet.
    """

    @override
    def command(self, python: str, script: str) -> str:
        py, sc = shlex.quote(python), shlex.quote(script)
        return f"[ -x {py} ] && [ -f {sc} ] || exit 0; {py} {sc} 2>/dev/null || true"

    @override
    def process(self, output: list[str]):
        from ..server_command import parse_flags_output

        text = "\n".join(output)
        return parse_flags_output(text) if text.startswith("version ") else None
