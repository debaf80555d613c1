"""The verify phase's generation check at execution, on recorded answers of its own command.

``remote/startup_watch.py generate`` ran on this machine against the stand-in server
(``tests/standin_sglang.py``): its ``degenerate`` case streams a run of ``!`` with null logprobs
(the collapse flashinfer issue 4841 reports on SM120), its ``normal`` case sensible text. What the
command printed is kept as is (``tests/fixtures/dev-docker/startup_watch_generate_standin_*.json``).
A ``@fake`` container answers the check's command with it and pyinfra's API runs
``verify.generation_works`` at execution, as the deploy does; ``tests/test_startup_watch_lxc.py``
checks the same inside a real container.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from pve_sglang.operations import verify

RECORDED = Path(__file__).parent / "fixtures" / "dev-docker"


def run_generation_check(answer: str) -> State:
    """Prepare and execute ``verify.generation_works`` on a container whose generate command
    prints ANSWER."""
    data = {"fake_responses": {"startup_watch.py generate": answer}, "fake_delay": 0,
            "fake_delay_jitter": 0}
    state = State(Inventory(([("@fake/ct105", data)], {})), Config())
    connect_all(state)
    add_op(state, verify.generation_works, url="http://127.0.0.1:30000",
           env_file="/etc/sglang/sglang.env", script="/opt/sglang/startup_watch.py")
    run_ops(state)
    return state


def failed_with(answer: str, caplog) -> str:
    """The error line the check fails its host with: the host alone fails (no exception out of
    the operation, which would end every host's run after a greenlet traceback)."""
    with caplog.at_level(logging.ERROR, logger="pyinfra"), pytest.raises(PyinfraError,
                                                                         match="No hosts remaining"):
        run_generation_check(answer)
    assert "Traceback" not in caplog.text
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


def recorded(case: str) -> str:
    return (RECORDED / f"startup_watch_generate_standin_{case}.json").read_text()


def test_recorded_degenerate_answer_fails_the_generation_check(caplog):
    message = failed_with(recorded("degenerate"), caplog)
    assert message.startswith("[@fake/ct105] chat completion is degenerate (24 of 24 characters are '!'): "
                              "'!!!!!!!!!!!!!!!!!!!!!!!!'"), message
    assert "--disable-flashinfer-autotune" in message and "moe_runner_backend" in message


def test_recorded_degenerate_logprobs_alone_fail_the_generation_check(caplog):
    """The degenerate answer's null logprobs under sensible text (the normal answer's): the
    logprobs alone fail it."""
    normal, degenerate = recorded("normal"), recorded("degenerate")
    answer = normal.replace(normal[normal.index('"logprobs": ['):normal.index("]") + 1],
                            degenerate[degenerate.index('"logprobs": ['):degenerate.index("]") + 1])
    assert "degenerate (24 of 24 logprobs are NaN, inf or missing)" in failed_with(answer, caplog)


def test_recorded_normal_answer_passes_and_logs_the_rate(caplog):
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        state = run_generation_check(recorded("normal"))
    assert not state.failed_hosts
    assert ("chat completion of standin-model: 8 tokens, TTFT 0.05s, 84.3 tok/s single stream: "
            "'Red, blue and yellow are the primary colours.'") in caplog.text
