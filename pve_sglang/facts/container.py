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


# One Python start in the venv answers three questions: the installed distributions, what the
# autotune patch script says, and which server flags the release knows. Scripts run in-process
# (runpy) with their own argv; each one's stdout is kept.
_VENV_STATE_SCRIPT = r"""
import contextlib, importlib.metadata as m, importlib.util as u, io, json, os, runpy, sys
tools = sys.argv[1]
out = {"packages": {d.metadata["Name"]: d.version for d in m.distributions()}}
spec = u.find_spec("sglang")
if spec and spec.submodule_search_locations:
    package = list(spec.submodule_search_locations)[0]
    for key, script, args in (("patch", "autotune_patch.py", ["--check", package]),
                              ("flags", "sglang_flags.py", [])):
        path = os.path.join(tools, script)
        if not os.path.exists(path):
            continue
        buf = io.StringIO()
        sys.argv = [path, *args]
        try:
            with contextlib.redirect_stdout(buf):
                runpy.run_path(path, run_name="__main__")
        except SystemExit:
            pass
        out[key] = buf.getvalue()
print(json.dumps(out))
"""


class SglangVenv(FactBase[dict]):
    """
    Returns the state of the sglang venv at PYTHON: ``packages`` (``{normalised name:
    version}``), ``patch`` (the last line of ``TOOLS/autotune_patch.py --check``: needs-patch,
    already-patched, upstream-enabled, unrecognised: ...) and ``flags`` (the release's server
    flags from ``TOOLS/sglang_flags.py``, with attribute ``version``); None for what is not
    there yet. ``{"packages": {}}`` before the venv exists.
    """

    @override
    def command(self, python: str, tools: str) -> str:
        py = shlex.quote(python)
        return f"[ -x {py} ] || exit 0; {py} -c {shlex.quote(_VENV_STATE_SCRIPT)} {shlex.quote(tools)}"

    @staticmethod
    @override
    def default() -> dict:
        return {"packages": {}, "patch": None, "flags": None}

    @override
    def process(self, output: list[str]) -> dict:
        from ..server_command import parse_flags_output

        raw = json.loads("".join(output))
        patch_lines = [line.strip() for line in raw.get("patch", "").splitlines() if line.strip()]
        flags = raw.get("flags", "")
        return {
            "packages": {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in raw["packages"].items()},
            "patch": patch_lines[-1] if patch_lines else None,
            "flags": parse_flags_output(flags) if flags.startswith("version ") else None,
        }


class UvVersion(FactBase["str | None"]):
    """Returns the version of the uv at UV (``uv --version``), or None when it is not there."""

    @override
    def command(self, uv: str) -> str:
        return f"[ -x {shlex.quote(uv)} ] && {shlex.quote(uv)} --version; true"

    @override
    def process(self, output: list[str]) -> str | None:
        words = " ".join(output).split()
        return words[1] if len(words) > 1 and words[0] == "uv" else None


class FileDigest(FactBase["dict | None"]):
    """Returns ``{"mode": "644", "sha1": ...}`` of the file at PATH in one read, or None."""

    @override
    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return f"[ -f {p} ] && stat -c %a {p} && sha1sum {p}; true"

    @override
    def process(self, output: list[str]) -> dict | None:
        if len(output) < 2:
            return None
        return {"mode": output[0].strip(), "sha1": output[1].split()[0]}


class UnitState(FactBase[dict]):
    """Returns ``{"active": "active", "enabled": "enabled"}`` of systemd UNIT in one read."""

    @override
    def command(self, unit: str) -> str:
        return f"systemctl show -p ActiveState -p UnitFileState {shlex.quote(unit)} 2>/dev/null; true"

    @staticmethod
    @override
    def default() -> dict:
        return {"active": None, "enabled": None}

    @override
    def process(self, output: list[str]) -> dict:
        values = dict(line.strip().split("=", 1) for line in output if "=" in line)
        return {"active": values.get("ActiveState"), "enabled": values.get("UnitFileState")}
