"""Every name of pyinfra's that is not its public API, in one place, for one pyinfra version.

pyinfra may rename or change what it keeps private in any release, silently: a replaced module
global that pyinfra no longer calls is a no-op, a private constant that moved an ImportError
far from its cause. So the project uses them only through this module, which was read against
pyinfra ``SUPPORTED`` (the version pyproject.toml pins) and refuses any other on import, with an
error naming both versions: a new pyinfra means reading each use below against its source
again (``tests/unit/test_pyinfra_private.py`` proves the speed patch still reaches what pyinfra
calls), then moving ``SUPPORTED`` and the pin together.

Each name is a thin typed function or a constant with why the project needs it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: The pyinfra release every use below was read against (pyproject.toml pins the same).
SUPPORTED = "3.10.0"


class UnsupportedPyinfraVersion(RuntimeError):
    """The installed pyinfra is not the one this module's private uses were read against."""


def installed_version() -> str | None:
    """The version of the installed pyinfra distribution (None: no distribution metadata)."""
    try:
        return importlib.metadata.version("pyinfra")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version(installed: str | None) -> None:
    """Raise ``UnsupportedPyinfraVersion`` unless INSTALLED is ``SUPPORTED``."""
    if installed == SUPPORTED:
        return
    found = f"pyinfra {installed} is installed" if installed else "no installed pyinfra was found"
    raise UnsupportedPyinfraVersion(
        f"pve-sglang supports pyinfra {SUPPORTED} only, and {found}: pve-sglang uses parts of "
        f"pyinfra that are not its public API (pve_sglang/runtime/pyinfra_private.py), read "
        f"against {SUPPORTED}, which another release may change. Install the supported one: "
        f"pip install 'pyinfra=={SUPPORTED}'"
    )


# Before the private names are imported: another release fails here, with both versions named.
check_version(installed_version())

from pyinfra.api import arguments, util  # noqa: E402
from pyinfra.api.command import StringCommand  # noqa: E402
from pyinfra.api.facts import _MISSING_COMMAND_MARKER  # noqa: E402
from pyinfra.api.operation import OperationMeta  # noqa: E402

#: The line pyinfra's fact reader prints instead of a fact's output when the command the fact
#: requires is missing (``pyinfra.api.facts._get_fact``, then ``MissingCommandError``).
#: ``ContainerState`` guards each of its parts the same way, so a part read in one command
#: fails as that fact read alone would.
MISSING_COMMAND_MARKER: str = _MISSING_COMMAND_MARKER


def joined(*bits: Any) -> StringCommand:
    """A ``StringCommand`` of BITS joined with no space (``VAR=`` and a quoted value, ``"$(``
    and a command): its ``_separator`` keyword, which pyinfra itself uses to join a quoted
    token's pieces."""
    return StringCommand(*bits, _separator="")


def operation_hash(meta: OperationMeta) -> str | None:
    """The hash of the operation META answers for (``OperationMeta._hash``), by which
    ``State.get_op_meta`` gives its names: a restart's reason names the operations that cause
    it. None for an object that has none."""
    return getattr(meta, "_hash", None)


def operation_commands(meta: OperationMeta) -> list | None:
    """The commands an executed operation ran (``OperationMeta._commands``; None before it ran):
    a test reads exactly what was sent."""
    return meta._commands


def operation_function(op: Any) -> Callable | None:
    """The generator function an ``@operation`` wraps (``_inner``: pyinfra's own advice for
    calling one inside another), None for anything that is not an operation: the tests list an
    operation's commands without a host, and check its docs against its parameters."""
    return getattr(op, "_inner", None)


def cli_override_data(data: Any, ssh_user: Any, ssh_key: Any, ssh_key_password: Any,
                      ssh_port: Any, ssh_password: Any) -> dict[str, Any]:
    """The data pyinfra's CLI gives every host over the inventory, from its options (``--data``,
    ``--user``, ...), computed by the CLI's own ``_set_override_data``: the hosts file checks
    exactly the values pyinfra will use, which the CLI does not pass to an inventory."""
    # Imported here: importing pyinfra_cli patches the standard library for gevent.
    from pyinfra_cli.cli import _set_override_data

    return _set_override_data(data, ssh_user, ssh_key, ssh_key_password, ssh_port, ssh_password)


def stack_readers() -> tuple[Callable, Callable]:
    """What ``pyinfra.api.util`` reads the call stack with (``(stack, getframeinfo)``, names
    it imports from ``inspect``): ``get_operation_order_from_stack`` and
    ``get_caller_frameinfo`` call them at every operation call (``pyinfra_per_op``)."""
    return util.stack, util.getframeinfo


def use_stack_readers(readers: tuple[Callable, Callable]) -> None:
    """Make ``pyinfra.api.util`` read the call stack with READERS (``(stack, getframeinfo)``)."""
    util.stack, util.getframeinfo = readers


def global_arguments_reader() -> Callable[[], list[tuple[str, type]]]:
    """What ``pyinfra.api.arguments.pop_global_arguments`` lists the global arguments with, at
    every operation call (its module's ``all_global_arguments``, looked up when called)."""
    return arguments.all_global_arguments


def use_global_arguments_reader(reader: Callable[[], list[tuple[str, type]]]) -> None:
    """Make ``pop_global_arguments`` list the global arguments with READER."""
    arguments.all_global_arguments = reader


def fact_read_hook() -> tuple[ModuleType, str]:
    """Where pyinfra reads every fact of a host: ``(module, name)`` of ``_get_fact(state, host,
    cls, args, kwargs, ...)``; the deploy cost driver wraps it to name the fact a command
    reads."""
    from pyinfra.api import facts

    return facts, "_get_fact"


def host_operation_hook() -> tuple[ModuleType, str]:
    """Where pyinfra runs one operation on one host: ``(module, name)`` of
    ``_run_host_op(state, host, op_hash)``; the deploy cost driver wraps it to name the
    operation a command belongs to."""
    from pyinfra.api import operations

    return operations, "_run_host_op"


def local_process_hook() -> tuple[ModuleType, str]:
    """What ``LocalConnector`` runs every command with: ``(module, name)`` of the
    ``run_local_process`` it looks up in its own module when called; the deploy cost driver
    replaces it there to record each command sent."""
    from pyinfra.connectors import local

    return local, "run_local_process"
