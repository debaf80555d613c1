"""The gateway's worker list, kept through smg's worker API (stdlib only).

Usage (in the gateway's container; keys are read from ENV_FILE, never from a command line)::

    python3 gateway_workers.py sync   --gateway URL --workers FILE --env-file ENV --keys-file KEYS --state FILE [--timeout S]
    python3 gateway_workers.py status --gateway URL --workers FILE --env-file ENV --keys-file KEYS --state FILE

WORKERS (JSON, written by the deploy, no secret): ``{"workers": [{"name", "url", "key_env"}]}``;
``key_env`` names KEYS' variable holding that worker's API key (or null); ENV holds the
gateway's own key (``SGLANG_API_KEY``), which its control API asks for too.

``sync`` (the unit's ``ExecStartPost`` and the deploy after the list changed) waits until the
gateway answers ``GET /workers``, registers each worker of WORKERS it does not list
(``POST /workers``, the worker's key in the body), and removes (``DELETE /workers/{id}``) the
workers STATE says it registered before that WORKERS no longer names: a worker someone else
added is left alone. No restart: requests in flight on the other workers go on. It prints one
JSON line, ``{"added": [...], "removed": [...], "listed": N}``.

``status`` prints one JSON line: ``{"workers": [the gateway's answer, each worker's url,
is_healthy, status], "registered": [the URLs STATE holds]}``; the deploy judges it.

Exit codes: 0 done; 2 bad usage or files; 3 the gateway did not answer in time or refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

try:  # uploaded beside this script (remote.COMPANIONS)
    from remote_env import env_value
except ImportError:  # imported as part of pve_sglang (the tests, the bench)
    from pve_sglang.remote.remote_env import env_value

GATEWAY_KEY = "SGLANG_API_KEY"


class GatewayError(Exception):
    """The gateway did not answer as expected; the message names no key."""


def call(gateway: str, method: str, path: str, key: str | None, body: dict | None = None,
         timeout: float = 10) -> dict:
    """One request to the gateway's control API; its JSON answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(gateway.rstrip("/") + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read(4 * 1024 * 1024).decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        raise GatewayError(f"{method} {path}: HTTP {error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        raise GatewayError(f"{method} {path}: {getattr(error, 'reason', error)}") from None
    try:
        value = json.loads(text or "{}")
    except ValueError:
        raise GatewayError(f"{method} {path}: not JSON") from None
    if not isinstance(value, dict):
        raise GatewayError(f"{method} {path}: not a JSON object")
    return value


def listed(gateway: str, key: str | None) -> list[dict]:
    """The gateway's workers (``GET /workers``), each checked to be an object with a url."""
    workers = call(gateway, "GET", "/workers", key).get("workers")
    if not isinstance(workers, list):
        raise GatewayError("GET /workers: no 'workers' list")
    return [w for w in workers if isinstance(w, dict) and isinstance(w.get("url"), str)]


def wait_listed(gateway: str, key: str | None, timeout: float) -> list[dict]:
    """``listed`` once the gateway answers, trying for up to TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return listed(gateway, key)
        except GatewayError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def read_json(path: str, default: object) -> object:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return default


def wanted_workers(path: str) -> list[dict]:
    value = read_json(path, None)
    workers = value.get("workers") if isinstance(value, dict) else None
    if not isinstance(workers, list) or not all(
            isinstance(w, dict) and isinstance(w.get("url"), str) for w in workers):
        raise ValueError(f"{path}: expected {{\"workers\": [{{\"url\": ...}}]}}")
    return workers


def norm(url: str) -> str:
    return url.rstrip("/")


def sync(gateway: str, workers: list[dict], env_file: str, keys_file: str, state_file: str,
         timeout: float) -> dict:
    """Register the missing workers, remove those this script registered that are gone."""
    key = env_value(env_file, GATEWAY_KEY)
    now = wait_listed(gateway, key, timeout)
    present = {norm(w["url"]): w for w in now}
    wanted = {norm(w["url"]): w for w in workers}
    ours = read_json(state_file, [])
    ours = [u for u in ours if isinstance(u, str)] if isinstance(ours, list) else []
    added, removed = [], []
    for url, worker in wanted.items():
        if url in present:
            continue
        body = {"url": worker["url"]}
        worker_key = env_value(keys_file, worker["key_env"]) if worker.get("key_env") else None
        if worker_key:
            body["api_key"] = worker_key
        call(gateway, "POST", "/workers", key, body)
        added.append(url)
    for url in ours:
        if url not in wanted and url in present and isinstance(present[url].get("id"), str):
            call(gateway, "DELETE", "/workers/" + urllib.parse.quote(present[url]["id"], safe=""),
                 key)
            removed.append(url)
    tmp = state_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(sorted(wanted), handle)
    os.replace(tmp, state_file)
    # Registration runs in the background of the gateway: wait until each added one is listed.
    deadline = time.monotonic() + timeout
    while added:
        urls = {norm(w["url"]) for w in listed(gateway, key)}
        if all(url in urls for url in added) or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    return {"added": added, "removed": removed, "listed": len(present) + len(added) - len(removed)}


def status(gateway: str, env_file: str, state_file: str) -> dict:
    key = env_value(env_file, GATEWAY_KEY)
    ours = read_json(state_file, []) if state_file else []
    return {"workers": [{"url": w["url"], "is_healthy": w.get("is_healthy"),
                         "status": w.get("status")} for w in listed(gateway, key)],
            "registered": [u for u in ours if isinstance(u, str)] if isinstance(ours, list) else []}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gateway_workers.py")
    parser.add_argument("command", choices=("sync", "status"))
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--workers", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--keys-file", required=True)
    parser.add_argument("--state", default="")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args(argv)
    try:
        workers = wanted_workers(args.workers)
        if args.command == "sync":
            if not args.state:
                raise ValueError("sync needs --state FILE")
            result = sync(args.gateway, workers, args.env_file, args.keys_file, args.state,
                          args.timeout)
        else:
            result = status(args.gateway, args.env_file, args.state)
    except ValueError as error:
        print(json.dumps({"error": str(error)}))
        return 2
    except GatewayError as error:
        print(json.dumps({"error": f"the gateway at {args.gateway}: {error}"}))
        return 3
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
