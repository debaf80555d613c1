"""pyinfra's operation order and call locations are the same read without source lines.

``pve_sglang.op_order`` makes ``pyinfra.api.util`` read the stack with ``context=0``. pyinfra
orders and names every operation of a CLI run by what it reads there, so both readers must
give the same line numbers (``get_operation_order_from_stack``) and the same call location
(``get_call_location``, which counts frames) from a deploy file's nested calls.
"""

from __future__ import annotations

import pyinfra
import pytest
from pyinfra.api import Config, Inventory, State, util

from pve_sglang import op_order

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
    for readers in (op_order.ORIGINAL, op_order.WITHOUT_CONTEXT):
        op_order.use(readers); seen.append((util.get_operation_order_from_stack(state), util.get_call_location()))  # noqa: E702,E501
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
    op_order.use(op_order.ORIGINAL)


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
    op_order.install()
    op_order.install()
    assert (util.stack, util.getframeinfo) == op_order.WITHOUT_CONTEXT
