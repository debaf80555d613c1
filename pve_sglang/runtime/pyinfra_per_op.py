"""pyinfra's work per operation call, made cheaper with the same results (``install``).

Each operation call of a CLI run costs pyinfra CPU in two places that give the same answer
every time, and on a no-op run of many containers they are most of pyinfra's own work per
container:

- The operation's order and name come from the line numbers of the calls on the stack
  (``pyinfra.api.util.get_operation_order_from_stack``), read with ``inspect.stack()`` and
  ``inspect.getframeinfo(frame)``, whose default ``context=1`` also finds and reads each
  frame's source line (``inspect.findsource``, ``getmodule``): about 3 ms per operation.
  pyinfra reads only ``filename`` and ``lineno`` from them (there and in
  ``get_call_location``), which ``context=0`` gives the same. ``functools.partial`` adds no
  Python frame: the frames pyinfra counts (``get_caller_frameinfo``'s shift) stay the same.
- Its global arguments are popped by ``pop_global_arguments``, which asks
  ``all_global_arguments()`` for the type hints of ``AllArguments`` (``typing.get_type_hints``)
  at every call: a class that does not change while pyinfra runs, so they are read once.
"""

from __future__ import annotations

import inspect
from functools import partial

from pve_sglang.runtime import pyinfra_private

#: The stack readers pyinfra's ``util`` module imported, and the same without source context.
ORIGINAL_READERS = (inspect.stack, inspect.getframeinfo)
WITHOUT_CONTEXT = (partial(inspect.stack, 0), partial(inspect.getframeinfo, context=0))
#: pyinfra's own ``all_global_arguments``.
ORIGINAL_ARGUMENTS = pyinfra_private.global_arguments_reader()


def use_readers(readers: tuple) -> None:
    """Make ``pyinfra.api.util`` read the stack with READERS (``(stack, getframeinfo)``)."""
    pyinfra_private.use_stack_readers(readers)


def _arguments_read_once():
    hints = ORIGINAL_ARGUMENTS()

    def all_global_arguments() -> list[tuple[str, type]]:
        """Return all global arguments and their types (read once: ``pyinfra_per_op``)."""
        return list(hints)

    return all_global_arguments


def install() -> None:
    """Make both cheaper for this pyinfra process (again: no change; the deploy file runs
    once per host)."""
    use_readers(WITHOUT_CONTEXT)
    if pyinfra_private.global_arguments_reader() is ORIGINAL_ARGUMENTS:
        pyinfra_private.use_global_arguments_reader(_arguments_read_once())


def uninstall() -> None:
    """pyinfra's own readers and arguments again (the tests compare both)."""
    use_readers(ORIGINAL_READERS)
    pyinfra_private.use_global_arguments_reader(ORIGINAL_ARGUMENTS)
