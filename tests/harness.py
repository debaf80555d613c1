"""Test harness: facts in, commands out.

Three levels, as in pyinfra's own tests:
- ``fact_value``: a fact class run over a recorded command output.
- ``op_commands``: one operation against given fact values and host data.
- ``plan_deploy``: a whole ``@deploy`` function through pyinfra's real API on ``@fake``
  hosts whose commands answer with recorded outputs; returns, per host, the commands each
  operation would run (empty lists: converged).
"""

from __future__ import annotations

import re
import subprocess
from typing import Any, Callable

from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.facts import FactBase
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.operations import parse_commands
from pyinfra_testing.util import FakeHost, FakeState

from pve_sglang.runtime.pyinfra_private import operation_function


def fact_value(fact_cls: type[FactBase], output: str, *args: Any, **kwargs: Any) -> Any:
    """Process a recorded command output the way pyinfra does for a real host."""
    fact = fact_cls()
    lines = output.splitlines()
    if not lines:
        return fact.default() if hasattr(fact, "default") else None
    return fact.process(lines)


#: A substring of every ``PathStates`` command: the ``@fake`` connector's matcher for it.
PATH_STATES_COMMAND = 'sha1sum -- "$@"'


def path_states_output(states: dict[str, tuple[str, str, str | None] | None]) -> str:
    """What ``PathStates``' command prints for STATES (``{path: (kind, mode, sha1)}``, None:
    missing): each path's kind, then stat's mode and mtime of those that exist (whole seconds:
    no mtime), then sha1sum's line of the files."""
    kinds = [f"{path}|{state[0] if state else 'missing'}" for path, state in states.items()]
    stats = [f"{state[1]} 0" for state in states.values() if state]
    sums = [f"{state[2]}  {path}" for path, state in states.items() if state and state[0] == "file"]
    return "\n".join(kinds + stats + sums)


class _Facts:
    """Fact lookup for FakeHost keyed by fact class (and argument tuple)."""

    def __init__(self, facts: dict[Any, Any]):
        self.facts = facts

    def get(self, fact_cls: type[FactBase], args: tuple, kwargs: dict) -> Any:
        values = args + tuple(tuple(v) if isinstance(v, list) else v for v in kwargs.values())
        for key in ((fact_cls, values), (fact_cls, args), fact_cls):
            if key in self.facts:
                return self.facts[key]
        raise KeyError(f"test gives no value for fact {fact_cls.__name__}{args or ''}")


class _Host(FakeHost):
    def __init__(self, facts: dict[Any, Any], data: dict[str, Any], name: str):
        super().__init__(FakeState(), name, facts={}, data=data)
        self._facts = _Facts(facts)
        self.groups = data.get("_groups", [])

    def get_fact(self, fact_cls, *args, **kwargs):  # type: ignore[override]
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        return self._facts.get(fact_cls, args, kwargs)


class FoldingHost(_Host):
    """A host whose reads fold into one fact (``FOLD``: ``ContainerState``, ``LxcHostState``)
    over the parts of ``PARTS``: answers a part read alone from ``lookup`` (VALUES:
    ``{(kind, args): value}``), a fold with raw sections, and records what each read asked."""

    FOLD: Any = None
    PARTS: dict = {}

    def __init__(self, values: dict, name: str):
        super().__init__({}, {}, name)
        self.values, self.reads = values, []

    def get_fact(self, fact_cls, *args, **kwargs):  # type: ignore[override]
        if fact_cls is self.FOLD:
            parts = kwargs["parts"]
            self.reads.append(tuple(kind for kind, _ in parts))
            return {i: ("raw", 0) for i in range(len(parts))}
        kind = next(k for k, (cls, _) in self.PARTS.items() if cls is fact_cls)
        self.reads.append((kind,))
        return self.lookup(kind, tuple(kwargs.values()))

    def lookup(self, kind: str, args: tuple):
        return self.values[(kind, args)]


def op_commands(
    op: Any,
    *args: Any,
    facts: dict[Any, Any] | None = None,
    data: dict[str, Any] | None = None,
    host_name: str = "testhost",
    **kwargs: Any,
) -> list[Any]:
    """The commands one operation yields for these facts (keys: fact class or (class, args))."""
    host = _Host(facts or {}, data or {}, host_name)
    with ctx_state.use(host.state), ctx_host.use(host):
        return parse_commands(list(operation_function(op)(*args, **kwargs)))


def plan_deploy(
    deploy_fn: Callable[[], Any],
    hosts: list[tuple[str, dict[str, Any]]],
    responses: dict[str | re.Pattern, Any],
    groups: dict[str, list[str]] | None = None,
    config: Config | None = None,
) -> dict[str, list[tuple[str, list[str]]]]:
    """Prepare a deploy on ``@fake`` hosts and list each operation's commands per host.

    ``responses`` maps a command substring (or compiled regex) to its recorded output, as the
    ``@fake`` connector's ``fake_responses``; unmatched commands succeed with no output.
    ``config``: pyinfra's run config (``Config(DIFF=True)`` is ``--diff``).
    """
    names = [f"@fake/{name}" for name, _ in hosts]
    host_data = {
        f"@fake/{name}": {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0, **data}
        for name, data in hosts
    }
    group_args = {
        group: ([f"@fake/{member}" for member in members], {})
        for group, members in (groups or {}).items()
    }
    inventory = Inventory(([(name, host_data[name]) for name in names], {}), **group_args)
    state = State(inventory, config or Config())
    connect_all(state)
    for host in inventory:
        add_deploy(state, deploy_fn, host=host)

    plan: dict[str, list[tuple[str, list[str]]]] = {}
    for host in inventory:
        ops = []
        for op_hash in state.get_op_order():
            op_data = state.ops[host].get(op_hash)
            if op_data is None:
                continue
            op_name = ", ".join(sorted(state.get_op_meta(op_hash).names))
            with ctx_state.use(state), ctx_host.use(host):
                commands = [_command_text(c) for c in op_data.command_generator()]
            ops.append((op_name, commands))
        plan[host.name.removeprefix("@fake/")] = ops
    return plan


def _command_text(command: Any) -> str:
    """A command as text; an upload as ``upload DEST`` and the uploaded text."""
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        src = command.src
        body = src.getvalue() if hasattr(src, "getvalue") else f"<file {src}>"
        return f"upload {command.dest}\n{body}"
    return str(command)


def sh(command) -> list[str]:
    """The stdout lines of COMMAND (a string or a ``StringCommand``) run here with ``sh -c``:
    a fact's real command on this machine."""
    text = command if isinstance(command, str) else command.get_raw_value()
    done = subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()
