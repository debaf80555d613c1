"""One container's search driven against a real server process: the stand-in server
(tests/standin_sglang.py) reading a landscape written here (no code for it), restarted with
the flags ``server_argv`` renders for each try, measured with real requests and its /metrics.
A local process, no LXC container and no GPU (about 12 s).

The search finds the landscape's best (no cap, the fast backend) past a degenerate backend and
an out-of-memory fraction, writes the tuned file and its record, and leaves the server on the
best; stopped with Ctrl-C it leaves the server on the best so far, and the next run replays the
record and goes on, each try measured once. The drive's rules on a simulated server and clock
(tests/tune_sim.py): a killed search resumed, a finished one not; the budget a bound; a hang in
the last benchmark; the end on the best, checked, whatever the last try did; the bounds at their
edges.
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

import tune_sim
from landscape import Landscape
from pve_sglang.remote import server_metrics
from pve_sglang.tuning import record
from pve_sglang.tuning.drive import (
    MIN_SCRAPES,
    Drive,
    Server,
    ending_of,
    objective_source,
    within_bound,
)
from pve_sglang.tuning.space import same_server, server_flags
from pve_sglang.tuning.strategy import START_ENDINGS, Search
from pve_sglang.tuning.tuned_file import read_tuned
from standin_process import LOGS, STANDIN, free_port
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
kv: {weights_fraction: 0.5, tokens_per_fraction: 300}  # 3 requests of 4: a queue
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
        port = free_port()
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
        # The stand-in starts in about 0.3 s here, in seconds on a loaded machine; none of this
        # landscape's flags stalls it, so the bound is only a loaded machine's.
        deadline = time.monotonic() + 30
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

    def measure(self, length: float, limit_s: float, level: int) -> dict:
        """LEVEL clients, each a request at a time, for LENGTH of the whole benchmark."""
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
        threads = [threading.Thread(target=client) for _ in range(level)]
        for thread in threads:
            thread.start()
        time.sleep(WHOLE_S * length / 2)
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as answer:
            figures = server_metrics.figures(answer.read().decode())
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        return {"concurrency": level, "output_token_throughput": sum(tokens) / elapsed,
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
                  objective_level=CLIENTS, start_s=2.0, bench_s=WHOLE_S)
    server.apply(found)  # the server as the search finds it
    yield drive, server
    server.stop()


BEST = {"max_running_requests": None, "moe_runner_backend": "flashinfer_cutlass",
        "mem_fraction_static": 0.85}


def test_stopped_with_ctrl_c_the_server_serves_the_best_so_far_and_the_next_run_goes_on(setup):
    drive, server = setup
    measured = server.measure
    calls = []

    def stops_at_the_tenth(length: float, limit_s: float, level: int) -> dict:
        calls.append(length)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return measured(length, limit_s, level)

    with pytest.raises(KeyboardInterrupt):
        drive.run(Server(server.apply, stops_at_the_tenth))
    path = record.record_path(drive.tuned)
    stopped = record.read_search(path)
    assert stopped.ended["stopped"] == "stopped before its end" and not stopped.finished
    assert server.flags == stopped.ended["best"] == stopped.ended["serving"] == \
        read_tuned(drive.tuned)
    assert server.proc.poll() is None
    # The next run replays the tries from the record and goes on: none measured again.
    before = len(stopped.tries)
    applied = server.applied
    again = []

    def counted(length: float, limit_s: float, level: int) -> dict:
        again.append(length)
        return measured(length, limit_s, level)

    search = drive.run(Server(server.apply, counted))
    done = record.read_search(path)
    assert done.finished and done.ended["stopped"].startswith("no move left")
    assert search.best == BEST
    assert [t.proposal for t in done.tries[:before]] == [t.proposal for t in stopped.tries]
    assert len(done.tries) == len(search.tries)  # each try once in the record ...
    measures = [t for t in done.tries[before:] if t.outcome.ended not in (
        "oom", "start", "stall", "degenerate")]
    assert len(again) == len(measures)  # ... and measured once, over both runs
    assert server.flags == BEST and server.applied > applied
    assert server.proc.poll() is None and read_tuned(drive.tuned) == BEST  # serving the best
    endings = {t.outcome.ended for t in done.tries}
    assert {"degenerate", "oom", "measured"} <= endings
    failed = [t for t in done.tries if not t.outcome.ok]
    assert failed and all(t.outcome.cost_s == t.outcome.start_s for t in failed)  # its start alone


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


# --- the drive's rules on a simulated server and clock ------------------------------------

SEED_MOE = Path(__file__).parents[1] / "landscapes" / "seed_moe.yaml"


def seed_moe() -> Landscape:
    return Landscape.read(SEED_MOE, noise_pct=4)


class Killed(BaseException):
    """The process killed (SIGKILL): raised from the server, the record and the server then put
    back as the kill left them (no end line, nothing applied after)."""


def stopped_with_ctrl_c_at(drive: Drive, server, part: int) -> None:
    """DRIVE run on SERVER, stopped with Ctrl-C as its PART-th benchmark part begins."""
    real, n = server.measure, {"parts": 0}

    def stops(length: float, limit_s: float, level: int) -> dict:
        n["parts"] += 1
        if n["parts"] == part:
            raise KeyboardInterrupt
        return real(length, limit_s, level)

    with pytest.raises(KeyboardInterrupt):
        drive.run(Server(server.apply, stops))


def killed_at(drive: Drive, server: tune_sim.SimServer, measures: int) -> tuple[list, dict]:
    """DRIVE run on SERVER, killed as its MEASURES-th part begins: the record's lines and the
    server's flags as the kill left them."""
    path = record.record_path(drive.tuned)
    real = server.measure
    seen = {"n": 0, "lines": [], "serving": None}

    def measure(length: float, limit_s: float, level: int) -> dict:
        seen["n"] += 1
        if seen["n"] == measures:
            seen["lines"] = path.read_text().splitlines()
            seen["serving"] = server.serving
            raise Killed
        return real(length, limit_s, level)

    with pytest.raises(Killed):
        drive.run(Server(server.apply, measure))
    path.write_text("\n".join(seen["lines"]) + "\n")
    server.serving = seen["serving"]
    return seen["lines"], seen["serving"]


