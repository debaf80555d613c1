"""The stand-in server (``tests/standin_sglang.py``) started as a process for one test or bench
run: ``standin`` (ready when it yields its URL), ``free_port``, and ``LOAD``, a benchmark's load of
concurrent ``/generate`` requests against it, with the markers the deploy's samplers wait for.
Used by the sampler's, the status read's and the tuning drive's tests and by bench/.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from pve_sglang.server.bench import MAIN_RUN_MARKER, RESULT_HEADER

TESTS = Path(__file__).resolve().parent
STANDIN = TESTS / "standin_sglang.py"
LOGS = TESTS / "fixtures" / "sglang_logs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def standin(tmp_path: Path, *flags: str, key: str = "sk-standin"):
    """The stand-in server (started in a fraction of a second, ready), its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "--logs", str(LOGS), "--port", str(port),
         "--event-file", str(tmp_path / "event"), "--pause-scale", "0.01", *flags],
        stdout=subprocess.DEVNULL, env={"SGLANG_API_KEY": key, "PATH": "/usr/bin:/bin"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            request = urllib.request.Request(url + "/health",
                                             headers={"Authorization": f"Bearer {key}"})
            try:
                with urllib.request.urlopen(request, timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the stand-in did not start"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


#: A benchmark's shape: the warmup line, CONCURRENCY clients sending /generate back to back
#: for DURATION seconds, then the result header (the markers the deploy's samplers wait for).
LOAD = f"""
import json, sys, threading, time, urllib.request
url, key, concurrency, duration = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
print("Warmup completed with 1 sequences. {MAIN_RUN_MARKER}...", flush=True)
end = time.monotonic() + duration

done = []
began = time.monotonic()

def client():
    body = json.dumps({{"input_ids": list(range(64)), "sampling_params": {{"max_new_tokens": 64}},
                       "stream": True}}).encode()
    while time.monotonic() < end:
        request = urllib.request.Request(url + "/generate", data=body, headers={{
            "Authorization": "Bearer " + key, "Content-Type": "application/json"}})
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
        done.append(1)

threads = [threading.Thread(target=client) for _ in range(concurrency)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("{RESULT_HEADER.center(50, '=')}", flush=True)
print(f"OUTPUT_TOK_S {{64 * len(done) / (time.monotonic() - began):.2f}}", flush=True)
"""
