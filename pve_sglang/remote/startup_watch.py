"""Follow the SGLang server's start from inside its container: its journal, its unit, /health.

Stand-alone (stdlib only), uploaded by the verify phase and run with the container's
``python3``. Two commands, each printing one JSON object per line:

``watch --unit U --start US [--cursor C] [--health-url URL] [--env-file F] [--max-wait S]
[--return-on REGEX ...]``
    The journal lines of U since its start at US (microseconds since the epoch, the unit's
    ``ExecMainStartTimestamp``) or after CURSOR, each as ``{"t": US, "m": TEXT}``, as they
    come (``journalctl -f``), for up to S seconds; it returns at once when a line matches a
    REGEX, when the unit leaves ``active`` (failed, auto-restart, stopped) or is started
    again, or when /health answers 200. The last line is ``{"state": {...}, "cursor": C,
    "health": CODE, "now": US}``: what to ask next time, and the container's clock. The
    deploy decides what the lines mean (``pve_sglang/server/startup_log.py``).
``generate --url BASE [--env-file F] [--max-tokens N] [--prompt TEXT] [--timeout S]``
    One streamed chat completion (``/v1/chat/completions``, temperature 0, logprobs on):
    ``{"status", "text", "tokens", "ttft_s", "elapsed_s", "logprobs", "model", "error",
    "timed_out"}``. S bounds the whole answer (the models list, the headers, every chunk): a
    stream that stalls after its headers ends there, ``timed_out`` true.

The API key (``SGLANG_API_KEY`` of the env file) is read from the file by this process and
sent as a header: it is never on a command line, and never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any

try:  # uploaded beside this script (remote.COMPANIONS)
    from remote_env import env_value
except ImportError:  # imported as part of pve_sglang (the deploy's side, the tests)
    from pve_sglang.remote.remote_env import env_value

API_KEY_VAR = "SGLANG_API_KEY"
STATE_PROPS = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus",
               "ExecMainCode", "ExecMainStartTimestamp")
# Seconds between two reads of the unit's state, and of /health: each second, so that a
# server that answers is never called stuck for a silent log (startup_stall_s may be seconds).
STATE_EVERY_S = 1.0
HEALTH_EVERY_S = 1.0
# Seconds the journal is read on after /health answered 200: the lines logged before it
# (the ready line) reach journalctl a moment later.
JOURNAL_LAG_S = 0.5


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def headers(env_file: str | None) -> dict[str, str]:
    key = env_value(env_file, API_KEY_VAR)
    return {"Authorization": f"Bearer {key}"} if key else {}


def http(url: str, env_file: str | None, body: dict | None = None, timeout: float = 10.0):
    """(status, response) of a GET (or a POST of BODY as JSON); status None: no answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={
        **headers(env_file), **({"Content-Type": "application/json"} if data else {})})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
        return response.status, response
    except urllib.error.HTTPError as error:
        return error.code, error
    except (OSError, ValueError):
        return None, None


