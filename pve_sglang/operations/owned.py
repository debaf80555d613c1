"""The lines of a config file that the deploy owns, kept equal to what settings say."""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import FileContents
from pyinfra.operations import files

from ..config_lines import reconcile_lines


@operation()
def lines(path: str, lines: list[str], owned: Callable[[str], bool]):
    """
    Keep the lines of PATH that ``owned`` recognises equal to LINES, leaving every other line
    where it is (container configs the user edits too: ``/etc/pve/lxc/VMID.conf``, raw LXC).
    """
    content = host.get_fact(FileContents, path=path)
    text = "\n".join(content or []) + ("\n" if content else "")
    new = reconcile_lines(text, lines, owned)
    if new == text:
        host.noop(f"{path}: owned lines are up to date")
        return
    yield from files.put._inner(src=StringIO(new), dest=path)
