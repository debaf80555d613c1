"""The server's /metrics during the benchmark: the sampler run inside the container
(``remote/server_metrics.py``, its answer parsed by the real ``prometheus_client`` parser) and the
row values the deploy keeps (``bench.metric_columns``).

The end-to-end cases run the real sampler script around a load of concurrent ``/generate``
requests (``LOAD``) against the stand-in server (``tests/standin_sglang.py``, started by
``standin``: both from tests/standin_process.py; tests/network/test_server_metrics.py checks the
stand-in's metric names against SGLang's real collector sources), which queues requests past its cap or past its KV
cache as SGLang's scheduler does, and serves the load it holds under SGLang's own metric names and
types.
"""

from __future__ import annotations

import http.server
import io
import re
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from pve_sglang.remote import SERVER_METRICS, marked_json, server_metrics, source
from pve_sglang.server import bench_hints
from pve_sglang.server.bench import MAIN_RUN_MARKER, RESULT_HEADER, metric_columns, metrics_argv, metrics_problem
from standin_process import LOAD, standin

TESTS = Path(__file__).resolve().parents[1]

EXPOSITION = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0",dp_rank="0"} 12.0
sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0",dp_rank="1"} 20.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",tp_rank="0",dp_rank="0"} 3.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",tp_rank="0",dp_rank="1"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",tp_rank="0",dp_rank="0"} 0.5
sglang:token_usage{engine_type="unified",model_name="m",tp_rank="0",dp_rank="1"} 0.93
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="m",tp_rank="0",dp_rank="0"} NaN
# HELP sglang:prompt_tokens Number of prefill tokens processed.
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{engine_type="unified",model_name="m",is_streaming="true"} 1024.0
"""


# --- the parser's side: one answer ----------------------------------------------------------


def test_figures_join_the_series_of_each_gauge():
    """Requests add up over the schedulers that report (DP ranks); token usage is the fullest
    one's; a NaN hit rate is dropped; counters and other names are not read."""
    assert server_metrics.figures(EXPOSITION) == {
        "running_reqs": 32.0, "queue_reqs": 7.0, "token_usage": 0.93}


@pytest.mark.parametrize("text, words", [
    ("sglang:num_running_reqs{a=\"b\" 1\n", "line 1: 'sglang:num_running_reqs{a=\"b\" 1'"),
    ("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n"
     "sglang:num_queue_reqs $(reboot)\n", "line 3: 'sglang:num_queue_reqs $(reboot)'"),
    ("sglang:token_usage 0.5 garbage\n", "line 1:"),
])
def test_a_malformed_line_is_named_by_its_number(text, words):
    with pytest.raises(server_metrics.MetricsError) as error:
        server_metrics.figures(text)
    assert str(error.value).startswith("malformed /metrics answer: ")
    assert words in str(error.value)


def test_only_the_figures_lines_are_read():
    """A malformed line about another metric is not read (the parser is pure Python: a TP-8
    server's histograms would cost more than the interval); a family given in two groups, as
    a hostile or odd exporter may, adds up all the same."""
    text = ("sglang:e2e_request_latency_seconds_bucket{le= garbage\n"
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank=\"0\"} 3\n"
            "# TYPE sglang:num_running_reqs_offline_batch gauge\n"
            "sglang:num_running_reqs_offline_batch 100\n"
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank=\"1\"} 4\n")
    assert server_metrics.figures(text) == {"running_reqs": 7.0}
    kept = server_metrics.relevant(text).split("\n")
    assert kept[0] == "" and kept[2] == 'sglang:num_running_reqs{tp_rank="0"} 3' and kept[4] == ""


def test_a_known_name_of_another_type_is_refused():
    text = "# TYPE sglang:num_running_reqs counter\nsglang:num_running_reqs_total 5\n"
    with pytest.raises(server_metrics.MetricsError, match="sglang:num_running_reqs is a counter, not a gauge"):
        server_metrics.figures(text)