def counting(server: tune_sim.SimServer) -> tuple[Server, dict]:
    calls = {"apply": [], "measure": 0}

    def apply(candidate: dict) -> str:
        calls["apply"].append(dict(candidate))
        return server.apply(candidate)

    def measure(length: float, limit_s: float, level: int) -> dict:
        calls["measure"] += 1
        return server.measure(length, limit_s, level)

    return Server(apply, measure), calls


def test_a_killed_search_resumes_from_its_record_each_try_measured_once(tmp_path):
    drive, server = tune_sim.drive(seed_moe(), tmp_path, seed=3)
    lines, _ = killed_at(drive, server, 30)
    killed = record.read_search(record.record_path(drive.tuned))
    assert killed.ended is None and len(killed.tries) == 29
    again, calls = counting(server)
    search = drive.run(again)
    done = record.read_search(record.record_path(drive.tuned))
    assert done.finished and len(done.tries) == len(search.tries)
    assert [t.proposal for t in done.tries[:29]] == [t.proposal for t in killed.tries]
    measured = [t for t in done.tries[29:] if t.outcome.start_s == 0 or t.outcome.ok]
    assert calls["measure"] == len(measured)  # none of the 29 measured again
    assert calls["apply"][0] == done.tries[29].proposal.candidate  # unknown flags: restarted
    assert tune_sim.same(server.serving, search.best)
    assert tune_sim.share(seed_moe(), search.best) >= 0.9


def test_killed_after_its_last_try_the_next_run_puts_the_server_on_the_best(tmp_path):
    """The flags the server runs are unknown after a kill: the end applies the best even
    when the replay measures nothing."""
    landscape = seed_moe()
    drive, server = tune_sim.drive(landscape, tmp_path, seed=1, budget_s=3 * 3600)
    first = drive.run(server.server())
    path = record.record_path(drive.tuned)
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")  # no end: killed
    server.serving = dict(landscape.start)  # as a kill during the final restart may leave it
    again, calls = counting(server)
    second = drive.run(again)
    assert calls["measure"] == 0 and second.best == first.best
    assert calls["apply"] == [first.best]
    assert tune_sim.same(server.serving, first.best)


def test_a_finished_search_is_not_resumed_the_next_run_searches_again(tmp_path):
    landscape = seed_moe()
    drive, server = tune_sim.drive(landscape, tmp_path, seed=2, budget_s=2 * 3600)
    drive.run(server.server())
    assert record.read_search(record.record_path(drive.tuned)).finished
    again, calls = counting(server)
    second = drive.run(again)
    done = record.read_search(record.record_path(drive.tuned))
    assert calls["measure"] > 0 and len(done.tries) == len(second.tries)
    assert done.tries[0].proposal.why == "the server as found"