def micros(stamp: str) -> int | None:
    """A ``systemctl --timestamp=us+utc`` time (``Wed 2026-12-02 10:00:00.123456 UTC``) in
    microseconds since the epoch; None when empty."""
    parts = stamp.split()
    if len(parts) < 3:
        return None
    try:
        when = datetime.strptime(f"{parts[1]} {parts[2]}", "%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        return None
    return int(when.replace(tzinfo=timezone.utc).timestamp() * 1_000_000)


def unit_state(unit: str) -> dict:
    out = subprocess.run(["systemctl", "--timestamp=us+utc", "show", unit,
                          *(f"-p{prop}" for prop in STATE_PROPS)],
                         capture_output=True, text=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    started = micros(values.pop("ExecMainStartTimestamp", ""))
    return {**values, "started": started}


def running(state: dict, start: int | None) -> bool:
    """The unit still runs the start being followed."""
    return (state.get("ActiveState") == "active"
            and (start is None or state.get("started") == start))


def message(entry: dict) -> str:
    text = entry.get("MESSAGE", "")
    if isinstance(text, list):  # journald's bytes for a line that is not UTF-8
        text = bytes(text).decode("utf-8", "replace")
    return str(text)


def watch(args: argparse.Namespace) -> int:
    """The ``watch`` command (see the module's docstring)."""
    patterns = [re.compile(p) for p in args.return_on]
    command = ["journalctl", "-u", args.unit, "-o", "json", "--no-pager", "-f"]
    if args.cursor:
        command += ["--after-cursor", args.cursor]
    else:
        command += ["--since", f"@{args.start / 1_000_000:.6f}", "-n", "all"]
    follower = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert follower.stdout is not None  # stdout=PIPE
    cursor, buffer = args.cursor, b""
    deadline = time.monotonic() + args.max_wait
    state, health = unit_state(args.unit), None
    next_state, next_health = time.monotonic() + STATE_EVERY_S, time.monotonic()
    done, answered = False, None
    try:
        while not done:
            now = time.monotonic()
            if now >= next_health and args.health_url:
                health = http(args.health_url, args.env_file, timeout=4.0)[0]
                next_health = time.monotonic() + HEALTH_EVERY_S
                if health == 200 and answered is None:
                    answered = time.monotonic()
            # /health 200 ends the call once the journal's lines so far are read (its lag).
            done = done or (answered is not None and now - answered >= JOURNAL_LAG_S)
            if now >= next_state:
                state = unit_state(args.unit)
                next_state = now + STATE_EVERY_S
            if not running(state, args.start) or now >= deadline:
                done = True
            ready, _, _ = select.select([follower.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(follower.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    try:
                        entry = json.loads(raw)
                    except ValueError:
                        continue
                    cursor = entry.get("__CURSOR", cursor)
                    text = message(entry)
                    emit({"t": int(entry.get("__REALTIME_TIMESTAMP", 0)), "m": text})
                    if any(p.search(text) for p in patterns):
                        done = True
            elif not running(state, args.start):
                # The unit's last lines reach the journal just after it stops: drain them.
                done = True
    finally:
        follower.terminate()
        follower.wait()
    emit({"state": unit_state(args.unit), "cursor": cursor, "health": health,
          "now": int(time.time() * 1_000_000)})
    return 0


class AnswerTimeout(Exception):
    """The whole answer took longer than ``--timeout``."""


def _timed_out(signum, frame) -> None:
    raise AnswerTimeout


def generate(args: argparse.Namespace) -> int:
    """The ``generate`` command (see the module's docstring): one deadline for the whole
    answer, an alarm, since a socket timeout bounds each read and not the sum of them."""
    result: dict[str, Any] = {
        "status": None, "text": "", "tokens": 0, "ttft_s": None, "elapsed_s": None,
        "logprobs": [], "model": None, "error": None, "timed_out": False, "worker": None}
    start = time.monotonic()
    signal.signal(signal.SIGALRM, _timed_out)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    try:
        _answer(args, result)
    except AnswerTimeout:
        result["timed_out"] = True
        result["error"] = (f"no complete answer within {args.timeout:g}s ("
                           + ("status and headers came, then silence" if result["status"]
                              else "no status line") + f", {len(result['text'])} characters)")
    except OSError as error:  # the connection broke off mid-stream
        result["error"] = f"the answer broke off after {len(result['text'])} characters: {error}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if result["elapsed_s"] is None:
        result["elapsed_s"] = time.monotonic() - start
    emit(result)
    return 0


#: The header smg answers with the worker it sent the request to.
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"


def routed_worker(response) -> str | None:
    """The worker a gateway (smg) routed the request to, from RESPONSE's header; None without
    one. The gateway's answer is untrusted: printable characters only, at most 200."""
    value = response.headers.get(ROUTED_WORKER_HEADER) if response is not None else None
    if not value:
        return None
    return "".join(c for c in str(value) if c.isprintable())[:200] or None


def _answer(args: argparse.Namespace, result: dict) -> None:
    """Ask for the completion and fill RESULT as the stream comes (times from the request)."""
    base = args.url.rstrip("/")
    status, response = http(f"{base}/v1/models", args.env_file, timeout=args.timeout)
    if status == 200:
        try:
            result["model"] = json.load(response)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            pass
    body = {"model": result["model"] or "default", "stream": True, "temperature": 0,
            "max_tokens": args.max_tokens, "logprobs": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": args.prompt}]}
    start = time.monotonic()
    status, response = http(f"{base}/v1/chat/completions", args.env_file, body,
                            timeout=args.timeout)
    result["status"] = status
    result["worker"] = routed_worker(response)
    if status != 200:
        result["error"] = (response.read(2000).decode("utf-8", "replace") if response else
                           "no answer (connection refused, reset or timed out)")
        return
    chunks, usage = 0, None
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        try:
            data = json.loads(line[5:])
        except ValueError:
            continue
        usage = data.get("usage") or usage
        for choice in data.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                if result["ttft_s"] is None:
                    result["ttft_s"] = time.monotonic() - start
                result["text"] += text
                chunks += 1
            for item in ((choice.get("logprobs") or {}).get("content") or []):
                # NaN and inf reach JSON as NaN/Infinity or null: kept as their repr.
                result["logprobs"].append(repr(item.get("logprob")))
    result["elapsed_s"] = time.monotonic() - start
    result["tokens"] = (usage or {}).get("completion_tokens") or chunks


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    follow = commands.add_parser("watch")
    follow.add_argument("--unit", required=True)
    follow.add_argument("--start", type=int, required=True)
    follow.add_argument("--cursor", default="")
    follow.add_argument("--health-url", default="")
    follow.add_argument("--env-file", default="")
    follow.add_argument("--max-wait", type=float, default=20.0)
    follow.add_argument("--return-on", action="append", default=[])
    gen = commands.add_parser("generate")
    gen.add_argument("--url", required=True)
    gen.add_argument("--env-file", default="")
    gen.add_argument("--max-tokens", type=int, default=48)
    gen.add_argument("--prompt", default="Name three primary colours, separated by commas.")
    gen.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    return watch(args) if args.command == "watch" else generate(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
