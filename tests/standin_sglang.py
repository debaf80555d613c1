"""A stand-in for ``sglang.launch_server`` (stdlib only): replays real SGLang startup log lines
(tests/fixtures/sglang_logs) to stdout with short, realistic pauses, and serves ``/health``,
``/v1/models`` and ``/v1/chat/completions`` (streamed, with logprobs) once ready.

For the serving benchmark it also serves SGLang's native ``/generate`` (streamed, cumulative
text, ``meta_info.completion_tokens``: what ``bench_serving``'s ``sglang`` backend reads) and
``/get_server_info`` (0.5.9) or ``/server_info`` (0.5.23): the real answer is the whole
``ServerArgs`` at the top level, ``api_key`` included, which the benchmark puts in its JSONL
record; this one holds a few of those fields, with the key from ``SGLANG_API_KEY``.

``python3 standin_sglang.py --logs DIR --port N --case CASE --event-file PATH``; CASE:

+ ``normal``: the whole start, then serve sensible text
+ ``crash-load``: the start up to half the weight shards, then a loader crash; exit 1
+ ``stall-autotune``: the start up to the autotune, two failed-tactic lines, then silence
+ ``oom``: the start up to the CUDA graph capture, then CUDA out of memory; exit 1
+ ``degenerate``: the whole start, then serve a run of ``!`` with null (NaN) logprobs
+ ``headers-then-silence``: the whole start, then a chat completion's (or a ``/generate``'s)
  status and headers, then nothing (the stream stalls; /health stays 200)
+ ``fail-generation``: the whole start, then HTTP 500 to every chat completion and
  ``/generate`` (/health stays 200: a server whose every request fails)
+ ``die-mid-stream``: the whole start, then the first ``/generate`` streams half its tokens
  and the process exits (``os._exit``), its connection closed without the last event
+ ``no-ready-line``: the whole start without its ready line (a release that words it
  otherwise), then serve
+ ``crash-after-ready``: the whole start, serve for ``CRASH_AFTER_S`` (6 s: long enough for the
  deploy's verdict), then exit 1 (a release that fails after it was judged good; each restart
  the same)

``--case-by-release FILE`` takes CASE from FILE (JSON, ``{"0.5.9": "normal", ...}``) for the
sglang release installed beside the Python that runs it (a stand-in release: the venv the
unit's ``venv_path`` link names decides how the server behaves); ``--pause-scale`` shortens
the pauses (0.1: a start of about 3 s).

With ``--enable-metrics`` it serves ``/metrics`` as SGLang does: without the API key
(``sglang/srt/utils/auth.py`` lets ``/metrics`` through), in Prometheus' text format, with
SGLang's real metric names, types, help texts and scheduler labels (``METRICS``, taken from
0.5.23's ``sglang/srt/observability/metrics_collector.py``; the same names and types as 0.5.9's
``sglang/srt/metrics/collector.py``; tests/network/test_server_metrics.py checks them against both
wheels). The figures are the stand-in's own load: ``/generate`` requests are admitted up to
``--max-running`` at once (0: no cap) and while their tokens (prompt and ``max_new_tokens``)
fit in ``--kv-tokens``; the others wait in the queue, as a capped or full server's do.

With ``--landscape FILE`` (``tests/landscapes/*.yaml``, read by ``landscape.py`` beside it) the
server follows from its own flags as the landscape says: SGLang's tuning flags are taken as
SGLang spells them (``--max-running-requests``, ``--mem-fraction-static``,
``--disable-cuda-graph`` or ``--cuda-graph-backend-decode disabled``, ``--cuda-graph-max-bs``
or ``--cuda-graph-max-bs-decode``, ``--moe-runner-backend``, ``--chunked-prefill-size``,
``--schedule-policy``); a candidate the landscape fails starts as the matching case (``oom``,
``start`` -> ``crash-load``, ``stall`` -> ``stall-autotune``, ``degenerate``), another one
admits requests up to the landscape's cap and KV tokens (``--kv-scale`` divides them, so that a
test's few requests fill it) and streams its tokens at ``--token-delay`` over the landscape's
rate.

EVENT-FILE gets the wall time (seconds since the epoch) of the case's event: the exit, the last
line before the silence, or the degenerate answer. Not a mock of the deploy: a server process
the deploy's own unit runs, whose output reaches the journal as SGLang's does.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

READY = "The server is fired up and ready to roll!"
STATE = {"ready": False}
SCALE = {"pause": 1.0}
#: How long ``crash-after-ready`` serves before it exits.
CRASH_AFTER_S = 6.0

#: SGLang's scheduler metrics the stand-in serves: name -> (type, help), as 0.5.23 declares
#: them (``SchedulerMetricsCollector``: ``Gauge(name=..., documentation=...)``, ``Counter``).
METRICS = {
    "sglang:num_running_reqs": ("gauge", "The number of running requests."),
    "sglang:num_queue_reqs": ("gauge", "The number of requests in the waiting queue."),
    "sglang:gen_throughput": ("gauge", "The generation throughput (token/s)."),
    "sglang:cache_hit_rate": ("gauge", "The prefix cache hit rate."),
    "sglang:token_usage": ("gauge", "The token usage."),
    "sglang:num_used_tokens": ("gauge", "The number of used tokens."),
    "sglang:max_total_num_tokens": ("gauge", "Maximum total number of tokens in the KV cache pool."),
    "sglang:prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "sglang:generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "sglang:num_requests_total": ("counter", "Number of requests processed."),
}
#: The scheduler's labels (0.5.23 ``metrics_collector.py``: model_name, engine_type, tp_rank,
#: pp_rank, moe_ep_rank); counters add ``is_streaming``.
LABELS = {"model_name": "standin-model", "engine_type": "unified", "tp_rank": "0",
          "pp_rank": "0", "moe_ep_rank": "0"}


class Load:
    """The requests the stand-in runs and queues, and the KV cache tokens they hold."""

    #: ``sglang:gen_throughput`` is SGLang's recent generation rate (its scheduler sets it from
    #: the tokens of its last decode log interval), not an average since the start: the tokens
    #: of the requests that ended in the last this many seconds.
    RECENT_S = 1.0

    def __init__(self, max_running: int = 0, kv_tokens: int = 1_000_000):
        self.max_running, self.kv_tokens = max_running, kv_tokens
        self.running = self.queued = self.used = 0
        self.prompt_total = self.generated_total = self.requests_total = 0
        self.started = time.monotonic()
        self.recent: list[tuple[float, int]] = []
        self.rate = 0.0
        self._cond = threading.Condition()

    def _fits(self, tokens: int) -> bool:
        if self.running == 0:  # one request too large for the pool still runs alone
            return True
        capped = self.max_running and self.running >= self.max_running
        return not capped and self.used + tokens <= self.kv_tokens

    def admit(self, tokens: int) -> None:
        """Wait in the queue until a request holding TOKENS fits."""
        with self._cond:
            self.queued += 1
            self._cond.wait_for(lambda: self._fits(tokens))
            self.queued -= 1
            self.running += 1
            self.used += tokens

    def done(self, tokens: int, prompt: int, generated: int) -> None:
        with self._cond:
            self.running -= 1
            self.used -= tokens
            self.prompt_total += prompt
            self.generated_total += generated
            self.requests_total += 1
            now = time.monotonic()
            self.recent = [(t, n) for t, n in self.recent if t > now - self.RECENT_S]
            self.recent.append((now, generated))
            # Over the last RECENT_S, or since the first request when that is shorter; kept
            # while idle, as SGLang keeps its last interval's.
            span = min(self.RECENT_S, max(now - self.started, 1e-6))
            self.rate = sum(n for _, n in self.recent) / span
            self._cond.notify_all()

    def exposition(self) -> str:
        """The metrics in Prometheus' text format (version 0.0.4), as prometheus_client
        renders SGLang's: HELP, TYPE, one sample per label set, counters with ``_total``."""
        with self._cond:
            values = {
                "sglang:num_running_reqs": self.running,
                "sglang:num_queue_reqs": self.queued,
                "sglang:gen_throughput": self.rate,
                "sglang:cache_hit_rate": 0.0,
                "sglang:token_usage": self.used / self.kv_tokens,
                "sglang:num_used_tokens": self.used,
                "sglang:max_total_num_tokens": self.kv_tokens,
                "sglang:prompt_tokens_total": self.prompt_total,
                "sglang:generation_tokens_total": self.generated_total,
                "sglang:num_requests_total": self.requests_total,
            }
        out = []
        for name, (kind, doc) in METRICS.items():
            family = name[:-len("_total")] if kind == "counter" else name
            labels = {**LABELS, **({"is_streaming": "true"} if kind == "counter" else {})}
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            out += [f"# HELP {family} {doc}", f"# TYPE {family} {kind}",
                    f"{name}{{{text}}} {float(values[name])}"]
        return "\n".join(out) + "\n"


