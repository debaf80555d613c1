"""Enable FlashInfer autotune for the ``flashinfer_cutlass`` MoE runner backend.

SGLang runs the FlashInfer autotune step only for the MoE runner backends
named in one list inside ``should_run_flashinfer_autotune`` (or the method
``_should_run_flashinfer_autotune``). From 0.5.7 to 0.5.12.post1 that list
carries ``flashinfer_cutlass`` commented out behind a TODO::

    # TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed.
    # "flashinfer_cutlass",

This module replaces exactly those two lines by one line, at the same
indentation, that carries a marker comment::

    "flashinfer_cutlass",  # pve-sglang: autotune enabled

The marker is how a patched file ("already-patched") is told apart from a
release that lists the backend itself ("upstream-enabled", 0.5.13 onwards).
Any other commented entry in the list (e.g. ``flashinfer_trtllm_routed`` in
0.5.10 to 0.5.12.post1) is left alone.

The list is looked for, by parsing, in whichever candidate file holds it:
``srt/model_executor/runner/flashinfer_autotune.py`` (0.5.15+),
``srt/model_executor/runner/base_runner.py`` (0.5.14) and
``srt/model_executor/model_runner.py`` (0.5.7 to 0.5.13). The version is
only reported, never trusted for the decision: it is the top-level literal
``__version__`` of ``sglang/version.py`` (0.5.6 and older) or else of
``sglang/_version.py`` (0.5.7+, where ``version.py`` only imports it).

Command line (stdlib only; runs as ``python -m pve_sglang.remote.autotune_patch``
or as a plain file, which is how the deploy runs it in the container)::

    autotune_patch.py {--check|--apply} SGLANG_PACKAGE_DIR

It prints exactly one line on stdout:

* ``applied`` (exit 0): ``--apply`` changed the file just now;
* ``already-patched`` (exit 0): the marker line is in place;
* ``upstream-enabled`` (exit 0): the release lists the backend itself;
* ``needs-patch`` (exit 1): ``--check`` on a patchable, unpatched file;
* ``unrecognised: VERSION FILE`` (exit 3): nothing matched as expected,
  FILE is the file looked at or the comma-joined candidates; nothing changed;
* ``failed: VERSION FILE: ERROR`` (exit 4): writing failed; the original
  file is left as it was.

``--apply`` first keeps the unpatched bytes in ``FILE.orig`` (written when
missing, or when a reinstall left a different original behind; never from a
patched file), then writes the patched file atomically (temporary file in the
same directory, same mode, ``os.replace``) and removes the file's stale
``__pycache__/<module>.*.pyc``.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

CANDIDATES: tuple[str, ...] = (
    "srt/model_executor/runner/flashinfer_autotune.py",
    "srt/model_executor/runner/base_runner.py",
    "srt/model_executor/model_runner.py",
)
FUNCTION_NAMES = frozenset({"should_run_flashinfer_autotune", "_should_run_flashinfer_autotune"})
# Every MoE autotune list has held this entry; the 0.5.6 attention-backend list has not.
MOE_ANCHOR = "flashinfer_trtllm"
BACKEND = "flashinfer_cutlass"
MARKER = "# pve-sglang: autotune enabled"
TODO_RE = re.compile(
    r"(?P<indent>[ \t]*)# TODO: flashinfer_cutlass will cause some flashinfer"
    r" compilation errors\. To be fixed\.[ \t]*"
)
PATCHED_RE = re.compile(r'[ \t]*"flashinfer_cutlass",  ' + re.escape(MARKER))

APPLIED = "applied"
ALREADY_PATCHED = "already-patched"
UPSTREAM_ENABLED = "upstream-enabled"
NEEDS_PATCH = "needs-patch"
UNRECOGNISED = "unrecognised"

EXIT_OK = 0
EXIT_NEEDS_PATCH = 1
EXIT_UNRECOGNISED = 3
EXIT_FAILED = 4


# NamedTuples, not dataclasses: ``--check`` runs in every container on every deploy, and
# importing dataclasses (with inspect) was a fifth of its time.
class AutotuneList(NamedTuple):
    """The MoE backend list: 1-based inclusive line span and its string entries."""

    start: int
    end: int
    entries: tuple[str, ...]


class Outcome(NamedTuple):
    """What was found (or done), the file concerned and the version, for the report line."""

    state: str
    version: str
    path: str
    error: str = ""


def split_lines(text: str) -> list[str]:
    """Split text into lines that keep their endings, numbered as ``ast`` numbers them."""
    # str.splitlines also breaks on form feeds and other separators, which ast does not.
    return [line for line in re.split(r"(?<=\n)|(?<=\r)(?!\n)", text) if line]


def read_version(package_dir: Path) -> str:
    """Return the top-level literal ``__version__`` of version.py or _version.py, or ``unknown``."""
    for name in ("version.py", "_version.py"):
        try:
            tree = ast.parse((package_dir / name).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            ):
                return node.value.value
    return "unknown"


# The fields through which statements hold statements (and handlers, match cases).
_STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def autotune_functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Return the (async) function definitions named like the autotune gate, at any depth.

    Only statements hold definitions, so only statements are visited: the expressions,
    most of a model_runner.py's nodes, are not (``ast.walk`` over them was a third of
    ``--check``)."""
    found, pending = [], [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in FUNCTION_NAMES:
            found.append(node)
        for field in _STATEMENT_FIELDS:
            children = getattr(node, field, None)
            if isinstance(children, list):
                pending.extend(children)
    return found


def moe_lists(function: ast.AST) -> list[AutotuneList]:
    """Return the ``x in [...]`` / ``x not in [...]`` string lists holding MOE_ANCHOR."""
    found = []
    for node in ast.walk(function):
        if not (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and isinstance(node.comparators[0], ast.List)
        ):
            continue
        items = node.comparators[0]
        entries = tuple(e.value for e in items.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
        if len(entries) == len(items.elts) and MOE_ANCHOR in entries:
            found.append(AutotuneList(items.lineno, items.end_lineno or items.lineno, entries))
    return found


def find_list(text: str, filename: str) -> tuple[bool, Optional[AutotuneList]]:
    """Return (holds an autotune function, its single MoE list or None if not exactly one)."""
    try:
        tree = ast.parse(text, filename=filename)
    except (SyntaxError, ValueError):
        return False, None
    functions = autotune_functions(tree)
    lists = [found for function in functions for found in moe_lists(function)]
    return bool(functions), lists[0] if len(lists) == 1 else None


def disabled_pair(lines: list[str], span: AutotuneList) -> Optional[int]:
    """Return the 0-based index of the TODO line of the single commented-out pair in the span."""
    hits = []
    for index in range(span.start - 1, span.end - 1):
        todo = TODO_RE.fullmatch(lines[index].rstrip("\r\n"))
        if todo is None:
            continue
        disabled = re.escape(todo.group("indent")) + r'# "flashinfer_cutlass",[ \t]*'
        if re.fullmatch(disabled, lines[index + 1].rstrip("\r\n")):
            hits.append(index)
    return hits[0] if len(hits) == 1 else None


def marker_lines(lines: list[str], span: AutotuneList) -> int:
    """Count the lines in the span that are our patched entry with its marker."""
    return sum(1 for line in lines[span.start - 1 : span.end] if PATCHED_RE.fullmatch(line.rstrip("\r\n")))


def classify(text: str, span: AutotuneList) -> tuple[str, Optional[int]]:
    """Return the state of the list and, for needs-patch, the index of the TODO line."""
    lines = split_lines(text)
    markers = marker_lines(lines, span)
    if BACKEND in span.entries:
        if markers == 1:
            return ALREADY_PATCHED, None
        return (UPSTREAM_ENABLED, None) if markers == 0 else (UNRECOGNISED, None)
    index = disabled_pair(lines, span) if markers == 0 else None
    return (NEEDS_PATCH, index) if index is not None else (UNRECOGNISED, None)


def patched_text(text: str, todo_index: int) -> str:
    """Return the text with the commented pair at todo_index replaced by the marked entry."""
    lines = split_lines(text)
    todo = TODO_RE.fullmatch(lines[todo_index].rstrip("\r\n"))
    assert todo is not None, "todo_index is a line TODO_RE matched"
    indent = todo.group("indent")
    second = lines[todo_index + 1]
    ending = second[len(second.rstrip("\r\n")) :]
    lines[todo_index : todo_index + 2] = [f'{indent}"{BACKEND}",  {MARKER}{ending}']
    return "".join(lines)


def atomic_write(path: Path, data: bytes, like: os.stat_result) -> None:
    """Write data to path through a temporary file in its directory and os.replace."""
    import tempfile  # only a write needs it; --check (every deploy) does not

    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, like.st_mode & 0o7777)
        try:
            os.chown(temp, like.st_uid, like.st_gid)
        except (PermissionError, AttributeError):
            pass  # only root may give files away; the mode is what matters
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def drop_bytecode(path: Path) -> None:
    """Remove the cached bytecode of the module at path."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        try:
            pyc.unlink()
        except FileNotFoundError:
            pass


def write_patch(path: Path, original: bytes, patched: bytes) -> None:
    """Keep the original as path.orig, then atomically replace path by the patched bytes."""
    like = path.stat()
    backup = path.with_name(path.name + ".orig")
    # This runs only on an unpatched file, so a differing .orig is a stale one from an
    # earlier install and the current bytes are the true original now.
    if not backup.exists() or backup.read_bytes() != original:
        atomic_write(backup, original, like)
    atomic_write(path, patched, like)
    drop_bytecode(path)


def locate(package_dir: Path) -> tuple[Optional[Path], Optional[AutotuneList], str]:
    """Return (file, its MoE list) for the one candidate holding it, plus a file name to report."""
    hits = []
    looked_at = []
    for relative in CANDIDATES:
        path = package_dir / relative
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        has_function, span = find_list(text, str(path))
        if has_function:
            looked_at.append(str(path))
        if span is not None:
            hits.append((path, span))
    if len(hits) == 1:
        return hits[0][0], hits[0][1], str(hits[0][0])
    shown = looked_at if looked_at else [str(package_dir / relative) for relative in CANDIDATES]
    return None, None, ",".join(shown)


def run(package_dir: Path, apply: bool) -> Outcome:
    """Check (and with apply, patch) the autotune list under package_dir."""
    version = read_version(package_dir)
    path, span, shown = locate(package_dir)
    if path is None or span is None:
        return Outcome(UNRECOGNISED, version, shown)
    original = path.read_bytes()
    text = original.decode("utf-8")
    state, todo_index = classify(text, span)
    if state != NEEDS_PATCH or not apply or todo_index is None:
        return Outcome(state, version, shown)
    new_text = patched_text(text, todo_index)
    try:
        compile(new_text, shown, "exec", dont_inherit=True)
    except SyntaxError:
        return Outcome(UNRECOGNISED, version, shown)
    _, new_span = find_list(new_text, shown)
    if new_span is None or classify(new_text, new_span)[0] != ALREADY_PATCHED:
        return Outcome(UNRECOGNISED, version, shown)
    try:
        write_patch(path, original, new_text.encode("utf-8"))
    except OSError as error:
        return Outcome("failed", version, shown, str(error))
    return Outcome(APPLIED, version, shown)


def report(outcome: Outcome) -> tuple[str, int]:
    """Return the one output line and the exit status for an outcome."""
    if outcome.state == UNRECOGNISED:
        return f"{UNRECOGNISED}: {outcome.version} {outcome.path}", EXIT_UNRECOGNISED
    if outcome.state == "failed":
        return f"failed: {outcome.version} {outcome.path}: {outcome.error}", EXIT_FAILED
    if outcome.state == NEEDS_PATCH:
        return NEEDS_PATCH, EXIT_NEEDS_PATCH
    return outcome.state, EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the command line, run, print the one report line and return the exit status."""
    parser = argparse.ArgumentParser(description="Enable FlashInfer autotune for flashinfer_cutlass in SGLang.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report only, change nothing")
    mode.add_argument("--apply", action="store_true", help="patch the file if it needs it")
    parser.add_argument("package_dir", metavar="SGLANG_PACKAGE_DIR", type=Path)
    args = parser.parse_args(argv)
    line, status = report(run(args.package_dir, apply=args.apply))
    print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