def test_summarise_gives_mean_min_max_per_figure():
    summary = server_metrics.summarise([{"running_reqs": 4, "token_usage": 0.5},
                                        {"running_reqs": 8, "queue_reqs": 2, "token_usage": 0.7}])
    assert summary["running_reqs"] == {"scrapes": 2, "mean": 6.0, "min": 4, "max": 8}
    assert summary["queue_reqs"] == {"scrapes": 1, "mean": 2.0, "min": 2, "max": 2}
    assert summary["token_usage"]["max"] == 0.7 and "cache_hit_rate" not in summary


@pytest.mark.parametrize("sampled, row", [
    (None, {}),
    ([1, 2], {}),
    ({"scrapes": 0, "figures": {}, "error": "no scrape in the window"}, {}),
    ({"scrapes": 3, "figures": {"running_reqs": {"mean": 6.0, "max": 8.0, "min": 4.0},
                                "queue_reqs": {"mean": 2.5, "max": 4.0},
                                "token_usage": {"mean": 0.6, "max": "0.9"},
                                "cache_hit_rate": {"mean": float("nan")}}},
     {"metrics_scrapes": 3, "running_reqs_mean": 6.0, "running_reqs_max": 8.0,
      "queue_reqs_mean": 2.5, "queue_reqs_max": 4.0, "token_usage_mean": 0.6}),
])
def test_metric_columns_keep_finite_numbers_only(sampled, row):
    """The summary came from the container: a string or a NaN is not a figure."""
    assert metric_columns(sampled) == row


def test_metrics_problem_is_printable_and_bounded():
    assert metrics_problem({"figures": {"running_reqs": {}}}) is None
    shown = metrics_problem({"error": "bad \x1b[31mred\x1b[0m\n" + "x" * 1000})
    assert shown.startswith("bad ?[31mred?[0m?") and len(shown) == 300


START, STOP = MAIN_RUN_MARKER, RESULT_HEADER.strip()


# lines of the command's output, one a second from 1 -> the window's (start, stop); the GPU
# sampler's window is read on the same table (test_bench_gpu_sampler.py)
WINDOWS = [
    (["warming up", f"{START}...", "running", f"==={STOP}===", "figures"], (2, 4)),
    # no stop marker: open (to the command's end)
    (["warming up", f"{START}...", "figures"], (2, None)),
    # the stop marker before the start marker does not count; a line holding both only starts
    ([f"==={STOP}===", f"{START}...", f"==={STOP}==="], (2, 3)),
    ([f"{START} {STOP}", "running", f"==={STOP}==="], (1, 3)),
    # the first of each counts
    ([f"{START}...", f"{START}...", f"==={STOP}===", f"==={STOP}==="], (1, 3)),
    # no start marker: no window of its own
    (["warming up", f"==={STOP}==="], (None, None)),
]


@pytest.mark.parametrize("lines, marks", WINDOWS)
def test_the_window_opens_at_the_first_start_and_closes_at_the_first_stop_after_it(lines, marks):
    window = server_metrics.Window(START, STOP)
    for second, line in enumerate(lines, 1):
        window.see(line + "\n", float(second))
    assert (window.start, window.stop) == marks


@pytest.mark.parametrize("marks, bounds", [
    ((2.0, 4.0), (2.0, 4.0)),
    ((2.0, None), (2.0, 9.0)),   # to the command's end
    ((None, None), (0.5, 9.0)),  # the whole command
])
def test_the_window_bounds(marks, bounds):
    window = server_metrics.Window(START, STOP, *marks)
    assert window.bounds(0.5, 9.0) == bounds


def test_no_marker_given_no_window():
    window = server_metrics.Window(None, None)
    for line in (START, STOP):
        window.see(line, 1.0)
    assert (window.start, window.stop) == (None, None)


@pytest.mark.parametrize("when, kept", [(1.99, False), (2.0, True), (2.01, True), (3.99, True),
                                        (4.0, True), (4.01, False)])
def test_a_scrape_counts_within_the_window_both_ends_included(when, kept):
    assert server_metrics.inside([(when, "scrape")], (2.0, 4.0)) == (["scrape"] if kept else [])


@pytest.mark.parametrize("length, shown", [(199, "x" * 199), (200, "x" * 200),
                                           (201, "x" * 200 + "...")])
def test_a_message_is_cut_after_200_characters(length, shown):
    """MESSAGE_CHARS: what a failed scrape quotes of an answer."""
    assert server_metrics._short("x" * length) == shown


