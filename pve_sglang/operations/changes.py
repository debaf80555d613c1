"""Whether earlier operations changed something, at prepare time and at execute time alike."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import context
from pyinfra.api.operation import OperationMeta


def any_changed(*metas: OperationMeta) -> Callable[[], bool]:
    """A callable for operations that act only after others changed something.

    pyinfra's own ``any_changed`` may only be asked after execution; at prepare time (``--dry``)
    this answers from what each operation plans to do, so the plan shows the restart too.
    """

    def check() -> bool:
        if context.state.is_executing:
            return any(meta.is_complete() and meta.did_change() for meta in metas)
        return any(meta.will_change for meta in metas)

    return check
