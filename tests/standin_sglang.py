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
+ ``headers-then-silence``: the whole start, then a chat completion's status and headers,
  then nothing (the stream stalls; /health stays 200)
+ ``no-ready-line``: the whole start without its ready line (a release that words it
  otherwise), then serve
+ ``crash-after-ready``: the whole start, serve for ``CRASH_AFTER_S`` (6 s: long enough for the
  deploy's verdict), then exit 1 (a release that fails after it was judged good; each restart
  the same)

``--case-by-release FILE`` takes CASE from FILE (JSON, ``{"0.5.9": "normal", ...}``) for the
sglang release installed beside the Python that runs it (a stand-in release: the venv the
unit's ``venv_path`` link names decides how the server behaves); ``--pause-scale`` shortens
the pauses (0.1: a start of about 3 s).

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
        if not self._authorised():
            return
        if self.path == "/health":
            self._send(200 if STATE["ready"] else 503)
        elif self.path in ("/get_server_info", "/server_info"):
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
        if self.path == "/generate" and STATE["ready"]:
            self._generate(request)
            return
        if self.path != "/v1/chat/completions" or not STATE["ready"]:
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
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        time.sleep(0.02)  # prefill
        text = ""
        for n in range(1, count + 1):
            text += f"w{n % 200} "
            event = {"text": text, "meta_info": {"id": "standin", "completion_tokens": n,
                                                 "prompt_tokens": prompt_tokens, "cached_tokens": 0}}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.005)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:  # sglang logs requests; not needed here
        pass


def server_info(key: str) -> dict:
    """A few ``ServerArgs`` fields, as ``/get_server_info`` flattens them, and its extras."""
    return {"model_path": "/models/standin", "tokenizer_path": "/models/standin", "port": 30000,
            "api_key": key or None, "tp_size": 1, "served_model_name": "standin-model",
            "internal_states": [{"avg_spec_accept_length": None}], "version": "standin"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs", required=True, type=Path)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--case", default="normal")
    parser.add_argument("--event-file", required=True)
    parser.add_argument("--case-by-release", type=Path)
    parser.add_argument("--pause-scale", type=float, default=1.0)
    args = parser.parse_args()
    SCALE["pause"] = args.pause_scale
    if args.case_by_release:
        import importlib.metadata

        release = importlib.metadata.version("sglang")
        args.case = json.loads(args.case_by_release.read_text()).get(release, "normal")
        say(f"stand-in of sglang {release}: {args.case}")
    Handler.case, Handler.event_file = args.case, args.event_file
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
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
