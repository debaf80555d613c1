"""pyinfra's work per operation gives the same results made cheaper (``pyinfra_per_op``).

The stack is read with ``context=0``: pyinfra orders and names every operation of a CLI run
by what it reads there, so both readers must give the same line numbers
(``get_operation_order_from_stack``) and the same call location (``get_call_location``,
which counts frames) from a deploy file's nested calls. The global arguments' type hints are
read once: ``pop_global_arguments`` must pop the same arguments. And once installed, an
operation call goes through the cheaper readers: pyinfra still calls what ``install`` replaced.
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections import Counter

import pyinfra
import pytest
from pyinfra.api import Config, Inventory, State, util
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import server

from pve_sglang.runtime import pyinfra_per_op

DEPLOY = '''\
def task(probe, state):
    return probe(
        state,
    )


def phase(probe, state):
    for _ in range(1):
        return task(probe, state)


RESULT = phase(
    PROBE, STATE)
'''


def probe(state):
    """What pyinfra reads from this stack, with each pair of readers, from one line."""
    seen = []
    for readers in (pyinfra_per_op.ORIGINAL_READERS, pyinfra_per_op.WITHOUT_CONTEXT):
        pyinfra_per_op.use_readers(readers); seen.append((util.get_operation_order_from_stack(state), util.get_call_location()))  # noqa: E702,E501
    return seen


@pytest.fixture
def cli_state(tmp_path, monkeypatch):
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY)
    state = State(Inventory((["@local"], {})), Config())
    state.current_deploy_filename = str(deploy)
    state.current_op_file_number = 7
    monkeypatch.setattr(pyinfra, "is_cli", True)
    yield state, deploy
    pyinfra_per_op.uninstall()


def run_deploy(deploy, state) -> list:
    scope = {"PROBE": probe, "STATE": state}
    exec(compile(deploy.read_text(), str(deploy), "exec"), scope)
    return scope["RESULT"]


def test_the_order_and_call_location_are_the_same_without_source_lines(cli_state):
    state, deploy = cli_state
    (order, location), (fast_order, fast_location) = run_deploy(deploy, state)
    # The deploy file's own lines follow the op file number: its three calls, then this module's.
    assert order[:4] == [7, 12, 9, 2]
    assert fast_order == order
    assert fast_location == location


def test_the_order_is_the_same_outside_a_deploy_file(cli_state):
    state, deploy = cli_state
    state.current_deploy_filename = None
    (order, location), (fast_order, fast_location) = run_deploy(deploy, state)
    assert (fast_order, fast_location) == (order, location)


def test_install_leaves_the_readers_without_context(cli_state):
    pyinfra_per_op.install()
    pyinfra_per_op.install()
    assert (util.stack, util.getframeinfo) == pyinfra_per_op.WITHOUT_CONTEXT


def test_the_global_arguments_popped_are_the_same_read_once(cli_state):
    from pyinfra.api import arguments

    inventory = Inventory(([("@local", {"_sudo": True, "_retries": 2})], {}))
    state = State(inventory, Config())
    host = inventory.get_host("@local")
    kwargs = {"_shell_executable": "bash", "_ignore_errors": True, "path": "/x"}
    popped = []
    for _ in range(2):
        for install in (pyinfra_per_op.uninstall, pyinfra_per_op.install):
            install()
            left = dict(kwargs)
            popped.append((arguments.pop_global_arguments(state, host, left), left))
    assert all(p == popped[0] for p in popped)
    (popped_arguments, found), left = popped[0]
    assert popped_arguments["_sudo"] is True and popped_arguments["_shell_executable"] == "bash"
    assert popped_arguments["_retries"] == 2 and popped_arguments["_ignore_errors"] is True
    assert sorted(found) == ["_ignore_errors", "_shell_executable"] and left == {"path": "/x"}
    assert arguments.all_global_arguments() == pyinfra_per_op.ORIGINAL_ARGUMENTS()


def calls_made(call) -> Counter:
    """What CALL makes pyinfra call, counted: the stack readers with their ``context``
    (``stack``, ``getframeinfo``), ``findsource`` (a frame's source line read), and the type
    hints of ``AllArguments`` (``hints``), seen by a profiler, not by replacing anything."""
    from pyinfra.api.arguments import AllArguments

    watched = {inspect.stack.__code__: "stack", inspect.getframeinfo.__code__: "getframeinfo",
               inspect.findsource.__code__: "findsource", typing.get_type_hints.__code__: "hints"}
    seen: Counter = Counter()

    def profile(frame, event, arg):
        kind = watched.get(frame.f_code) if event == "call" else None
        if kind in ("stack", "getframeinfo"):
            seen[(kind, frame.f_locals["context"])] += 1
        elif kind == "findsource" or kind == "hints" and frame.f_locals["obj"] is AllArguments:
            seen[kind] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_an_operation_call_goes_through_the_cheaper_readers_once_installed(cli_state):
    """What pyinfra's operation machinery calls at an operation call, as a CLI run calls it:
    pyinfra's own readers before ``install``, only the cheaper ones after (a pyinfra that
    read the stack or the arguments some other way would show its own again)."""
    state, _ = cli_state
    state.set_stage(StateStage.Prepare)
    host = state.inventory.get_host("@local")
    seen = {}
    with ctx_state.use(state), ctx_host.use(host):
        for install in (pyinfra_per_op.uninstall, pyinfra_per_op.install):
            install()
            seen[install.__name__] = calls_made(lambda: server.shell(commands=["true"]))
    own, cheaper = seen["uninstall"], seen["install"]
    # pyinfra's own: every frame's source read, the hints asked.
    assert own[("stack", 1)] == 1 and own[("getframeinfo", 1)] > 1
    assert own["findsource"] == own[("getframeinfo", 1)] and own["hints"] == 1
    # Installed: the same stack read without source, nothing else.
    assert set(cheaper) == {("stack", 0), ("getframeinfo", 0)}
    assert cheaper[("stack", 0)] == 1 and cheaper[("getframeinfo", 0)] == own[("getframeinfo", 1)]
