"""One container's search driven against a real server process: the stand-in server
(tests/standin_sglang.py) reading a landscape written here (no code for it), restarted with
the flags ``server_argv`` renders for each try, measured with real requests and its /metrics.
A local process, no LXC container and no GPU (about 12 s).

The search finds the landscape's best (no cap, the fast backend) past a degenerate backend and
an out-of-memory fraction, writes the tuned file and its record, and leaves the server on the
best; stopped with Ctrl-C it leaves the server on the best so far; a record without its end (a
killed search: emulated by cutting the end line a Ctrl-C'ed run wrote) is replayed and ended,
each try measured once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pve_sglang.remote import server_metrics
from pve_sglang.tuning import record
from pve_sglang.tuning.drive import Drive, Server, ending_of
from pve_sglang.tuning.tuned_file import read_tuned
from test_server_metrics import LOGS, STANDIN, _free_port
from test_standin_landscape import served_flags

KEY = "sk-standin"
LANDSCAPE = """\
space:
  max_running_requests: [1, 2, null]
  moe_runner_backend: [auto, flashinfer_cutlass, flashinfer_trtllm]
  mem_fraction_static: [0.85, 0.94]
start: {max_running_requests: 1, moe_runner_backend: auto, mem_fraction_static: 0.85,
        disable_cuda_graph: true}
workload: {concurrency: 4, input_len: 24, output_len: 8}
sglang_defaults: {cap: 64}
peak_tok_s: 1000
half_running: 1
kv: {weights_fraction: 0.5, tokens_per_fraction: 1000}
effects:
  moe_runner_backend: {flashinfer_cutlass: {rate: 2.0}}
failures:
  - {when: {moe_runner_backend: flashinfer_trtllm}, ends: degenerate}
  - {when: {mem_fraction_static: {ge: 0.94}}, ends: oom}
