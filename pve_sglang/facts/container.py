"""Facts read inside a GPU container: user-space driver, venv packages, the autotune patch."""

from __future__ import annotations

import calendar
import json
import re
import time
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name
from pyinfra.api import FactBase, OperationError, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang import remote
from pve_sglang.runtime.pyinfra_private import joined

if TYPE_CHECKING:  # imported where it is used, in process: facts stand below the server
    from pve_sglang.server.command import KnownFlags

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


# One Python start in the venv answers two questions: the installed distributions and what the
# autotune patch script says (remote/venv_state.py, sent as ``python -c``).
_VENV_STATE_SCRIPT = remote.source(remote.VENV_STATE).read_text()


class SglangVenv(FactBase[dict]):
    """
    Returns the state of the sglang venv at PYTHON: ``packages`` (``{normalised name:
    version}``) and ``patch`` (the last line of ``remote/autotune_patch.py --check`` in TOOLS:
    needs-patch, already-patched, upstream-enabled, unrecognised: ...; None when sglang or the
    script is not there yet), ``incomplete`` (an install was cut short: ``remote.venv_state.INSTALL_MARKER``),
    ``in_venv`` (the packages in the venv's own site-packages, not the shared layer) and
    ``python`` (its version, ``3.11``).
    ``{"packages": {}, "patch": None}`` before the venv exists.
    """

    @override
    def command(self, python: str, tools: str) -> StringCommand:
        py = QuoteString(python)
        return StringCommand("[ -x", py, "] || exit 0;", py, "-c", QuoteString(_VENV_STATE_SCRIPT),
                             QuoteString(remote.path(remote.AUTOTUNE_PATCH, tools)))

    @staticmethod
    @override
    def default() -> dict:
        return {"packages": {}, "patch": None}

    @override
    def process(self, output: list[str]) -> dict:
        raw = json.loads("".join(output))
        patch_lines = [line.strip() for line in raw.get("patch", "").splitlines() if line.strip()]
        return {
            "packages": {canonicalize_name(n): v for n, v in raw["packages"].items()},
            "in_venv": sorted(canonicalize_name(n) for n in raw.get("in_venv", [])),
            "patch": patch_lines[-1] if patch_lines else None,
            "incomplete": bool(raw.get("incomplete")),
            "python": raw.get("python"),
        }


class SglangServerFlags(FactBase["KnownFlags | None"]):
    """
    Returns the ``--flag`` spellings the sglang installed for PYTHON accepts, as printed by
    SCRIPT (``remote/sglang_flags.py``, uploaded by the deploy), with the release as
    attribute ``version``; None when sglang or the script is not there yet.
    """

    @override
    def command(self, python: str, script: str) -> StringCommand:
        py, sc = QuoteString(python), QuoteString(script)
        return StringCommand("[ -x", py, "] && [ -f", sc, "] || exit 0;", py, sc,
                             "2>/dev/null || true")

    @override
    def process(self, output: list[str]) -> KnownFlags | None:
        from pve_sglang.server.command import parse_flags_output

        text = "\n".join(output)
        return parse_flags_output(text) if text.startswith("version ") else None


class UvVersion(FactBase["str | None"]):
    """Returns the version of the uv at UV (``uv --version``), or None when it is not there."""

    @override
    def command(self, uv: str) -> StringCommand:
        return StringCommand("[ -x", QuoteString(uv), "] &&", QuoteString(uv), "--version; true")

    @override
    def process(self, output: list[str]) -> str | None:
        words = " ".join(output).split()
        return words[1] if len(words) > 1 and words[0] == "uv" else None


