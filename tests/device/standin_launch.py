"""``python -m standin_launch`` in place of ``sglang.launch_server``, for ``gpu_serve.py
--rehearse`` on a machine without a GPU: SGLang's own flags turned into those of the stand-in
(``tests/standin_sglang.py``: real startup lines, /health, the chat completion, ``/generate``
for the benchmark, ``/metrics``), a ``mem_fraction_static`` of 0.99 or more starting as its
``oom`` case. Only the device script's plumbing is rehearsed so; nothing is measured."""

import argparse
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, default=30000)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--enable-metrics", action="store_true")
parser.add_argument("--max-running-requests", type=int, default=0)
parser.add_argument("--mem-fraction-static", type=float, default=0.9)
parser.add_argument("--api-key")
known, _ = parser.parse_known_args(sys.argv[1:])
if known.api_key:
    os.environ["SGLANG_API_KEY"] = known.api_key
case = "oom" if known.mem_fraction_static >= 0.99 else "normal"
argv = [sys.executable, str(TESTS / "standin_sglang.py"), "--logs",
        str(TESTS / "fixtures" / "sglang_logs"), "--port", str(known.port), "--host", known.host,
        "--case", case, "--event-file", os.devnull, "--pause-scale", "0.05",
        "--max-running", str(known.max_running_requests or 0)]
if known.enable_metrics:
    argv.append("--enable-metrics")
os.execv(sys.executable, argv)
