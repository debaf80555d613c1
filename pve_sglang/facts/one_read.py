"""One read of what a converged container run checks: each part the command of its own fact.

A read through a container connector costs a process on the host and one in the container
(``lxc-attach``, ``pct exec`` over SSH). ``ContainerState`` runs the commands of several facts
(``PARTS``) in one shell, each in its own subshell and section, and hands each section to its
own fact's ``process``: the values are the ones the facts give read one by one, the checks made
on them the same. ``operations/container_reads.py`` decides what one read asks for.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, ClassVar

from pyinfra.api import FactBase, OperationError, StringCommand
from pyinfra.api.exceptions import MissingCommandError
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Hostname
from typing_extensions import override

from pve_sglang.facts.container import PathStates, SglangVenv, UnitState, UvVersion
from pve_sglang.facts.installed_stacks import Stacks
from pve_sglang.runtime.pyinfra_private import MISSING_COMMAND_MARKER

class ReadPart(str, Enum):
    """A part of one read (a container's, ``Part``; a plain LXC host's, ``lxc_host.HostPart``):
    its value is the name it had as a string, so a part given by that name is the same part,
    and it shows as that name."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        # As the name was shown before it was a type: pyinfra's debug lines of the one read.
        return repr(self.value)


class Part(ReadPart):
    """What a container's one read can hold: each the value of one fact (``PARTS``)."""

    PATHS = "paths"
    VENV = "venv"
    DEBS = "debs"
    UV = "uv"
    UNIT = "unit"
    HOSTNAME = "hostname"
    STACKS = "stacks"


#: The parts one read can hold: kind -> (fact, the names of its arguments, in order).
PARTS: dict[Part, tuple[type[FactBase], tuple[str, ...]]] = {
    Part.PATHS: (PathStates, ("paths",)),
    Part.VENV: (SglangVenv, ("python", "tools")),
    Part.DEBS: (DebPackages, ()),
    Part.UV: (UvVersion, ("uv",)),
    Part.UNIT: (UnitState, ("unit",)),
    Part.HOSTNAME: (Hostname, ()),
    Part.STACKS: (Stacks, ("venv_path", "lock_file", "state")),
}

# The section lines: a part's own output never starts with this (nothing it prints does).
_MARK = "--pve-sglang-part"
_END = re.compile(rf"^{_MARK}-end (\d+) (\d+)$")
_START = re.compile(rf"^{_MARK} (\d+)$")


class PartFailed:
    """A part whose command exited with RC (its fact would have failed the host)."""

    def __init__(self, rc: int, lines: list[str]):
        self.rc, self.lines = rc, lines

    def __repr__(self) -> str:
        return f"PartFailed(rc={self.rc}, {self.lines[-3:]!r})"


class PartMissingCommand:
    """A part whose fact needs a command the container lacks (pyinfra's ``requires_command``)."""

    def __init__(self, command: str):
        self.command = command


def checked(kind: Enum, args: tuple, value, where: str = "in the container"):
    """VALUE of part KIND for ARGS, or the error its read ended with (a missing command, a
    failed part), raised as pyinfra raises it for a fact read alone."""
    if isinstance(value, PartMissingCommand):
        raise MissingCommandError(value.command)
    if isinstance(value, PartFailed):
        raise OperationError(f"could not read {kind} {args or ''} {where} "
                             f"(exit status {value.rc}): {' '.join(value.lines[-3:])}")
    return value


def part_command(kind: Enum, args: tuple, table: dict = PARTS) -> StringCommand | str:
    """The command of part KIND's fact (in TABLE) for ARGS, guarded as pyinfra guards it when
    the fact requires a command (``_get_fact``)."""
    fact = table[kind][0]()
    command = fact.command(*args)
    required = fact.requires_command(*args)
    if not required:
        return command
    return StringCommand("if command -v", required, ">/dev/null 2>&1; then (", command,
                         "); else echo", f"'{MISSING_COMMAND_MARKER}';", "fi")


class ContainerState(FactBase[dict]):
    """
    Returns each part's section of output, ``{index: (lines, exit status)}``, for PARTS
    (``((kind, args), ...)``, kinds of ``PARTS``) read in one command; ``part_values`` turns
    them into the values of the parts' own facts.
    """

    #: The kinds its parts may be (a subclass reads other facts in one command, keyed by its
    #: own Enum).
    PARTS: ClassVar[dict[Any, tuple[type[FactBase], tuple[str, ...]]]] = PARTS

    @override
    def command(self, parts: tuple) -> StringCommand:
        pieces: list = []
        for i, (kind, args) in enumerate(parts):
            # A subshell each: a part's own `exit` (SglangVenv's) ends only its part; the end
            # line starts on a line of its own even when the part's output has no newline.
            pieces += [f"echo '{_MARK} {i}'; (", part_command(kind, args, self.PARTS),
                       f"); printf '\\n{_MARK}-end {i} %s\\n' $?;"]
        return StringCommand(*pieces)

    @staticmethod
    @override
    def default() -> dict:
        return {}

    @override
    def process(self, output: list[str]) -> dict:
        # pyinfra's process gets no arguments: the parts come back by their order.
        sections: dict[int, list[str]] = {}
        ends: dict[int, int] = {}
        current: int | None = None
        for line in output:
            start, end = _START.match(line), _END.match(line)
            if start:
                current = int(start.group(1))
                sections[current] = []
            elif end:
                ends[int(end.group(1))] = int(end.group(2))
                current = None
            elif current is not None:
                sections[current].append(line)
        return {i: (lines, ends.get(i)) for i, lines in sections.items()}


def part_values(parts: tuple, raw: dict, table: dict = PARTS) -> dict:
    """``{(kind, args): value}`` of PARTS (kinds of TABLE) from ``ContainerState``'s output
    RAW: each section as its own fact would have processed it read alone."""
    values: dict[tuple, Any] = {}
    for i, (kind, args) in enumerate(parts):
        lines, rc = raw.get(i, ([], None))
        # The end line's own newline: one empty line when the output ended with a newline
        # (pyinfra keeps a file's own empty last lines: so does this).
        if lines and lines[-1] == "":
            lines = lines[:-1]
        fact = table[kind][0]()
        fact.command(*args)  # as pyinfra does: a fact may keep what its command was (FileContents)
        if rc is None or rc != 0:
            values[(kind, args)] = PartFailed(-1 if rc is None else rc, lines)
        elif lines == [MISSING_COMMAND_MARKER]:
            values[(kind, args)] = PartMissingCommand(str(fact.requires_command(*args)))
        else:
            values[(kind, args)] = fact.process(lines) if lines else fact.default()
    return values