def test_stopped_with_ctrl_c_the_next_run_goes_on_each_try_measured_once(tmp_path):
    landscape = seed_moe()
    drive, server = tune_sim.drive(landscape, tmp_path, seed=4)
    stopped_with_ctrl_c_at(drive, server, 25)
    stopped = record.read_search(record.record_path(drive.tuned))
    assert not stopped.finished and tune_sim.same(server.serving, stopped.ended["best"])
    assert stopped.ended["serving"] == stopped.ended["best"]
    again, calls = counting(server)
    search = drive.run(again)
    done = record.read_search(record.record_path(drive.tuned))
    assert done.finished and len(done.tries) == len(search.tries)
    assert calls["measure"] == len([t for t in done.tries[len(stopped.tries):]
                                    if t.outcome.ok or t.outcome.start_s == 0])


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Killed])
def test_stopped_near_the_budgets_end_the_resumed_search_keeps_the_budget(tmp_path, stop):
    """Stopped while a challenger ran (seed 2, 4 h: its 56th part, 15 minutes before the end),
    the server is back on the best (Ctrl-C) or runs unknown flags (a kill): the resumed
    search counts the restart its next part needs, and ends within what the record left of
    the budget, its end's restart included."""
    budget = 4 * 3600
    drive, server = tune_sim.drive(seed_moe(), tmp_path, seed=2, budget_s=budget)
    path = record.record_path(drive.tuned)
    if stop is Killed:
        killed_at(drive, server, 56)
    else:
        stopped_with_ctrl_c_at(drive, server, 56)
    stopped = record.read_search(path)
    spent = sum(t.outcome.cost_s for t in stopped.tries)
    assert not tune_sim.same(server.serving, stopped.tries[-1].proposal.candidate) or \
        stop is Killed  # the stop put the best back: the next part's flags need a restart
    began = server.clock.now
    search = drive.run(server.server())
    assert spent + (server.clock.now - began) <= budget
    assert tune_sim.same(server.serving, search.best)


def test_a_try_that_moves_only_the_benchmarks_level_is_measured_without_a_restart(tmp_path):
    """The seed's model with the load searched too (``tune_concurrency``, the benchmark's
    side): the server restarted exactly for the tries whose flags differ from those it runs
    (or after a failure, when those are unknown), never for a try that moves only the level;
    each part measured at its own level on the flags started; one start measures several
    levels."""
    landscape = Landscape.read(SEED_MOE.with_name("seed_concurrency.yaml"), noise_pct=4)
    drive, server = tune_sim.drive(landscape, tmp_path, seed=0)
    applied: list[dict] = []
    levels: list[tuple[int, dict]] = []

    def apply(candidate: dict) -> str:
        applied.append(dict(candidate))
        return server.apply(candidate)

    def measure(length: float, limit_s: float, level: int) -> dict:
        levels.append((level, server_flags(server.serving or {})))
        return server.measure(length, limit_s, level)

    search = drive.run(Server(apply, measure))
    tries = record.read_search(record.record_path(drive.tuned)).tries
    running: dict | None = dict(landscape.start)
    restarted, level_only = [], 0
    for t in tries:
        candidate = t.proposal.candidate
        if not same_server(running, candidate):
            restarted.append(candidate)
        elif candidate["tune_concurrency"] != running["tune_concurrency"]:
            level_only += 1  # the same flags, another level
        # What the server runs after a failed start or part is unknown.
        running = candidate if t.outcome.ended in ("measured", "constraint") else None
    assert applied[:len(restarted)] == restarted  # a restart for each flag change, no other
    assert len(applied) <= len(restarted) + 1     # ... but the end's, back to the best
    benchmarked = [t.proposal.candidate for t in tries if t.outcome.ended not in START_ENDINGS]
    assert levels == [(c["tune_concurrency"], server_flags(c)) for c in benchmarked]
    assert level_only >= 3  # levels measured beside the first on one start, no restart
    assert same_server(server.serving, search.best)
    assert f"at concurrency {search.best['tune_concurrency']}," in drive.tuned.read_text()


LEVELS = """\
space:
  tune_concurrency: [128, 256, 512]
  schedule_policy: [fcfs, lpm]
start: {tune_concurrency: 256, schedule_policy: fcfs, mem_fraction_static: 0.85}
workload: {concurrency: 256, input_len: 1024, output_len: 256, prefill_ms: 300,
           max_p99_ttft_ms: 450}
sglang_defaults: {cap: 4096}
peak_tok_s: 2000
half_running: 120
kv: {weights_fraction: 0.55, tokens_per_fraction: 1280000}  # 300 requests: 512 queue
costs: {start_s: 420, bench_s: 600}
effects:
  schedule_policy: {lpm: {rate: 1.1}}
"""


