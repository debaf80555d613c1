"""The stand-in server's /metrics against SGLang's real collector sources (the releases' wheels),
and the stand-in itself: ``standin`` starts it (``tests/standin_sglang.py``), ``LOAD`` is a
benchmark's load of concurrent ``/generate`` requests against it.

The stand-in queues requests past its cap or past its KV cache as SGLang's scheduler does, and
serves the load it holds under SGLang's own metric names and types. The sampler's tests that run
against it are the fast tier's (tests/unit/test_server_metrics_sampler.py); the status's, the
tuning drive's and bench/'s stand-ins come from here too.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from pve_sglang.remote import server_metrics
from pve_sglang.server.bench import MAIN_RUN_MARKER, RESULT_HEADER

TESTS = Path(__file__).resolve().parents[1]
STANDIN = TESTS / "standin_sglang.py"
LOGS = TESTS / "fixtures" / "sglang_logs"

#: Where each tested release declares its scheduler metrics.
COLLECTOR = {"0.5.9": "sglang/srt/metrics/collector.py",
             "0.5.23": "sglang/srt/observability/metrics_collector.py"}


# --- the stand-in against SGLang's sources -------------------------------------------------


def declared(source_text: str) -> dict[str, str]:
    """``sglang:NAME`` -> its prometheus type as declared in a collector's source
    (``Gauge(name="sglang:...")``; a counter's samples carry ``_total`` in its name already)."""
    found = {}
    for kind, name in re.findall(r"(Gauge|Counter|Histogram|Summary)\(\s*name=\"(sglang:[a-z_]+)\"",
                                 source_text):
        found[name] = kind.lower()
    return found


@pytest.mark.parametrize("release", sorted(COLLECTOR))
def test_standin_metric_names_and_types_taken_from_sglang_sources(release, sglang_wheel):
    """Every metric the stand-in serves, and every one the sampler reads, is declared by the
    release's real collector with that type (0.5.9 and 0.5.23 wheels)."""
    sys.path.insert(0, str(TESTS))
    try:
        import standin_sglang
    finally:
        sys.path.remove(str(TESTS))
    with zipfile.ZipFile(sglang_wheel(release)) as archive:
        real = declared(archive.read(COLLECTOR[release]).decode())
    served = {name: kind for name, (kind, _) in standin_sglang.METRICS.items()}
    if release == "0.5.9":  # constants came later (0.5.23's emit_constants)
        served.pop("sglang:max_total_num_tokens")
    assert {name: real.get(name) for name in served} == served
    assert {name: real.get(name) for name in server_metrics.FIGURES} == dict.fromkeys(
        server_metrics.FIGURES, server_metrics.TYPE)


# --- the stand-in server, and a load against it (the sampler's end-to-end cases) -----------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def standin(tmp_path: Path, *flags: str, key: str = "sk-standin"):
    """The stand-in server (started in a fraction of a second, ready), its base URL."""
    port = _free_port()
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