class PathStates(FactBase[dict]):
    """
    Returns, for each of PATHS in one read, ``{"type": "file"|"dir", "mode": "644", "sha1":
    ..., "mtime": 1700000000123456}`` (sha1 for files only; mtime in microseconds since the
    epoch, None where ``stat`` cannot print fractions), or None when the path does not exist.
    """

    @override
    def command(self, paths: tuple[str, ...]) -> StringCommand:
        # Shell builtins name each path's kind; then one stat (mode, mtime) of the paths that
        # exist and one sha1sum of the files, in that order: two processes for any number of
        # paths. A path removed between the two makes stat fail: the read fails, not lies.
        return joined(
            StringCommand("set --; for p in", *(QuoteString(p) for p in paths)),
            "; do "
            'if [ -f "$p" ]; then printf \'%s|file\\n\' "$p"; set -- "$@" "$p"; '
            'elif [ -d "$p" ]; then printf \'%s|dir\\n\' "$p"; set -- "$@" "$p"; '
            "else printf '%s|missing\\n' \"$p\"; fi; done; "
            '[ $# -eq 0 ] || stat -c \'%a %.6Y\' -- "$@" || exit; '
            'for p in "$@"; do if [ -f "$p" ]; then set -- "$@" "$p"; fi; shift; done; '
            '[ $# -eq 0 ] || sha1sum -- "$@"',
        )

    @staticmethod
    @override
    def default() -> dict:
        return {}

    @override
    def process(self, output: list[str]) -> dict:
        kinds, stats, sums = [], [], []
        for line in output:
            line = line.rstrip("\n")
            if line.startswith("/"):
                path, _, kind = line.rpartition("|")
                kinds.append((path, kind))
            elif found := _STAT_LINE.match(line):
                stats.append(found.groups())
            elif found := _SHA1_LINE.match(line):
                sums.append(found.group(1))
        existing = [(path, kind) for path, kind in kinds if kind in ("file", "dir")]
        files = [path for path, kind in existing if kind == "file"]
        if len(stats) != len(existing) or len(sums) != len(files):
            raise OperationError(f"path states: {len(stats)} stat and {len(sums)} sha1 lines for "
                             f"{len(existing)} paths and {len(files)} files")
        sha1 = dict(zip(files, sums))
        states: dict = {path: None for path, kind in kinds if kind not in ("file", "dir")}
        for (path, kind), (mode, mtime) in zip(existing, stats):
            states[path] = {"type": kind, "mode": mode, "sha1": sha1.get(path),
                            "mtime": _micros(mtime)}
        return states


# stat -c '%a %.6Y': the mode, the mtime (seconds and fraction). sha1sum: the hash first (after
# a backslash when it escaped the name).
_STAT_LINE = re.compile(r"^(\d+) (\S+)$")
_SHA1_LINE = re.compile(r"^\\?([0-9a-f]{40}) ")
_STAMP = re.compile(r"^(\d+)\.(\d{1,9})$")
# systemctl show --timestamp=us+utc: "Wed 2026-12-02 21:09:32.618391 UTC".
_UNIT_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{6}) UTC$")


def _micros(stamp: str | None) -> int | None:
    """``SECONDS.FRACTION`` (stat's ``%.6Y``) in microseconds; None without a fraction: whole
    seconds cannot order a write and a start of the same second."""
    found = _STAMP.match(stamp or "")
    return int(found.group(1)) * 1_000_000 + int(found.group(2).ljust(6, "0")[:6]) if found else None


def _unit_micros(stamp: str | None) -> int | None:
    """A ``systemctl show --timestamp=us+utc`` time in microseconds since the epoch, or None
    (unset: never started; or a systemd without ``--timestamp``, whose times have no
    microseconds)."""
    found = _UNIT_STAMP.search(stamp or "")
    if not found:
        return None
    seconds = calendar.timegm(time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S"))
    return seconds * 1_000_000 + int(found.group(2))


class UnitState(FactBase[dict]):
    """Returns ``{"active": "active", "enabled": "enabled", "stale": False, "started":
    1700000000123456, "sub": "running", "restarts": "0", "result": "success"}`` of systemd
    UNIT in one read; ``stale``: its file changed since systemd
    loaded it (``NeedDaemonReload``); ``started``: when its main process started
    (``ExecMainStartTimestamp``, else ``ActiveEnterTimestamp``), in microseconds since the
    epoch, or None. Times come with ``--timestamp=us+utc`` (systemd 248 on; Debian 12 has 252);
    an older systemctl refuses that option and is asked again without it (no ``started``)."""

    @override
    def command(self, unit: str) -> StringCommand:
        props = ("show -p ActiveState -p UnitFileState -p NeedDaemonReload "
                 "-p ExecMainStartTimestamp -p ActiveEnterTimestamp -p SubState -p NRestarts "
                 "-p Result")
        return StringCommand("{ systemctl --timestamp=us+utc", props, QuoteString(unit), "|| systemctl",
                             props, QuoteString(unit), "; } 2>/dev/null; true")

    @staticmethod
    @override
    def default() -> dict:
        return {"active": None, "enabled": None}

    @override
    def process(self, output: list[str]) -> dict:
        values = dict(line.strip().split("=", 1) for line in output if "=" in line)
        started = (_unit_micros(values.get("ExecMainStartTimestamp"))
                   or _unit_micros(values.get("ActiveEnterTimestamp")))
        return {"active": values.get("ActiveState"), "enabled": values.get("UnitFileState"),
                "stale": values.get("NeedDaemonReload") == "yes", "started": started,
                # auto-restart (between two tries of Restart=), failed, running, ...
                "sub": values.get("SubState"), "restarts": values.get("NRestarts"),
                "result": values.get("Result")}
