"""The server's systemd unit: running and enabled where it can run, restarted once when
what it runs changed, and a restart a killed run never made made by the next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation

from pve_sglang.facts.one_read import Part
from pve_sglang.facts.verify import JournalTail
from pve_sglang.operations import container_reads, paths
from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.server import unit_action
from pve_sglang.server.unit_action import Action


class RestartTurn(Protocol):
    """A restart made in its turn (``operations.roll.InTurn``): told whether the replica
    restarts, then run with the restart's commands in the place of them; WORDS for the plan."""

    words: str

    def decided(self, restarts: bool) -> None: ...

    def __call__(self, state, host, commands: list[StringCommand]) -> bool: ...


def restart_pending(started: int | None, since: dict[str, str]) -> list[str]:
    """The names in SINCE (``{name: path}``) whose path changed after STARTED (the running
    server's start, microseconds since the epoch): ``unit_action.changed_after`` of their
    mtimes, from the run's one read of the managed paths."""
    mtimes = {}
    for name, path in since.items():
        current = paths.state(path)
        mtimes[name] = current.get("mtime") if current else None
    return unit_action.changed_after(started, mtimes)


def _state_words(unit_state: dict) -> str:
    words = f"{unit_state['active']}/{unit_state.get('sub')} (Result={unit_state.get('result')}"
    if unit_state.get("restarts") not in (None, "", "0"):
        words += f", {unit_state['restarts']} automatic restarts"
    return words + ")"


@operation()
def service_running(unit: str, start: bool, restart: Callable[[], bool],
                    since: dict[str, str] | None = None, restart_on_change: bool = True,
                    turn: RestartTurn | None = None):
    """
    Keep UNIT running and enabled at boot where it can run (START: the server needs a GPU;
    without one it is disabled, so that it does not fail and restart at every boot). Start it
    when it is down, and restart it once when RESTART says its unit, environment, stack or
    patch changed. A converged run restarts nothing: a restart reloads the model, minutes of
    downtime. A restart a killed run never made is made: when a path of SINCE changed after the
    running server started, the server runs the old one; the log says which (``restart pending:
    the unit file changed after the server started``). A unit found failed or between two
    automatic restarts is reported (state, restart count, last journal lines) and started again,
    so that the verify phase follows that start and diagnoses it. Each start or restart resets
    the unit's start limit first (``reset-failed``): the limit is for automatic restarts.

    + unit: the systemd unit, e.g. ``sglang.service``
    + start: start the unit when it is down, and enable it at boot; false leaves it stopped
      and disabled (no GPU to serve on)
    + restart: asked only when the unit runs; true restarts it. Usually ``any_changed`` of the
      operations that write its unit, env file, launcher and stack
    + since: ``{what: path}`` of what the server reads when it starts, whose mtimes (from the
      run's one read of the managed paths) are compared with the server's start
    + restart_on_change: false never restarts a running server: a needed restart is reported
      as pending on every run until the server runs what its files say
    + turn: a running server's restart made in its turn of a roll behind a gateway
      (``operations.roll.InTurn``, given the restart's commands): out of the gateway's rotation,
      drained, restarted, judged, given back; None: restarted at once

    **Example:**

    .. code:: python

        from pve_sglang.operations import systemd_unit
        from pve_sglang.operations.changes import any_changed

        # unit_file, env, packages: the operations writing the unit, its env file, the stack
        systemd_unit.service_running(
            name="sglang.service enabled and running",
            unit="sglang.service",
            start=True,
            restart=any_changed(unit_file, env, packages, restarts="sglang.service"),
            since={"the unit file": "/etc/systemd/system/sglang.service",
                   "the environment file": "/etc/sglang/sglang.env"},
        )
    """
    unit_state = container_reads.read(Part.UNIT, unit)
    # What this operation does moves it: a later ask reads it again.
    container_reads.forget(Kind.UNIT)
    active, sub = unit_state["active"], unit_state.get("sub")
    # Written but never loaded (a deploy killed between the write and the reload): the server
    # runs the old unit. Load it and restart, as the killed run would have.
    stale = unit_state.get("stale", False)
    serving = active in unit_action.RUNNING_STATES and not unit_action.looping(active, sub)
    # Asked before the first command: a plan (--dry) reads an operation only up to its first
    # command, and the restart's reason is logged when it is asked.
    changed = serving and (stale or restart())
    pending = restart_pending(unit_state.get("started"), since or {}) if serving and not changed else []
    plan = unit_action.decide(active=active, sub=sub, enabled=unit_state["enabled"], stale=stale,
                              start=start, changed=changed, pending=pending,
                              restart_on_change=restart_on_change)
    quoted = QuoteString(unit)
    if turn is not None:
        turn.decided(plan.action is Action.RESTART)  # its roll waits for every replica's
    if plan.action is Action.RESTART and turn is not None and cache.once(
            Kind.RESTART_REASON, f"{unit} in turn"):
        # Before the first command: a plan (--dry) says each replica's step too.
        logger.info(f"{host.name}: {unit} restarts {turn.words}")
    if plan.daemon_reload:
        yield StringCommand("systemctl daemon-reload")
    if plan.boot:
        yield StringCommand(f"systemctl {plan.boot}", quoted)
    action = plan.action
    if action is Action.RECOVER:
        if cache.once(Kind.UNIT_LOOPING, unit):
            tail = host.get_fact(JournalTail, unit=unit, lines=15)
            logger.warning(f"{host.name}: {unit} is not serving: {_state_words(unit_state)}; "
                           "last journal lines:\n" + "\n".join(f"    {line}" for line in tail))
        yield StringCommand("systemctl reset-failed", quoted)
        yield StringCommand("systemctl restart" if start else "systemctl stop", quoted)
    elif action is Action.NOTHING:
        host.noop(f"{unit} is running and unchanged")
    elif action is Action.PENDING:
        if cache.once(Kind.RESTART_PENDING, unit):
            logger.warning(f"{host.name}: {unit} restart pending: {plan.why}; restart_on_change "
                           f"is false: `systemctl restart {unit}` when the model may go down")
        host.noop(f"{unit} restart pending (restart_on_change is false)")
    elif action is Action.RESTART:
        if pending and cache.once(Kind.RESTART_PENDING, unit):
            # Once per run: in the plan, or at execution when the plan was skipped (-y).
            logger.warning(f"{host.name}: {unit} restart pending: {plan.why}")
        commands = [StringCommand("systemctl reset-failed", quoted),
                    StringCommand("systemctl restart", quoted)]
        if turn is not None:
            yield FunctionCommand(turn, (commands,), {})
        else:
            yield from commands
    elif action is Action.START:
        yield StringCommand("systemctl reset-failed", quoted)
        yield StringCommand("systemctl start", quoted)
    else:
        host.noop(f"{unit} not started: the server needs a GPU")
