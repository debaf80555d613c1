"""Files and directories a container step manages, read in one command for all of them.

Each read through a container connector costs a process on the host (``pct exec`` over SSH,
``lxc-attach``); ``files.put`` reads three facts per file. The deploy names the paths it
manages up front (``watch``); the first operation that asks reads all of them at once, and an
operation that changes a path forgets it, so the next one reads it again.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from typing import IO
from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, OperationError, operation
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.output import format_text
from pyinfra.api.util import get_file_io, get_file_sha1
from pyinfra.facts.files import FileContents
from pyinfra.operations.util.files import generate_color_diff

from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.operations import container_reads

SECRET_MASK = "<secret>"
_ENV_KEY = re.compile(r"\s*(export\s+)?[A-Za-z_][A-Za-z0-9_]*")


def watch(*paths: str) -> None:
    """Name paths this host's operations will ask about, so one read answers them all."""
    cache.memo(Kind.WATCHED).update(dict.fromkeys(paths))


def state(path: str) -> dict | None:
    """What PATH is now (see ``PathStates``), from one read of every watched path not known."""
    # With the container's other reads when its connector folds them.
    return container_reads.path_state(path)


def forget(path: str) -> None:
    """An operation changed PATH: the next question about it reads it again."""
    cache.changed(path)


def _mode(mode: str) -> str:
    return mode.lstrip("0").rjust(3, "0")


def mask_secret(line: str) -> str:
    """LINE of a secret file as it may be shown: ``KEY=<secret>``; comments and blank lines
    as they are, any other line wholly masked."""
    text = line.rstrip("\r\n")
    if not text.strip() or text.lstrip().startswith("#"):
        return text
    key, sep, _ = text.partition("=")
    return f"{key}={SECRET_MASK}" if sep and _ENV_KEY.fullmatch(key) else SECRET_MASK


def diff_wanted() -> bool:
    """``--diff`` is on, and no diff was shown for this operation yet: at prepare time, or at
    execution when the plan skipped change detection (``-y``), as files.put shows it."""
    if not host.state.config.DIFF:
        return False
    return host.current_op_hash not in cache.memo(Kind.DIFF_SHOWN)


class _Shown(str):
    """A line of a secret file that compares as itself (so the diff is of the real lines and a
    changed value shows as a changed line) but prints masked: pyinfra's diff prints
    ``line.rstrip()``."""

    def rstrip(self, chars: str | None = None) -> str:
        return mask_secret(str(self))


def color_diff(current: list[str], desired: list[str], secret: bool = False) -> Iterator[str]:
    """The unified diff pyinfra's files.put prints (``generate_color_diff``); with SECRET each
    line is printed through ``mask_secret``."""
    if secret:
        current, desired = [_Shown(line) for line in current], [_Shown(line) for line in desired]
    return generate_color_diff(current, desired)


def show_diff(dest: str, current: list[str] | None, desired: list[str] | None,
              secret: bool = False) -> None:
    """Log, once per operation, what writing DEST changes, as files.put does with --diff:
    CURRENT is None for a new file, DESIRED None for binary content."""
    if not cache.once(Kind.DIFF_SHOWN, host.current_op_hash):
        return
    host.log(f"Will {'create' if current is None else 'modify'} {format_text(dest, bold=True)}",
             logger.info)
    if desired is None:
        logger.info("Binary file uploaded")
    else:
        for line in color_diff(current or [], desired, secret):
            logger.info("  %s", line)
    logger.info("")


def _local_lines(src: str | IO) -> list[str] | None:
    try:
        with get_file_io(src, "r") as f:
            return f.readlines()
    except UnicodeDecodeError:
        return None


def _remote_lines(dest: str, secret: bool) -> list[str]:
    """DEST's lines, for the diff. A secret file is read with pyinfra's printing of fact
    output (``-vvv``) off for that one read: its values reach this process, never the log."""
    state = host.state
    printing = getattr(state, "print_fact_output", False)
    if secret:
        state.print_fact_output = False
    try:
        content = host.get_fact(FileContents, path=dest)
    finally:
        if secret:
            state.print_fact_output = printing
    return [line + "\n" for line in content or []]


@operation()
def put(src: str | IO, dest: str, mode: str, secret: bool = False):
    """
    Upload SRC to DEST with MODE when DEST is missing or its content differs, and set MODE when
    only that differs. A new file is created with MODE before its content arrives, so a secret
    is never readable by others, even briefly. DEST is read with the other watched paths
    (``watch``), in one command.

    With ``--diff`` the plan shows the change as ``files.put`` does; DEST is read for it only
    then, and only when it changes.

    + src: a local file path, or a file-like object (``StringIO`` of rendered text)
    + dest: the path in the container; missing directories are created
    + mode: the file's mode, in octal (``"644"``, ``"600"``)
    + secret: the file holds secrets (an env file of tokens): ``--diff`` masks every value, and
      the content read for it is not printed

    **Example:**

    .. code:: python

        from io import StringIO

        from pve_sglang.operations import paths

        paths.put(
            name="Server environment /etc/sglang/sglang.env (secrets, mode 0600)",
            src=StringIO(env_text),  # the rendered env file: HF_TOKEN=..., SGLANG_API_KEY=...
            dest="/etc/sglang/sglang.env",
            mode="600",
            secret=True,
        )
    """
    remote = state(dest)
    if hasattr(src, "seek"):
        src.seek(0)
    same = remote is not None and remote["sha1"] == get_file_sha1(src)
    target = QuoteString(dest)
    if not same and diff_wanted():
        current = None if remote is None else _remote_lines(dest, secret)
        show_diff(dest, current, _local_lines(src), secret)
    elif same and remote is not None and remote["mode"] != _mode(mode) and diff_wanted():
        cache.once(Kind.DIFF_SHOWN, host.current_op_hash)
        logger.info("mode %s", format_text(remote["mode"], "red"))
        logger.info("mode %s", format_text(_mode(mode), "green"))
    if remote is None:
        directory = QuoteString(posixpath.dirname(dest) or "/")
        yield StringCommand("mkdir", "-p", directory, "&&", "install", "-m", QuoteString(mode),
                            "/dev/null", target)
    if not same:
        yield FileUploadCommand(src, dest, remote_temp_filename=host.get_temp_filename(dest))
        yield StringCommand("chmod", QuoteString(mode), target)
    elif remote is not None and remote["mode"] != _mode(mode):  # same: remote is there
        yield StringCommand("chmod", QuoteString(mode), target)
    else:
        host.noop(f"{dest} is up to date")
        return
    forget(dest)


@operation()
def directory(path: str, mode: str):
    """
    A directory at PATH with MODE (parents created as needed); a file already at PATH that is
    not a directory stops the deploy.

    + path: the directory in the container
    + mode: its mode, in octal (``"755"``, ``"700"``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import paths

        paths.directory(name="Secrets directory", path="/etc/sglang", mode="700")
    """
    current = state(path)
    target = QuoteString(path)
    if current is None:
        yield StringCommand("mkdir", "-p", target, "&&", "chmod", QuoteString(mode), target)
    elif current["type"] != "dir":
        raise OperationError(f"{path} exists and is not a directory")
    elif current["mode"] != _mode(mode):
        yield StringCommand("chmod", QuoteString(mode), target)
    else:
        host.noop(f"{path} exists")
        return
    forget(path)