"""
CLIENTS = 4
WHOLE_S = 0.5


class StandinServer:
    """Server for ``Drive``: the stand-in restarted with each candidate's flags."""

    def __init__(self, tmp_path: Path, landscape: Path):
        self.tmp, self.landscape = tmp_path, landscape
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.flags: dict | None = None
        self.applied = 0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def apply(self, candidate: dict) -> str:
        self.stop()
        self.applied += 1
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = self.tmp / "server.log"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(STANDIN), "--logs", str(LOGS), "--port", str(port),
                 "--event-file", str(self.tmp / "event"), "--pause-scale", "0.01",
                 "--enable-metrics", "--token-delay", "0.006", "--landscape",
                 str(self.landscape), *served_flags("0.5.23", **candidate)],
                stdout=out, stderr=subprocess.STDOUT,
                env={"SGLANG_API_KEY": KEY, "PATH": "/usr/bin:/bin"})
        self.flags = dict(candidate)
        deadline = time.monotonic() + 5  # the stand-in starts in about 0.3 s here
        ready = False
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self._request("/health"), timeout=2):
                    ready = True
                    break
            except OSError:
                time.sleep(0.05)
        lines = log.read_text().splitlines()
        answer = self._answer() if ready else None
        return ending_of(lines, stalled=not ready and self.proc.poll() is None, answer=answer)

    def _request(self, path: str, body: dict | None = None) -> urllib.request.Request:
        data = json.dumps(body).encode() if body is not None else None
        return urllib.request.Request(self.url + path, data, headers={
            "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})

    def _answer(self) -> str:
        request = self._request("/v1/chat/completions", {"messages": [], "max_tokens": 8})
        with urllib.request.urlopen(request, timeout=10) as answer:
            events = [line[6:] for line in answer.read().decode().splitlines()
                      if line.startswith("data: {")]
        return "".join(json.loads(e)["choices"][0]["delta"]["content"] for e in events
                       if json.loads(e).get("choices"))

    def measure(self, length: float) -> dict:
        end = time.monotonic() + WHOLE_S * length
        tokens = []

        def client() -> None:
            while time.monotonic() < end:
                request = self._request("/generate", {
                    "text": " ".join(["w"] * 24), "stream": True,
                    "sampling_params": {"max_new_tokens": 8}})
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
                tokens.append(8)

        began = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        time.sleep(WHOLE_S * length / 2)
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as answer:
            figures = server_metrics.figures(answer.read().decode())
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        return {"concurrency": CLIENTS, "output_token_throughput": sum(tokens) / elapsed,
                "running_reqs_max": figures.get("running_reqs"),
                "running_reqs_mean": figures.get("running_reqs"),
                "queue_reqs_mean": figures.get("queue_reqs"),
                "token_usage_max": figures.get("token_usage")}


@pytest.fixture
def setup(tmp_path):
    landscape = tmp_path / "small.yaml"
    landscape.write_text(LANDSCAPE)
    server = StandinServer(tmp_path, landscape)
    found = {"max_running_requests": 1, "moe_runner_backend": "auto",
             "mem_fraction_static": 0.85}
    space = {"max_running_requests": (1, 2, None),
             "moe_runner_backend": ("auto", "flashinfer_cutlass", "flashinfer_trtllm"),
             "mem_fraction_static": (0.85, 0.94)}
    drive = Drive(space, found, budget_s=600, tuned=tmp_path / "tuned" / "pve1-105.yml",
                  objective_level=CLIENTS)
    server.apply(found)  # the server as the search finds it
    yield drive, server
    server.stop()


BEST = {"max_running_requests": None, "moe_runner_backend": "flashinfer_cutlass",
        "mem_fraction_static": 0.85}


def test_stopped_with_ctrl_c_the_server_serves_the_best_so_far_and_a_killed_one_goes_on(setup):
    drive, server = setup
    measured = server.measure
    calls = []

    def stops_at_the_tenth(length: float) -> dict:
        calls.append(length)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return measured(length)

    with pytest.raises(KeyboardInterrupt):
        drive.run(Server(server.apply, stops_at_the_tenth))
    path = record.record_path(drive.tuned)
    stopped = record.read(path)
    assert stopped.ended["stopped"] == "stopped before its end"
    assert server.flags == stopped.ended["best"] == read_tuned(drive.tuned)
    assert server.proc.poll() is None
    # A kill leaves no end line: the next run replays the tries and goes on.
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
    before = len(stopped.tries)
    applied = server.applied
    search = drive.run(Server(server.apply, server.measure))
    done = record.read(path)
    assert done.ended["stopped"].startswith("no candidate left") and search.best == BEST
    assert [t.proposal for t in done.tries[:before]] == [t.proposal for t in stopped.tries]
    assert len(done.tries) == len(search.tries)  # no try measured twice
    assert server.flags == BEST and server.applied > applied
    assert server.proc.poll() is None and read_tuned(drive.tuned) == BEST  # serving the best
    endings = {t.outcome.ended for t in done.tries}
    assert {"degenerate", "oom", "measured"} <= endings
    failed = [t for t in done.tries if not t.outcome.ok]
    assert all(t.outcome.cost_s < 3 for t in failed)  # a failed try costs its start alone


@pytest.mark.parametrize("lines, stalled, answer, ended", [
    (["Load weight end.", "The server is fired up and ready to roll!"], False, "Red and blue.", ""),
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], False, None,
     "oom"),
    (["Skipping tactic 3: failed to initialize cutlass TMA WS grouped gemm"], True, None, "stall"),
    (["Skipping tactic 3: failed to initialize cutlass TMA WS grouped gemm"], False, "fine text",
     ""),  # the autotune's warnings alone, and it serves: harmless
    (["Load weight begin."], True, None, "stall"),
    (["RuntimeError: something else"], False, None, "start"),
    (["ready"], False, "!!!!!!!!!!!!!!!!!!!!!!!!", "degenerate"),
])
def test_how_a_start_ended_from_the_watch_and_the_generation_check(lines, stalled, answer, ended):
    assert ending_of(lines, stalled, answer) == ended
