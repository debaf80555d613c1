"""One container's status for ``make status``, in one Python start, read-only: prints one JSON
object.

    python3 -c "$(cat status_read.py)" ARGS_JSON

ARGS_JSON: ``{"unit": "sglang.service", "venv_path": ..., "state": the stack record,
"model_path": ..., "marker": the model's marker file name, "base_url": "http://127.0.0.1:PORT",
"metrics": true, "since": {what: path}, "timeout_s": 3}`` (every key but ``unit`` optional: a
gateway is asked its unit and /health only). The object printed: ``unit`` (the lines of
``systemctl show``, for the ``UnitState`` fact's parser), ``stacks`` (the shape of the
``Stacks`` fact: the link, the complete stacks' release files, the record), ``marker`` (the
model's marker), ``health`` (``{"status": code}`` or ``{"error": ...}``), ``metrics`` (the
figures of ``server_metrics.figures`` or ``{"error": ...}``), ``mtimes`` (``{what: microseconds
or None}``).

Nothing here writes. Every file read and every answer is bounded (``MAX_BYTES``); what it holds
is the container's and is checked on the deploy's side before it is shown. Standard library
only, but ``server_metrics`` (its companion: the metrics' parser, with ``prometheus_client``
where the sglang venv's Python runs this); the ``ContainerStatus`` fact sends both with
``python -c`` (``remote.piped``): a status run uploads nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

try:
    import server_metrics
except ImportError:  # run alone: the metrics are said to be unreadable
    server_metrics = None

#: The most read of any file or answer.
MAX_BYTES = 256 * 1024
STACK_NAME = re.compile(r"^[0-9a-f]{16}$")
SUFFIX = ".stacks"
RELEASE_FILE = "pve-sglang-stack.json"
UNIT_PROPS = ("ActiveState", "SubState", "UnitFileState", "NeedDaemonReload",
              "ExecMainStartTimestamp", "ActiveEnterTimestamp", "NRestarts", "Result")


def small_json(path: str) -> dict | None:
    """The JSON object in PATH (at most MAX_BYTES), or None."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def unit(name: str) -> list[str]:
    """``systemctl show`` of NAME's properties (UNIT_PROPS), microsecond UTC times where this
    systemctl knows the option, as lines."""
    props = [arg for prop in UNIT_PROPS for arg in ("-p", prop)]
    for first in (["--timestamp=us+utc"], []):
        try:
            done = subprocess.run(["systemctl", *first, "show", *props, name],
                                  capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.SubprocessError):
            return []
        if done.returncode == 0:
            return done.stdout[:MAX_BYTES].splitlines()
    return []


def stacks(venv_path: str, state: str) -> dict:
    """What ``venv_path`` is, the complete stacks beside it (their release files, mtimes) and
    the stack record: the ``Stacks`` fact's shape (but a plain venv's lock, not read here)."""
    venv = venv_path.rstrip("/")
    found: dict = {"kind": "missing", "target": None, "stacks": {}, "state": small_json(state) or {}}
    if os.path.islink(venv):
        found["kind"], found["target"] = "link", os.readlink(venv)[:4096]
    elif os.path.isdir(venv):
        found["kind"] = "plain"
    elif os.path.lexists(venv):
        found["kind"] = "other"
    folder = venv + SUFFIX
    try:
        names = sorted(os.listdir(folder))[:1000]
    except OSError:
        names = []
    for name in names:
        release = small_json(f"{folder}/{name}/{RELEASE_FILE}")
        if STACK_NAME.match(name) and release is not None:
            found["stacks"][name] = {**release, "mtime": os.stat(f"{folder}/{name}").st_mtime}
    return found


def health(url: str, timeout_s: float) -> dict:
    """``{"status": HTTP status}`` of a GET of URL, or ``{"error": why}``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as answer:
            answer.read(MAX_BYTES)
            return {"status": answer.status}
    except urllib.error.HTTPError as error:
        return {"status": error.code}
    except (OSError, ValueError) as error:
        return {"error": str(getattr(error, "reason", error))[:200]}


def metrics(url: str, timeout_s: float) -> dict:
    """The server's figures now (``server_metrics.scrape``), or ``{"error": why}``."""
    if server_metrics is None:
        return {"error": "server_metrics.py is not beside this script"}
    try:
        return server_metrics.scrape(url, timeout_s)
    except server_metrics.MetricsError as error:
        return {"error": str(error)[:200]}


def mtimes(paths: dict[str, str]) -> dict[str, int | None]:
    """Each path's own mtime (a link's, but through a trailing slash: as ``stat`` gives it, the
    ``PathStates`` fact's) in microseconds since the epoch (None: not there)."""
    out: dict[str, int | None] = {}
    for what, path in paths.items():
        try:
            out[what] = os.lstat(path).st_mtime_ns // 1000
        except OSError:
            out[what] = None
    return out


def read_status(args: dict) -> dict:
    """Everything ARGS asks of this container."""
    result: dict = {"unit": unit(args["unit"])}
    timeout = float(args.get("timeout_s", 3))
    if args.get("venv_path") and args.get("state"):
        result["stacks"] = stacks(args["venv_path"], args["state"])
    if args.get("model_path") and args.get("marker"):
        result["marker"] = small_json(f"{args['model_path'].rstrip('/')}/{args['marker']}")
    base = args.get("base_url")
    if base:
        result["health"] = health(f"{base}/health", timeout)
        if args.get("metrics"):
            result["metrics"] = metrics(f"{base}/metrics", timeout)
    result["mtimes"] = mtimes(args.get("since") or {})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One container's status, as one JSON object.")
    parser.add_argument("args_json", help="what to read (this module's docstring)")
    options = parser.parse_args(argv)
    print(json.dumps(read_status(json.loads(options.args_json)), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