def test_a_part_outside_the_bound_leaves_the_server_serving_the_next_level_no_restart(
        tmp_path):
    """At 512 the queue breaks the p99 bound (a constraint): the server still serves those
    flags, so 128 is measured on the same start; the first restart is the flag's change."""
    path = tmp_path / "levels.yaml"
    path.write_text(LEVELS)
    landscape = Landscape.read(path, noise_pct=4)
    drive, server = tune_sim.drive(landscape, tmp_path, seed=0, budget_s=4 * 3600)
    again, calls = counting(server)
    search = drive.run(again)
    tries = record.read_search(record.record_path(drive.tuned)).tries
    first = next(i for i, t in enumerate(tries) if t.outcome.start_s > 0)
    assert [(t.proposal.candidate["tune_concurrency"], t.outcome.ended)
            for t in tries[:first] if t.proposal.why != "the server as found"] == \
        [(512, "constraint"), (128, "measured")]  # each one part: clearly worse
    assert calls["apply"][0] == tries[first].proposal.candidate
    assert calls["apply"][0]["schedule_policy"] == "lpm"
    assert search.best["schedule_policy"] == "lpm" and search.best["tune_concurrency"] == 256
    assert same_server(server.serving, search.best)


@pytest.mark.parametrize("hours", [1, 2, 4, 8])
def test_the_budget_is_a_bound_the_end_on_the_best_included(tmp_path, hours):
    landscape = seed_moe()
    drive, server = tune_sim.drive(landscape, tmp_path, seed=5, budget_s=hours * 3600)
    search = drive.run(server.server())
    assert server.clock.now <= hours * 3600  # the last restart, back to the best, included
    assert tune_sim.same(server.serving, search.best)


def test_a_tight_budget_keeps_the_best_measured_at_the_length_it_reached(tmp_path):
    """The search stops within a win's measuring on: the win is kept, at its length."""
    landscape = seed_moe()
    budget = 900 + 570 + 420  # the flags found, one move and a restart back in reserve
    drive, server = tune_sim.drive(landscape, tmp_path, seed=0, budget_s=budget)
    search = drive.run(server.server())
    assert search.best != landscape.start and search.best["max_running_requests"] is None
    assert 0 < search.best_weight < 1
    ended = record.read_search(record.record_path(drive.tuned)).ended
    assert ended["weight"] == search.best_weight and ended["best"] == search.best
    assert f"measured over {search.best_weight:g} of the benchmark" in drive.tuned.read_text()
    assert server.clock.now <= budget


@pytest.mark.parametrize("name", ["seed_moe", "cliff_peak", "two_peaks"])
@pytest.mark.parametrize("hours", [1, 2])
def test_after_hours_of_tries_that_beat_the_start_a_better_best_is_kept(tmp_path, name, hours):
    """1 or 2 h (3 or 7 whole tries) on the landscapes far from their best: never "nothing
    kept"; the flags kept are truly better than the flags found, the server serves them, and
    the record and the tuned file say how much of the benchmark measured them."""
    landscape = Landscape.read(SEED_MOE.with_name(f"{name}.yaml"), noise_pct=4)
    drive, server = tune_sim.drive(landscape, tmp_path, seed=0, budget_s=hours * 3600)
    search = drive.run(server.server())
    assert tune_sim.share(landscape, search.best) > 1.1 * tune_sim.share(landscape,
                                                                         landscape.start)
    assert tune_sim.same(server.serving, search.best)
    ended = record.read_search(record.record_path(drive.tuned)).ended
    assert ended["best"] == search.best and ended["weight"] == search.best_weight > 0
    assert f"measured over {search.best_weight:g} of the benchmark" in drive.tuned.read_text()


