"""A replica's turn in a roll behind its gateway, at execution (``gateway/roll.py`` decides and
words it).

pyinfra runs an operation on every host at once: the server's restart
(``systemd_unit.service_running``) is one operation on every replica. A turn is the function
that restart runs instead of its two commands. Each replica's operation tells the roll whether
it restarts (``decided``); a turn waits until the replicas of the run decided, then for its
place in the inventory's order (``gateway.roll.may_go``: ``gateway_roll_batch`` at once), asks
the gateway's container (the worker script's ``out``) to take it out once the others serve,
runs the restart, judges it (the startup watch and the gateway's own generation check of it),
and gives it back (``in``), all in one function so that a failure at any point ends its turn.

A replica that fails its judgement is left out of the rotation and the roll stops there; its
turn does not fail the operation: the verify phase judges it as today (and rolls an upgrade
back), and the gateway phase's sync registers it again. The replicas after it are not restarted
(their operation fails, naming the replica that stopped the roll): they keep serving the
release they ran, and the next run restarts them, in turn (their restart is pending).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gevent
from gevent.lock import BoundedSemaphore
from pyinfra import host as pyinfra_host
from pyinfra import logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.context import state as pyinfra_state

from pve_sglang.gateway.render import TurnArgv
from pve_sglang.gateway.roll import (Roll, Turn, after_a_stop, may_go, out_refusal, places,
                                     turn_line)

#: Seconds the first turn waits for the other replicas of the run to decide whether they
#: restart (each decides in its own operation, at about the same time): one that never does (its
#: container is not in the run) delays the roll this long, once.
SETTLE_S = 10.0
#: Seconds between two looks at the turns before this one.
POLL_S = 0.1


@dataclass
class _Run:
    """A roll in this run: its record, how many turns at once, each replica's decision
    (restarts or not), the turns begun and ended."""

    roll: Roll
    at_once: int
    decided: dict[str, bool] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    mend: BoundedSemaphore = field(default_factory=lambda: BoundedSemaphore(1))
    mended: bool = False
    #: Each replica's turn argv, as its turn registered it (the back-roll asks them again).
    argv: dict[str, TurnArgv] = field(default_factory=dict)
    #: One replica goes back at a time (``back_with_the_roll``); the one that stopped the roll
    #: is given back first, once.
    back: BoundedSemaphore = field(default_factory=lambda: BoundedSemaphore(1))
    stopper_back: bool = False
    #: When a replica last decided, or a turn began or ended.
    moved: float = field(default_factory=time.monotonic)


#: This run's rolls, by gateway.
_ROLLS: dict[str, _Run] = {}


def run_of(gateway: str, names: list[str], batch: int) -> _Run:
    """The roll of GATEWAY's replicas NAMES in this run, made by the first replica to ask:
    ``places(len(names), batch)`` of them restart at once (never all)."""
    if gateway not in _ROLLS:
        _ROLLS[gateway] = _Run(Roll(gateway, list(names)), places(len(names), batch))
    return _ROLLS[gateway]


def _wait_for_turn(state, run: _Run, name: str) -> None:
    """Until NAME's turn may begin (``may_go``), once every replica of the run in this roll
    decided whether it restarts (up to ``SETTLE_S``). A replica before it that said it restarts
    but left the run, or whose turn does not begin within ``SETTLE_S`` of the roll's last move
    (its operation failed before it), holds it back no longer: the order yields, the number at
    once does not."""
    names = run.roll.names

    def active(n: str) -> bool:
        return state.inventory.get_host(n, None) in state.active_hosts

    settle = time.monotonic() + SETTLE_S
    while any(n not in run.decided for n in names if active(n)) and time.monotonic() < settle:
        gevent.sleep(POLL_S)
    while True:
        due = {n for n, restarts in run.decided.items() if restarts and active(n)} | {name}
        if may_go(name, names, due, run.running, run.done, run.at_once):
            return
        if len(run.running) < run.at_once and time.monotonic() - run.moved > SETTLE_S:
            return
        gevent.sleep(POLL_S)


def worker_script(gateway_host, argv: list[str]) -> tuple[int, dict]:
    """The worker script's ARGV in the gateway's container: its exit code and its JSON line
    (an exit code of 2 where the container could not be asked)."""
    command = StringCommand(*(QuoteString(arg) for arg in argv), "; echo exit=$?")
    try:
        _, output = gateway_host.run_shell_command(command)
    except Exception as error:  # a gateway container the run cannot reach: no roll
        return 2, {"error": f"{type(error).__name__}: {error}"}
    lines = [line for line in output.stdout_lines if line.strip()]
    code = int(lines[-1].removeprefix("exit=")) if lines and lines[-1].startswith("exit=") else 2
    try:
        answer = json.loads(lines[-2]) if len(lines) > 1 else {}
    except ValueError:
        answer = {"error": lines[-2][:300]}
    return code, answer if isinstance(answer, dict) else {}


def take_out(gateway_host, argv: TurnArgv, this: Turn) -> tuple[str | None, str]:
    """THIS replica out of the gateway's rotation, drained (the worker script's ``out``):
    (None, "") where it is out (THIS's drain, cut and out times set), else ``out_refusal``'s
    word and why the script refused."""
    code, out = worker_script(gateway_host, argv.out)
    refusal = out_refusal(code)
    if refusal is not None:
        return refusal, str(out.get("error") or f"exit {code}")
    this.drain_s, this.cut = float(out.get("drain_s") or 0), int(out.get("cut") or 0)
    this.out_s = float(out["out_s"]) if isinstance(out.get("out_s"), (int, float)) else None
    return None, ""


def back_if_it_answers(gateway_host, argv: TurnArgv, this: Turn) -> str | None:
    """THIS replica given its traffic back once a generation asked as the gateway asks it
    answers (``give_back``); None where it is back, else why it stays out."""
    try:
        asked_as_the_gateway_asks(gateway_host, argv)
    except OperationError as failure:
        return str(failure)
    give_back(gateway_host, argv, this)
    return None


def asked_as_the_gateway_asks(gateway_host, argv: TurnArgv) -> None:
    """A generation of the replica asked from the gateway's container as the gateway asks it
    (the worker script's ``check``); raises ``OperationError`` naming why it failed."""
    code, answer = worker_script(gateway_host, argv.check)
    asked = (answer.get("workers") or [{}])[0]
    if code or not asked.get("ok"):
        raise OperationError("a generation asked as the gateway asks it: "
                             f"{asked.get('why') or answer.get('error')}")


def give_back(gateway_host, argv: TurnArgv, this: Turn) -> bool:
    """THIS replica given its traffic back (the worker script's ``in``, which returns once the
    gateway lists it healthy); its verdict says how."""
    code, back = worker_script(gateway_host, argv.back)
    if code:
        this.verdict = (f"serving, but not given back: {back.get('error')} (the gateway "
                        "phase registers it again)")
        return False
    this.verdict = f"serving, given back (listed healthy in {back.get('listed_s')}s)"
    return True


def _mended(state, run: _Run, sync_argv: list[str]) -> None:
    """Once per roll, before its first turn: the replicas an earlier run left out of the
    rotation (killed between a turn's out and its in) given back by the worker script's
    ``sync`` of the list the gateway holds, so that no turn counts without them."""
    with run.mend:
        if run.mended:
            return
        run.mended = True
        _, answer = worker_script(state.inventory.get_host(run.roll.gateway), sync_argv)
        added = answer.get("added") or []
        if added:
            logger.warning(f"{run.roll.gateway}: given back first, left out of its rotation by "
                           f"an earlier run: {', '.join(str(a) for a in added)}")


@dataclass(frozen=True)
class InTurn:
    """The function replica NAME's restart runs (``service_running``'s TURN): its turn in the
    roll of GATEWAY's replicas NAMES, BATCH at a time. ARGV: the worker script's ``out``,
    ``in`` and ``check`` of it; JUDGE: follows its start (raises ``OperationError`` when it
    does not serve); WORDS: the turn's step, for the plan; SYNC_ARGV: the worker script's
    ``sync`` (``--not-up-ok``), run once before the roll's first turn."""

    gateway: str
    names: list[str]
    batch: int
    name: str
    argv: TurnArgv
    judge: Callable[[], None]
    words: str = "in its turn"
    sync_argv: list[str] | None = None

    def decided(self, restarts: bool) -> None:
        """The replica's operation tells the roll whether it restarts, so that the turns go
        in order."""
        run = run_of(self.gateway, self.names, self.batch)
        run.decided[self.name], run.moved = restarts, time.monotonic()

    def __call__(self, state, host, commands: list[StringCommand]) -> bool:
        run = run_of(self.gateway, self.names, self.batch)
        run.decided[self.name] = True
        run.argv[self.name] = self.argv
        _wait_for_turn(state, run, self.name)
        if self.sync_argv:
            _mended(state, run, self.sync_argv)
        run.running.add(self.name)
        run.moved = time.monotonic()
        try:
            return _one_turn(state, host, run.roll.turn(self.name), run.roll, commands,
                             self.argv, self.judge)
        finally:
            run.running.discard(self.name)
            run.done.add(self.name)
            run.moved = time.monotonic()


def _one_turn(state, host, this: Turn, roll: Roll, commands: list[StringCommand],
              argv: TurnArgv, judge: Callable[[], None]) -> bool:
    """THIS replica's turn: out, restarted (COMMANDS), judged, in; False where it was not
    restarted (the roll stopped before it, or the others cannot serve without it)."""
    if roll.stopped_at:
        this.verdict = (f"not restarted: the roll stopped at {roll.stopped_at}; it serves the "
                        "release it ran, until a run restarts it in turn")
        logger.error(turn_line(this))
        return False
    gateway_host = state.inventory.get_host(roll.gateway)
    refusal, why = take_out(gateway_host, argv, this)
    if refusal == "capacity":
        roll.stopped_at = this.name
        this.verdict = f"not restarted: {why}"
        logger.error(turn_line(this))
        return False
    if refusal is not None:
        logger.warning(f"{host.name}: the gateway {roll.gateway} did not take it out ({why}): "
                       "restarted as without a gateway (its first deploy)")
    start = time.monotonic()
    for command in commands:
        ok, output = host.run_shell_command(command)
        if not ok:
            return _failed(roll, this, start, f"{command.get_raw_value()}: "
                           f"{output.stderr or output.stdout}", refusal is None)
    if refusal is not None:
        this.restart_s, this.verdict = time.monotonic() - start, "restarted (no roll)"
        return True
    try:
        judge()
        asked_as_the_gateway_asks(gateway_host, argv)
    except OperationError as failure:
        return _failed(roll, this, start, str(failure).splitlines()[0], True)
    this.restart_s = time.monotonic() - start
    if not give_back(gateway_host, argv, this):
        roll.stopped_at = this.name
        logger.error(turn_line(this))
        return True
    logger.info(turn_line(this))
    return True


def _failed(roll: Roll, this: Turn, start: float, why: str, out: bool) -> bool:
    """A turn whose restart or judgement failed: the roll stops at it; the verify phase judges
    it as today (so the operation does not fail here)."""
    roll.stopped_at = this.name
    this.restart_s = time.monotonic() - start
    this.verdict = (f"failed its judgement: {why}; " + (
        "left out of the rotation: the verify phase judges it (an upgrade rolls back), the "
        "gateway phase gives it back" if out else "the verify phase judges it"))
    logger.error(turn_line(this))
    return True


# --- after a roll that stopped: which serve what, and gateway_roll_failure ----------------------


@operation()
def back_with_the_roll(gateway: str, policy: str, target: Callable[[], str | None],
                       go_back: Callable[[str], None]):
    """
    After the roll of GATEWAY's replicas stopped at another replica (its judgement failed):
    say what this one serves, and with POLICY ``back`` send it back, where this run changed it
    and TARGET names a release to go back to (an upgrade's previous stack), in turn: the
    replica that stopped the roll given back first where it answers again (its verify phase
    rolled it back), then this one out of the rotation (never the last serving), GO_BACK
    (the stack switched back, restarted, its start followed), a generation asked as the
    gateway asks it, given back. ``keep``, or a change with no earlier set (a flag, the tuned
    file): it keeps the change, and the run says so. Checked once the deploy has run; nothing
    where the roll did not stop.

    + gateway: the gateway's inventory name
    + policy: ``gateway_roll_failure``, ``keep`` or ``back``
    + target: at execution, the release it would go back to, or None
    + go_back: at execution, sends it back (given why) and follows its start (raises
      ``OperationError``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import roll

        roll.back_with_the_roll(
            name="Back with the roll where it stopped", gateway="@pct/pve1/120",
            policy="back", target=lambda: "sglang 0.5.17", go_back=lambda why: None,
        )
    """
    if not pyinfra_state.is_executing:
        pyinfra_host.noop("where a roll stops, the replicas changed before it are named "
                          f"(gateway_roll_failure {policy})")
        return
    name = pyinfra_host.name
    run = _ROLLS.get(gateway)
    stopped_at = run.roll.stopped_at if run else None
    turn = run.roll.turns.get(name) if run else None
    verdict = turn.verdict if turn else None
    what, words, back_to = after_a_stop(name, policy, stopped_at, verdict, target)
    if what != "back":
        if what == "keep":
            logger.warning(f"{name}: behind {gateway}: {words}")
        pyinfra_host.noop(words)
        return
    assert run is not None and back_to is not None  # "back": the roll stopped, a release named
    yield FunctionCommand(_back, (run, name, back_to, go_back), {})


def _back(state, host, run: _Run, name: str, back_to: str,
          go_back: Callable[[str], None]) -> bool:
    """NAME sent back to BACK_TO in its turn (``back_with_the_roll``)."""
    with run.back:
        gateway_host = state.inventory.get_host(run.roll.gateway)
        _stopper_back(gateway_host, run)
        this, argv = Turn(name), run.argv[name]
        refusal, why = take_out(gateway_host, argv, this)
        if refusal is not None:
            logger.error(f"{name}: keeps the change, not sent back to {back_to}: not taken "
                         f"out: {why}")
            return True
        start = time.monotonic()
        try:
            go_back(f"the roll behind {run.roll.gateway} stopped at {run.roll.stopped_at}, "
                    "which failed its judgement")
            asked_as_the_gateway_asks(gateway_host, argv)
        except OperationError as failure:
            this.restart_s = time.monotonic() - start
            this.verdict = (f"sent back to {back_to}, which fails too: "
                            f"{str(failure).splitlines()[0]}; left out of the rotation")
            logger.error(turn_line(this))
            raise
        this.restart_s = time.monotonic() - start
        given = give_back(gateway_host, argv, this)
        this.verdict = f"back on {back_to} (the roll stopped at {run.roll.stopped_at}), " \
            + this.verdict
        (logger.warning if given else logger.error)(turn_line(this))
        return True


def _stopper_back(gateway_host, run: _Run) -> None:
    """Once: the replica that stopped the roll given back where it answers again (its verify
    phase rolled it back), so that the others can go out in turn."""
    if run.stopper_back:
        return
    run.stopper_back = True
    stopper = run.roll.stopped_at
    if stopper is None or stopper not in run.argv:
        return
    this = Turn(stopper)
    out = back_if_it_answers(gateway_host, run.argv[stopper], this)
    if out is not None:
        logger.error(f"{stopper}: stays out of {run.roll.gateway}'s rotation: {out}")
        return
    logger.warning(f"{stopper}: answers again: {this.verdict}, before the others go back")
