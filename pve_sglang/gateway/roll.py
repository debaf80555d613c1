"""A roll: the replicas behind one gateway restarted in turn, not at once (issue 51).

Each replica whose server a run restarts is taken out of the gateway's rotation (the others
healthy in the gateway's view first: never the last one), drained, restarted, judged as the
verify phase judges it, and only then given its traffic back; ``gateway_roll_batch`` replicas at
a time. A replica that fails its judgement stops the roll: the replicas after it are not
restarted. The decisions and their words, pure; the execution is ``operations/roll.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

#: The worker script's exit codes (``remote/gateway_workers.py``) a turn tells apart.
EXIT_USAGE, EXIT_GATEWAY, EXIT_NOT_UP, EXIT_CAPACITY = 2, 3, 4, 5


def batches(names: list[str], size: int) -> list[list[str]]:
    """NAMES in turns of SIZE (the last one may be smaller), in their order."""
    if size < 1:
        raise ValueError(f"a roll's batch is at least 1, not {size}")
    return [names[i:i + size] for i in range(0, len(names), size)]


def places(replicas: int, batch: int) -> int:
    """How many of a gateway's REPLICAS restart at once: BATCH (``gateway_roll_batch``), but
    never all of them, so that one always serves; 1 for a lone replica (its restart is plain)."""
    return max(1, min(batch, replicas - 1))


@dataclass(frozen=True)
class Plan:
    """What a run does with the restarts of one gateway's replicas: ``roll`` (TURNS, one after
    the other), ``plain`` (restarted at once, as without a gateway: WHY says why) or ``none``
    (no replica restarts)."""

    how: str
    turns: list[list[str]]
    why: str = ""


def plan(names: list[str], restarting: set[str], batch: int, serving: bool = True) -> Plan:
    """The order of the restarts of a gateway's replicas NAMES (in the inventory's order) that
    a run restarts (RESTARTING), BATCH at a time (``places``). SERVING: whether the gateway
    answers (no: its first deploy, nothing to take a replica out of: restarted as before)."""
    due = [name for name in names if name in restarting]
    if not due:
        return Plan("none", [])
    if len(names) < 2:
        return Plan("plain", [due], "its only replica: no other serves meanwhile")
    if not serving:
        return Plan("plain", [due], "the gateway does not serve yet (its first deploy)")
    return Plan("roll", batches(due, places(len(names), batch)))


def may_go(name: str, names: list[str], due: set[str], running: set[str], done: set[str],
            at_once: int) -> bool:
    """Whether replica NAME's turn begins now: fewer than AT_ONCE turns run, and every replica
    before it in NAMES that restarts too (DUE) has begun (RUNNING) or ended (DONE): the turns
    go in the inventory's order, whatever order their hosts reach their restart in."""
    ahead = [n for n in names[:names.index(name)] if n in due]
    return len(running) < at_once and all(n in running or n in done for n in ahead)


def order_words(gateway: str, names: list[str], size: int) -> str:
    """The roll's order in words, for the plan (``--dry``): every replica named, as each would
    go if the run restarts it (those it does not restart keep serving)."""
    if len(names) < 2:
        return (f"{gateway}: {names[0] if names else 'no replica'} is its only replica: a "
                "restart is plain (no other to serve meanwhile)")
    size = places(len(names), size)
    turns = "; ".join(f"{n}. {', '.join(turn)}" for n, turn in
                      enumerate(batches(names, size), start=1))
    return (f"{gateway}: a restart rolls over its {len(names)} replicas, {size} at a time, "
            f"in this order: {turns}")


def step_words(gateway: str, drain_s: int) -> str:
    """What a replica's turn does, in words (its step in the plan)."""
    return (f"in turn behind {gateway}: out of its rotation once the others are healthy in its "
            f"view, drained (up to {drain_s}s), restarted, judged (startup watch, a generation "
            "asked as the gateway asks it), given its traffic back")


def out_refusal(code: int) -> str | None:
    """What the worker script's exit CODE of ``out`` means for the turn: None (out, go on),
    ``plain`` (the gateway does not serve yet, or its script is not there: a first deploy,
    restarted as before), ``capacity`` (the others cannot serve without it: not restarted)."""
    if code == 0:
        return None
    if code == EXIT_CAPACITY:
        return "capacity"
    return "plain"


@dataclass
class Turn:
    """One replica's turn, as the output names it."""

    name: str
    drain_s: float | None = None
    cut: int | None = None
    restart_s: float | None = None
    verdict: str = "not reached"
    out_s: float | None = None


@dataclass
class Roll:
    """The roll of one gateway's replicas in this run: who stopped it, and each turn."""

    gateway: str
    names: list[str]
    stopped_at: str | None = None
    turns: dict[str, Turn] = field(default_factory=dict)

    def turn(self, name: str) -> Turn:
        return self.turns.setdefault(name, Turn(name))


def turn_line(turn: Turn) -> str:
    """A replica's turn in one line: its drain time, restart time and verdict."""
    drain = ("drain -" if turn.drain_s is None else f"drained in {turn.drain_s:.1f}s"
             + (f" (out of the rotation in {turn.out_s:.1f}s)" if turn.out_s is not None
                else "")
             + (f" ({turn.cut} request{'s' if turn.cut != 1 else ''} in flight cut)"
                if turn.cut else ""))
    restart = "restart -" if turn.restart_s is None else \
        f"restarted and judged in {turn.restart_s:.1f}s"
    return f"{turn.name}: {drain}, {restart}, {turn.verdict}"


def after_a_stop(name: str, policy: str, stopped_at: str | None, verdict: str | None,
                 target: Callable[[], str | None]) -> tuple[str, str, str | None]:
    """What replica NAME does once its gateway's roll stopped at STOPPED_AT: its turn's VERDICT
    in this run (None: no turn), POLICY ``gateway_roll_failure``, TARGET the release it could go
    back to (an upgrade's previous stack; asked only where it would go back).
    (``none``|``keep``|``back``, the words, the release it goes back to)."""
    if not stopped_at or stopped_at == name:
        return "none", "no roll stopped at another replica", None
    if verdict is None or not verdict.startswith("serving"):
        return "none", (f"not changed by this run: it serves what it ran (the roll stopped at "
                        f"{stopped_at})"), None
    if policy != "back":
        return "keep", (f"keeps the change of this run though the roll stopped at {stopped_at} "
                        "(gateway_roll_failure is keep)"), None
    back_to = target()
    if back_to is None:
        return "keep", (f"keeps the change of this run though the roll stopped at {stopped_at} "
                        "(it keeps no earlier set to go back to: only an upgrade does)"), None
    return "back", f"goes back to {back_to}: the roll stopped at {stopped_at}", back_to
