"""pyinfra's operation order, read from the call stack without reading source lines.

In CLI mode pyinfra orders (and names) each operation call by the line numbers of the calls
on the stack (``pyinfra.api.util.get_operation_order_from_stack``). It reads them with
``inspect.stack()`` and ``inspect.getframeinfo(frame)``, whose default ``context=1`` also
finds and reads each frame's source line (``inspect.findsource``, ``getmodule``): about 3 ms
of CPU per operation, the largest part of pyinfra's own work per container on a no-op run.
pyinfra reads only ``filename`` and ``lineno`` from them (here and in ``get_call_location``),
which ``context=0`` gives the same, so ``install`` makes the two names of ``pyinfra.api.util``
ask for no context. ``functools.partial`` adds no Python frame: the frames pyinfra counts
(and ``get_caller_frameinfo``'s frame shift) stay the same.
"""

from __future__ import annotations

import inspect
from functools import partial

from pyinfra.api import util

#: The stack readers pyinfra's ``util`` module imported, kept for the tests' comparison.
ORIGINAL = (inspect.stack, inspect.getframeinfo)
#: The same readers without source context.
WITHOUT_CONTEXT = (partial(inspect.stack, 0), partial(inspect.getframeinfo, context=0))


def use(readers: tuple) -> None:
    """Make ``pyinfra.api.util`` read the stack with READERS (``(stack, getframeinfo)``)."""
    util.stack, util.getframeinfo = readers


def install() -> None:
    """Read pyinfra's operation order without source lines (idempotent: the deploy file runs
    once per host)."""
    use(WITHOUT_CONTEXT)