def test_a_server_that_hangs_in_the_last_benchmark_ends_serving_the_best(tmp_path):
    """A new best hangs in its own last part, the last before the budget ends (a budget that
    ends while a win is measured on; the part found by a first run of the same seed): it
    drops, the flags the server runs are unknown, so the end restarts the best before it, its
    start checked, within the budget."""
    landscape = seed_moe()
    budget = 900 + 570 + 420 + 300
    drive, server = tune_sim.drive(landscape, tmp_path / "first", seed=6, budget_s=budget)
    parts: list[dict | None] = []
    real = server.measure

    def watched(length: float, limit_s: float, level: int) -> dict:
        parts.append(server.serving)
        return real(length, limit_s, level)

    first = drive.run(Server(server.apply, watched))
    assert tune_sim.same(parts[-1], first.best) and first.best != landscape.start
    drive, server = tune_sim.drive(landscape, tmp_path / "again", seed=6, budget_s=budget)
    real = server.measure
    calls = {"n": 0}

    def hangs_last(length: float, limit_s: float, level: int) -> dict:
        calls["n"] += 1
        if calls["n"] == len(parts):
            server.hung = True  # it answered its start; now it hangs under the load
        return real(length, limit_s, level)

    search = drive.run(Server(server.apply, hangs_last))
    done = record.read_search(record.record_path(drive.tuned))
    # The win whose part hung drops: a try that fails is never the best.
    assert done.tries[-1].outcome.ended == "bench" and search.best == landscape.start
    assert not server.hung and tune_sim.same(server.serving, search.best)
    assert done.ended["serving"] == search.best and server.clock.now <= budget


def test_a_server_found_hung_is_started_again_at_the_end(tmp_path):
    """The server as found hangs in its first part: nothing measured, the flags it runs are
    unknown, so the end starts the flags found again, checked."""
    drive, server = tune_sim.drive(seed_moe(), tmp_path, seed=8, budget_s=3600)
    server.hung = True
    again, calls = counting(server)
    search = drive.run(again)
    assert search.best is None and search.stopped.startswith("the server as found did not")
    assert calls["apply"] == [seed_moe().start] and not server.hung
    assert record.read_search(record.record_path(drive.tuned)).ended["serving"] == seed_moe().start


def test_the_end_falls_back_to_the_flags_found_when_the_best_no_longer_starts(tmp_path):
    landscape = seed_moe()
    drive, server = tune_sim.drive(landscape, tmp_path, seed=7, budget_s=2 * 3600)
    search = Search(landscape.space, landscape.start, 1.0)
    search.best = {**landscape.start, "max_running_requests": None}
    applied = []

    def apply(candidate: dict) -> str:
        applied.append(candidate)
        return "oom" if candidate == search.best else server.apply(candidate)

    assert drive._finish(Server(apply, server.measure), search, landscape.start, None) == \
        landscape.start
    assert applied == [search.best, landscape.start]
    assert tune_sim.same(server.serving, landscape.start)
    # Running the best already, measured: no restart.
    applied.clear()
    assert drive._finish(Server(apply, server.measure), search, landscape.start,
                         dict(search.best)) == search.best and applied == []


@pytest.mark.parametrize("ttft, bound, kept", [
    (500.0, 500.0, True),        # at most the bound: kept
    (500.001, 500.0, False),
    (499.999, 500.0, True),
    (None, 500.0, True),         # no figure: nothing to hold it to
    (10_000.0, None, True),      # no bound
])
def test_the_p99_time_to_first_token_bound_at_its_edge(tmp_path, ttft, bound, kept):
    assert within_bound(ttft, bound) is kept
    drive = Drive({}, {}, 600, tmp_path / "t.yml", 4, max_p99_ttft_ms=bound)
    outcome = drive._outcome({"output_token_throughput": 100.0, "p99_ttft_ms": ttft},
                             {"key": None})
    assert outcome.ended == ("measured" if kept else "constraint")


@pytest.mark.parametrize("row, source", [
    ({"gen_throughput_mean": 90.0, "metrics_scrapes": MIN_SCRAPES,
      "output_token_throughput": 80.0}, "gen_throughput_mean"),
    ({"gen_throughput_mean": 90.0, "metrics_scrapes": MIN_SCRAPES - 1,
      "output_token_throughput": 80.0}, "output_token_throughput"),
    ({"metrics_scrapes": 50, "output_token_throughput": 80.0}, "output_token_throughput"),
    ({"gen_throughput_mean": float("nan"), "metrics_scrapes": 50,
      "output_token_throughput": 80.0}, "output_token_throughput"),
])
def test_the_objective_is_the_servers_steady_state_throughput_where_enough_reads_made_it(
        row, source):
    assert objective_source(row) == source


def test_the_search_and_its_drive_take_bench_low_power_pct_default(tmp_path):
    """One default: a search not given the share (the simulator's, a device run's) takes the
    setting's, as ``make tune`` gives it from the container's settings."""
    from pve_sglang.project import load_defaults

    default = load_defaults()["bench_low_power_pct"]
    assert Search({}, {}, 1.0).low_power_pct == default
    assert Drive({}, {}, 600, tmp_path / "t.yml", 4).low_power_pct == default
