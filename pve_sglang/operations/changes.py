"""Whether earlier operations changed something, at prepare time and at execute time alike."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import context, logger
from pyinfra.api.operation import OperationMeta

from pve_sglang.runtime import cache, pyinfra_private
from pve_sglang.runtime.cache import Kind


def operation_name(meta: OperationMeta) -> str:
    """The name an operation was given (``name=``), without the deploy's ``Deploy | `` prefix."""
    op_hash = pyinfra_private.operation_hash(meta)
    names = context.state.get_op_meta(op_hash).names if op_hash else ()
    return ", ".join(sorted(name.rsplit(" | ", 1)[-1] for name in names)) or "an operation"


def restart_reason(restarts: str, changed: list[OperationMeta], planned: bool) -> str:
    """``WHAT will restart because: op A changes, op B changes`` (``restarts because`` and
    ``changed`` once they ran)."""
    verb, change = ("will restart", "changes") if planned else ("restarts", "changed")
    return f"{restarts} {verb} because: " + ", ".join(
        f"{operation_name(meta)} {change}" for meta in changed
    )


def any_changed(*metas: OperationMeta, restarts: str | None = None) -> Callable[[], bool]:
    """A callable for operations that act only after others changed something.

    pyinfra's own ``any_changed`` may only be asked after execution; at prepare time (``--dry``)
    this answers from what each operation plans to do, so the plan shows the restart too.
    RESTARTS names what a yes restarts (``sglang.service``, ``container 105``): the answer is
    then logged once per host with the operations that cause it, in the plan, or at execution
    when the plan skipped change detection (``-y``), so a user about to reload a model sees
    exactly why.
    """

    def check() -> bool:
        planned = not context.state.is_executing
        if planned:
            changed = [meta for meta in metas if meta.will_change]
        else:
            changed = [meta for meta in metas if meta.is_complete() and meta.did_change()]
        if changed and restarts:
            if cache.once(Kind.RESTART_REASON, restarts):
                logger.warning(f"{context.host.name}: {restart_reason(restarts, changed, planned)}")
        return bool(changed)

    return check
