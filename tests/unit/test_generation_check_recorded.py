"""The verify phase's generation check at execution, on recorded answers of its own command.

``remote/startup_watch.py generate`` ran on this machine against the stand-in server
(``tests/standin_sglang.py``): its ``degenerate`` case streams a run of ``!`` with null logprobs
(the collapse flashinfer issue 4841 reports on SM120), its ``normal`` case sensible text. What the
command printed is kept as is (``tests/fixtures/dev-docker/startup_watch_generate_standin_*.json``).
A ``@fake`` container answers the check's command with it and pyinfra's API runs
``verify.generation_works`` at execution, as the deploy does; ``tests/lxc/test_startup_watch_lxc.py``
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

RECORDED = Path(__file__).parents[1] / "fixtures" / "dev-docker"


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


def test_a_failed_answer_through_the_gateway_names_the_worker_it_was_routed_to(caplog):
    """smg names the worker it chose in ``x-smg-routed-worker-id``: the check's own command,
    run here against a local server answering as smg does when that worker fails (HTTP 500 with
    the header), and its output judged as the deploy judges it, names the worker. The header's
    value is the gateway's, untrusted: a control character in it never reaches the message."""
    import http.server
    import json
    import subprocess
    import sys
    import threading

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # /v1/models
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"error": "worker failed"}'
            self.send_response(500)
            self.send_header("x-smg-routed-worker-id", "http://10.0.3.7:30000\x1b[31m")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = Path(verify.__file__).parent.parent / "remote" / "startup_watch.py"
        answer = subprocess.run(
            [sys.executable, str(script), "generate", "--url",
             f"http://127.0.0.1:{server.server_address[1]}", "--timeout", "20"],
            capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        server.shutdown()
    message = failed_with(answer, caplog)
    assert "chat completion: HTTP 500" in message, message
    assert "(the gateway routed it to worker http://10.0.3.7:30000[31m)\n" in message + "\n"
    assert "\x1b" not in message
