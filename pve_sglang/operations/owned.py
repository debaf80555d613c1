"""The lines of a config file that the deploy owns, kept equal to what settings say."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.facts.files import FileContents

from ..config_lines import reconcile_lines
from .paths import diff_wanted, show_diff


@operation()
def lines(path: str, lines: list[str], owned: Callable[[str], bool]):
    """
    Keep the lines of PATH that ``owned`` recognises equal to LINES, leaving every other line
    where it is (container configs the user edits too: ``/etc/pve/lxc/VMID.conf``, raw LXC).
    The file is replaced whole (pmxcfs takes a write, not an edit); ``--diff`` shows the
    change from the content already read, at no extra command.
    """
    content = host.get_fact(FileContents, path=path)
    text = "\n".join(content or []) + ("\n" if content else "")
    new = reconcile_lines(text, lines, owned)
    if new == text:
        host.noop(f"{path}: owned lines are up to date")
        return
    if diff_wanted():
        current = None if content is None else [line + "\n" for line in content]
        show_diff(path, current, new.splitlines(keepends=True))
    if content is None:
        yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(path) or "/"))
    yield FileUploadCommand(StringIO(new), path, remote_temp_filename=host.get_temp_filename(path))