LOAD = Load()
METRICS_ON = {"on": False}


def lines(logs: Path, name: str) -> list[str]:
    return [line for line in (logs / name).read_text().splitlines() if not line.startswith("#")]


def say(line: str) -> None:
    # tqdm's bar (sglang's BAR_FORMAT ends in "\n") starts with a carriage return.
    sys.stdout.write(("\r" + line if line.startswith("Loading safetensors") else line) + "\n")
    sys.stdout.flush()


def mark(event_file: str) -> None:
    Path(event_file).write_text(f"{time.time():.6f}\n")


def pause(line: str) -> float:
    """Seconds before LINE: shards stream, the autotune and the graph capture take a while."""
    if line.startswith("Loading safetensors"):
        return 0.15 * SCALE["pause"]
    if "FlashInfer autotune completed" in line or "Capture cuda graph end" in line:
        return 0.8 * SCALE["pause"]
    if READY in line:
        return 0.5 * SCALE["pause"]
    return 0.02 * SCALE["pause"]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    case = "normal"
    event_file = ""
    key = os.environ.get("SGLANG_API_KEY", "")

    def _send(self, code: int, body: bytes = b"", kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorised(self) -> bool:
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self._send(401, b'{"error": "unauthorised"}')
            return False
        return True

    def do_GET(self) -> None:
        if self.path == "/metrics":  # no key asked, as SGLang's; no route without the flag
            if not METRICS_ON["on"]:
                self._send(404, b'{"detail": "Not Found"}')
                return
            self._send(200, LOAD.exposition().encode(), "text/plain; version=0.0.4; charset=utf-8")
            return
        if self.path == "/health":  # no key asked either (sglang/srt/utils/auth.py)
            self._send(200 if STATE["ready"] else 503)
            return
        if not self._authorised():
            return
        if self.path in ("/get_server_info", "/server_info"):
            self._send(200, json.dumps(server_info(self.key)).encode())
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": "standin-model", "object": "model"}]}).encode())
        else:
            self._send(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if not self._authorised():
            return
        generation = self.path in ("/generate", "/v1/chat/completions")
        if generation and STATE["ready"] and self.case == "fail-generation":
            self._send(500, b'{"object": "error", "message": "Internal server error", '
                            b'"type": "InternalServerError", "code": 500}')
            return
        if self.path == "/generate" and STATE["ready"] and self.case != "headers-then-silence":
            self._generate(request)
            return
        if not generation or not STATE["ready"]:
            self._send(404 if STATE["ready"] else 503)
            return
        if self.case == "headers-then-silence":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.flush()
            mark(self.event_file)
            time.sleep(3600)
            return
        if self.case == "degenerate":
            tokens, logprob = ["!"] * min(24, request.get("max_tokens", 24)), None
        else:
            tokens, logprob = re.findall(r"\S+\s*", "Red, blue and yellow are the primary colours."), -0.05
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        time.sleep(0.05)  # prefill
        for token in tokens:
            chunk = {"choices": [{"index": 0, "delta": {"content": token},
                                  "logprobs": {"content": [{"token": token, "logprob": logprob}]}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.01)
        usage = {"choices": [], "usage": {"completion_tokens": len(tokens)}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True
        if self.case == "degenerate":
            mark(self.event_file)

    def _generate(self, request: dict) -> None:
        """SGLang's native streamed answer: each event holds the whole text so far."""
        count = int(request.get("sampling_params", {}).get("max_new_tokens") or 16)
        prompt = request.get("text", request.get("input_ids")) or ""
        # Whitespace words: the test's tokenizer is a word-level one.
        prompt_tokens = len(prompt.split()) if isinstance(prompt, str) else len(prompt)
        held = prompt_tokens + count
        LOAD.admit(held)
        try:
            if request.get("stream"):
                self._stream(count, prompt_tokens)
            else:
                self._whole(count, prompt_tokens)
        finally:
            LOAD.done(held, prompt_tokens, count)

    def _stream(self, count: int, prompt_tokens: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        time.sleep(0.02)  # prefill
        text = ""
        for n in range(1, count + 1):
            if self.case == "die-mid-stream" and n > count // 2:
                mark(self.event_file)
                os._exit(1)
            text += f"w{n % 200} "
            event = {"text": text, "meta_info": {"id": "standin", "completion_tokens": n,
                                                 "prompt_tokens": prompt_tokens, "cached_tokens": 0}}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
            time.sleep(SCALE.get("token", 0.005))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _whole(self, count: int, prompt_tokens: int) -> None:
        """SGLang's native answer to a request that does not stream: one JSON object, sent
        once every token is made (a server that dies meanwhile sends nothing)."""
        time.sleep(0.02)  # prefill
        for n in range(1, count + 1):
            if self.case == "die-mid-stream" and n > count // 2:
                mark(self.event_file)
                os._exit(1)
            time.sleep(SCALE.get("token", 0.005))
        text = "".join(f"w{n % 200} " for n in range(1, count + 1))
        self._send(200, json.dumps({
            "text": text, "meta_info": {"id": "standin", "finish_reason": {"type": "length",
                                                                           "length": count},
                                        "prompt_tokens": prompt_tokens,
                                        "completion_tokens": count, "cached_tokens": 0}}).encode())

    def log_message(self, *args) -> None:  # sglang logs requests; not needed here
        pass


class Server(http.server.ThreadingHTTPServer):
    """socketserver's listen backlog is 5: a client opening dozens of connections at once (a
    gateway) would see SYNs dropped and retried a second later. SGLang's uvicorn listens with
    a backlog of 2048."""

    request_queue_size = 2048


def server_info(key: str) -> dict:
    """A few ``ServerArgs`` fields, as ``/get_server_info`` flattens them, and its extras."""
    return {"model_path": "/models/standin", "tokenizer_path": "/models/standin", "port": 30000,
            "api_key": key or None, "tp_size": 1, "served_model_name": "standin-model",
            "internal_states": [{"avg_spec_accept_length": None}], "version": "standin"}


#: A landscape's failure -> the case that shows it.
FAILURE_CASES = {"oom": "oom", "start": "crash-load", "stall": "stall-autotune",
                 "degenerate": "degenerate"}


def sglang_candidate(flags: list[str]) -> dict:
    """The tuning settings SGLang's flags FLAGS set (both spellings of each release)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-running-requests", type=int)
    parser.add_argument("--mem-fraction-static", type=float)
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--cuda-graph-backend-decode")
    parser.add_argument("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", type=int)
    parser.add_argument("--moe-runner-backend")
    parser.add_argument("--chunked-prefill-size", type=int)
    parser.add_argument("--schedule-policy")
    known, _ = parser.parse_known_args(flags)
    return {"max_running_requests": known.max_running_requests,
            "mem_fraction_static": known.mem_fraction_static,
            "disable_cuda_graph": known.disable_cuda_graph
            or known.cuda_graph_backend_decode == "disabled",
            "cuda_graph_max_bs": known.cuda_graph_max_bs,
            "moe_runner_backend": known.moe_runner_backend,
            "chunked_prefill_size": known.chunked_prefill_size,
            "schedule_policy": known.schedule_policy}


def landscape_server(args: argparse.Namespace, flags: list[str]) -> None:
    """Set ARGS (case, cap, KV tokens, pace) from the landscape and the server's FLAGS."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from landscape import Landscape

    landscape = Landscape.read(args.landscape)
    candidate = sglang_candidate(flags)
    ended = landscape.failure(candidate)
    if ended:
        args.case = FAILURE_CASES[ended]
        return
    args.max_running = (candidate["max_running_requests"]
                        or landscape.data["sglang_defaults"]["cap"])
    args.kv_tokens = max(1, int(landscape.kv_tokens(candidate) / args.kv_scale))
    args.token_delay /= landscape.rate(candidate)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs", required=True, type=Path)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--case", default="normal")
    parser.add_argument("--event-file", required=True)
    parser.add_argument("--case-by-release", type=Path)
    parser.add_argument("--pause-scale", type=float, default=1.0)
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument("--max-running", type=int, default=0)
    parser.add_argument("--kv-tokens", type=int, default=1_000_000)
    parser.add_argument("--token-delay", type=float, default=0.005)
    parser.add_argument("--landscape", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kv-scale", type=float, default=1.0)
    args, sglang_flags = parser.parse_known_args()
    if sglang_flags and not args.landscape:  # SGLang's own flags only mean something there
        parser.error(f"unrecognized arguments: {' '.join(sglang_flags)}")
    if args.landscape:
        landscape_server(args, sglang_flags)
    SCALE["pause"] = args.pause_scale
    SCALE["token"] = args.token_delay
    METRICS_ON["on"] = args.enable_metrics
    LOAD.max_running, LOAD.kv_tokens = args.max_running, args.kv_tokens
    if args.case_by_release:
        import importlib.metadata

        release = importlib.metadata.version("sglang")
        args.case = json.loads(args.case_by_release.read_text()).get(release, "normal")
        say(f"stand-in of sglang {release}: {args.case}")
    Handler.case, Handler.event_file = args.case, args.event_file
    server = Server((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    for line in lines(args.logs, "startup_tp8.log"):
        shards = re.search(r"\| (\d+)/(\d+) \[", line)
        if args.case == "crash-load" and shards and int(shards[1]) * 2 >= int(shards[2]):
            say(line)
            for crash in lines(args.logs, "crash_load.log"):
                say(crash)
            mark(args.event_file)
            return 1
        if args.case == "stall-autotune" and "FlashInfer autotune completed" in line:
            for tactic in lines(args.logs, "hint_sm120-autotune.log"):
                say(tactic)
            mark(args.event_file)
            time.sleep(3600)
            return 0
        if args.case == "oom" and "Capture cuda graph begin" in line:
            say(line)
            time.sleep(0.3)
            for oom in lines(args.logs, "hint_cuda-oom.log"):
                say(oom)
            mark(args.event_file)
            return 1
        time.sleep(pause(line))
        if args.case == "no-ready-line" and READY in line:
            mark(args.event_file)
            continue
        say(line)
    STATE["ready"] = True
    if args.case == "crash-after-ready":
        time.sleep(CRASH_AFTER_S)
        say("Scheduler hit an exception: Traceback (most recent call last): RuntimeError: "
            "CUDA error: an illegal memory access was encountered")
        mark(args.event_file)
        sys.stdout.flush()
        os._exit(1)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