@pytest.mark.parametrize("line, kept", [
    ("# HELP sglang:num_running_reqs", True),  # three words: names its metric
    ("# HELP sglang:num_running_reqs The number of running requests.", True),
    ("# sglang:num_running_reqs", False),      # a plain comment
    ("# HELP sglang:num_running_reqs_offline_batch x", False),
])
def test_a_comment_line_is_kept_when_its_third_word_is_a_figure(line, kept):
    assert server_metrics.relevant(line) == (line if kept else "")


# --- hostile answers over HTTP --------------------------------------------------------------


class _Answer(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self):
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@contextmanager
def answering(body: bytes, status: int = 200):
    handler = type("Handler", (_Answer,), {"body": body, "status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("body, status, words", [
    (b"# TYPE x gauge\n" + b"x 1\n" * (server_metrics.MAX_BYTES // 4 + 1), 200, "is larger than"),
    (b"sglang:num_running_reqs \xff\xfe\n", 200, "is not UTF-8 (byte 24)"),
    (b"not found", 404, "HTTP 404 from http://127.0.0.1:"),
])
def test_a_hostile_or_missing_answer_gives_a_clear_message(body, status, words):
    with answering(body, status) as url:
        with pytest.raises(server_metrics.MetricsError, match=re.escape(words)):
            server_metrics.scrape(url, 5)


@pytest.mark.parametrize("extra, refused", [(0, False), (1, True)])
def test_an_answer_of_max_bytes_is_read_one_byte_more_is_refused(extra, refused):
    body = b"# " + b"x" * (server_metrics.MAX_BYTES - 3) + b"\n" * (1 + extra)  # a comment
    assert len(body) == server_metrics.MAX_BYTES + extra
    with answering(body) as url:
        if refused:
            with pytest.raises(server_metrics.MetricsError, match="is larger than 8388608 bytes"):
                server_metrics.scrape(url, 10)
        else:
            assert server_metrics.scrape(url, 10) == {}


#: The arguments both samplers refuse, by one check (``server_metrics.wrapped``); the GPU
#: sampler is run on them too (test_bench_gpu_sampler.py). The command follows ``--`` but where
#: none is given.
SAMPLER_REFUSALS = [
    (["--interval-ms", "0"], "--interval-ms must be >= 1"),
    (["--interval-ms", "1"], "no command given"),
    (["--interval-ms", "1", "--"], "no command given"),
]


@pytest.mark.parametrize("args, words", [
    *SAMPLER_REFUSALS,
    (["--interval-ms", "1", "--url", "ftp://127.0.0.1/metrics"], "must be an http:// or https://"),
    (["--interval-ms", "1", "--url", "file:///etc/passwd"], "must be an http:// or https://"),
])
def test_bad_arguments_are_refused_before_anything_runs(args, words, capsys):
    argv = ["--url", "http://127.0.0.1:9/metrics", *args]
    argv += ["--", sys.executable, "-c", "pass"] if "no command" not in words else []
    with pytest.raises(SystemExit) as stopped:
        server_metrics.main(argv)
    assert stopped.value.code == 2 and words in capsys.readouterr().err


def test_an_interval_of_one_ms_is_taken(capsys):
    """The least interval (1 ms) runs the command."""
    with answering(b"", 404) as url:
        code = server_metrics.main(["--url", url, "--interval-ms", "1", "--", sys.executable,
                                    "-c", "print('bench')"])
    out = capsys.readouterr().out
    assert code == 0 and "bench\n" in out
    summary = marked_json(server_metrics.SUMMARY_PREFIX, out)
    assert summary["window"] == "whole command" and summary["interval_ms"] == 1


def test_the_docs_state_the_size_limit_of_the_code():
    """docs/how-a-run-works.md and docs/troubleshooting.md write MAX_BYTES out."""
    limit = f"{server_metrics.MAX_BYTES / 2**20:g} MiB"
    for page, words in (("how-a-run-works.md", f"at most {limit}"),
                        ("troubleshooting.md", f"an answer over {limit}")):
        assert words in re.sub(r"\s+", " ", (TESTS.parent / "docs" / page).read_text()), page


def test_a_404_hints_at_the_missing_flag():
    with answering(b"", 404) as url:
        with pytest.raises(server_metrics.MetricsError, match="without --enable-metrics"):
            server_metrics.scrape(url, 5)


def test_a_server_that_never_answers_well_is_an_error_in_the_summary_not_a_failure():
    """The benchmark's own exit status stands; the summary says why no figure came."""
    with answering(b"sglang:token_usage{ 1\n") as url:
        done = subprocess.run(
            [sys.executable, str(source(SERVER_METRICS)), "--url", url, "--interval-ms", "50",
             "--", sys.executable, "-c", "import time; print('bench'); time.sleep(0.4)"],
            capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    summary = marked_json(server_metrics.SUMMARY_PREFIX, done.stdout)
    assert summary["scrapes"] == 0 and summary["figures"] == {}
    assert summary["error"].startswith("no scrape in the window; the last said: malformed "
                                       "/metrics answer: line 1: 'sglang:token_usage{ 1'")
    assert metric_columns(summary) == {}


class _Phases(http.server.BaseHTTPRequestHandler):
    """/metrics: 1 running request until the second scrape that arrives after the sampler wrote
    out the stop marker's line, 100 from then on (a scrape that arrives just after that line
    may have begun before it; the second began after the first had its answer). /state?NAME:
    a counter, for the command to wait on."""

    lock = threading.Lock()
    seen: dict = {}

    def do_GET(self):
        with self.lock:
            if self.path == "/metrics":
                for phase in ("after_start", "after_stop"):
                    self.seen[phase] += self.seen[phase.replace("after", "saw")]
                running = 100 if self.seen["after_stop"] >= 2 else 1
                self.seen["answered_100"] += running == 100
                body = (f"# TYPE sglang:num_running_reqs gauge\n"
                        f"sglang:num_running_reqs {running}\n").encode()
            else:
                body = str(self.seen[self.path.split("?", 1)[1]]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Output(io.StringIO):
    """The sampler's output; notes when the true window's first start and first stop after it
    have been written out (the sampler writes a line after it has read it)."""

    def __init__(self, seen: dict):
        super().__init__()
        self.seen = seen

    def write(self, text: str) -> int:
        with _Phases.lock:
            if START in text and not self.seen["saw_start"]:
                self.seen["saw_start"] = 1
            elif STOP in text and self.seen["saw_start"] and not self.seen["saw_stop"]:
                self.seen["saw_stop"] = 1
        return super().write(text)


PHASED_LOAD = f"""
import sys, time, urllib.request
url = sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))

def wait(name, count):
    deadline = time.monotonic() + 60
    while int(opener.open(url + "/state?" + name, timeout=10).read()) < count:
        assert time.monotonic() < deadline, name
        time.sleep(0.01)

print("==={STOP}=== (a stop marker before the start: not the end)", flush=True)
print("{START}...", flush=True)
wait("after_start", 2)
print("==={STOP}===", flush=True)
wait("answered_100", 2)
print("{START} (again: not a new start)", flush=True)
print("==={STOP}=== (again: not the end)", flush=True)
"""


def test_the_stop_marker_ends_the_window_of_the_real_sampler():
    """The sampler around a command that prints the stop marker once before the start, then
    the start, then (after scrapes of 1 running request) the stop, then waits for scrapes of
    100 and prints both markers again: the figures are those of the window, 1 running."""
    seen = dict.fromkeys(("saw_start", "saw_stop", "after_start", "after_stop", "answered_100"), 0)
    handler = type("Handler", (_Phases,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    out = _Output(seen)
    try:
        code = server_metrics.run([sys.executable, "-c", PHASED_LOAD, url], url + "/metrics", 20,
                                  START, STOP, out)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0 and seen["answered_100"] >= 2, out.getvalue()
    summary = marked_json(server_metrics.SUMMARY_PREFIX, out.getvalue())
    assert summary["window"] == "benchmark" and summary["scrapes"] >= 1, summary
    assert summary["figures"]["running_reqs"]["max"] == 1, summary


# --- end to end: the sampler around a load against the stand-in server ---------------------


def sampled_level(url: str, concurrency: int, key: str = "sk-standin", seconds: float = 2.5) -> dict:
    """One level's row values: the real sampler around LOAD at CONCURRENCY."""
    argv = metrics_argv(sys.executable, str(source(SERVER_METRICS)), url + "/metrics", 100,
                        [sys.executable, "-c", LOAD, url, key, str(concurrency), str(seconds)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = marked_json(server_metrics.SUMMARY_PREFIX, done.stdout)
    assert summary["window"] == "benchmark" and "error" not in summary, summary
    return {"concurrency": concurrency, **metric_columns(summary)}


def test_standin_serves_metrics_without_the_key_as_sglang(tmp_path):
    """/metrics answers without the key, /v1/models does not (SGLang's auth.py)."""
    with standin(tmp_path, "--enable-metrics") as url:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
            text = answer.read().decode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "/v1/models", timeout=5)
    assert refused.value.code == 401
    assert server_metrics.figures(text) == {"running_reqs": 0.0, "queue_reqs": 0.0,
                                            "token_usage": 0.0, "cache_hit_rate": 0.0,
                                            "gen_throughput": 0.0}
    assert "sk-standin" not in text


def test_a_capped_server_reads_as_capped(tmp_path):
    """Running requests flat at the stand-in's cap of 4 under 12 concurrent clients, the rest
    queued, the KV cache far from full: the cap hint, naming max_running_requests."""
    # The window opens at the warmup line, before the 12 clients' first requests: on a loaded
    # machine its first scrapes read fewer than 4 running (a mean of 3.54 over 2.5 s, seen in a
    # full run). A benchmark's minutes make that start negligible; 6 s keeps it small here.
    with standin(tmp_path, "--enable-metrics", "--max-running", "4") as url:
        row = sampled_level(url, 12, seconds=6)
    assert row["running_reqs_max"] == 4 and row["running_reqs_mean"] >= 3.6, row
    # 8 wait at once at most; on a loaded machine a client sends its next request late, so
    # the mean stays below 8 (5.2 seen under a full test run beside other work).
    assert row["queue_reqs_max"] >= 6 and row["queue_reqs_mean"] >= 2, row
    assert row["token_usage_max"] < 0.01
    assert bench_hints.capped(row) and not bench_hints.kv_bound(row)
    [hint] = bench_hints.row_hints(row, {"max_running_requests": 4}, 60)
    assert "concurrency 12: 4 running (at most 4)" in hint and "max_running_requests: 4" in hint


def test_a_full_kv_cache_reads_as_kv_bound(tmp_path):
    """A pool of 640 tokens holds five requests of 64 + 64 tokens: usage at 1 with a queue."""
    with standin(tmp_path, "--enable-metrics", "--kv-tokens", "640") as url:
        row = sampled_level(url, 12)
    assert row["running_reqs_max"] == 5 and row["token_usage_max"] == 1.0, row
    assert bench_hints.kv_bound(row) and not bench_hints.capped(row)
    [hint] = bench_hints.row_hints(row, {"mem_fraction_static": 0.92, "tp_size": None}, 60)
    assert "KV cache use reached 1.00" in hint and "mem_fraction_static: 0.92" in hint


def test_an_unbounded_server_earns_no_hint(tmp_path):
    with standin(tmp_path, "--enable-metrics") as url:
        row = sampled_level(url, 6)
    assert row["running_reqs_max"] == 6 and row["queue_reqs_max"] == 0, row
    assert bench_hints.row_hints(row, {}, 60) == []


def test_metrics_off_is_a_clear_summary_error(tmp_path):
    """A server started without --enable-metrics (enable_metrics: false) answers 404."""
    with standin(tmp_path) as url:
        argv = metrics_argv(sys.executable, str(source(SERVER_METRICS)), url + "/metrics", 100,
                            [sys.executable, "-c", LOAD, url, "sk-standin", "2", "0.5"])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    summary = marked_json(server_metrics.SUMMARY_PREFIX, done.stdout)
    assert done.returncode == 0 and summary["scrapes"] == 0
    assert "HTTP 404" in summary["error"] and "without --enable-metrics" in summary["error"]
