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
added is left alone. A worker whose key in KEYS is not the one it was registered with (a key
rotated: the deploy renamed a new KEYS into place) is registered again with it, one at a time
(``DELETE`` it, wait until it is gone, ``POST`` it, wait until it is listed: smg 1.13.0's
``PUT /workers/{id}`` keeps the old key), the others serving meanwhile. No restart: requests
in flight on the other workers go on. It prints one JSON line,
``{"added": [...], "removed": [...], "rekeyed": [...], "listed": N}``.

STATE (JSON, no secret): ``{"registered": [URLs]}`` (an older plain list of URLs is read too).
The keys they were registered with: ``KEYS.registered``, a hard link to the KEYS file of the
last sync (no copy: the same inode, root's, mode 0600, until the deploy renames a new KEYS
into place; then it is the old file, which the next sync compares with the new one, and
links again).

``status`` prints one JSON line: ``{"workers": [the gateway's answer, each worker's url,
is_healthy, status], "registered": [the URLs STATE holds], "keys_current": whether the
workers were registered with KEYS as it is (its link)}``; the deploy judges it.

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
    from remote_env import env_value, env_values
except ImportError:  # imported as part of pve_sglang (the tests, the bench)
    from pve_sglang.remote.remote_env import env_value, env_values

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


def wait_until(gateway: str, key: str | None, done, timeout: float) -> bool:
    """Whether DONE(the URLs the gateway lists) came to hold within TIMEOUT seconds (smg adds
    and removes workers in the background of the request)."""
    deadline = time.monotonic() + timeout
    while not done({norm(w["url"]) for w in listed(gateway, key)}):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
    return True


def settled(gateway: str, key: str | None, done, timeout: float) -> None:
    """``wait_until``, a GatewayError where it did not."""
    if not wait_until(gateway, key, done, timeout):
        raise GatewayError(f"the worker list did not settle in {timeout:.0f}s")


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


def registered_keys_path(keys_file: str) -> str:
    """The hard link to the keys file the listed workers were registered with."""
    return keys_file + ".registered"


def read_state(path: str) -> list[str]:
    """The URLs this script registered (STATE, old or new form)."""
    value = read_json(path, []) if path else []
    urls = value.get("registered") if isinstance(value, dict) else value
    return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else []


def read_keys(path: str) -> tuple[dict[str, str], tuple[int, int] | None]:
    """The keys in PATH and which file it is (device, inode), read from one open file; no file:
    ``({}, None)``."""
    try:
        with open(path, encoding="utf-8") as handle:
            found = os.fstat(handle.fileno())
            return env_values(handle.read()), (found.st_dev, found.st_ino)
    except FileNotFoundError:
        return {}, None


def keys_current(keys_file: str) -> bool:
    """Whether the workers were registered with KEYS_FILE as it is (its link is the same file)."""
    try:
        return os.path.samefile(keys_file, registered_keys_path(keys_file))
    except OSError:
        return False


def link_registered(keys_file: str, which: tuple[int, int] | None) -> None:
    """Link KEYS_FILE as the one the workers hold, if it is still the file WHICH that was read
    (one renamed into place meanwhile is compared by the next sync)."""
    if which is None:
        return
    found = os.stat(keys_file)
    if (found.st_dev, found.st_ino) != which:
        return
    tmp = registered_keys_path(keys_file) + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.link(keys_file, tmp)
    os.replace(tmp, registered_keys_path(keys_file))


def worker_spec(worker: dict, keys: dict[str, str]) -> dict:
    """The body smg registers WORKER from: its URL and, where it has one, its key in KEYS."""
    body = {"url": worker["url"]}
    worker_key = keys.get(worker["key_env"]) if worker.get("key_env") else None
    if worker_key:
        body["api_key"] = worker_key
    return body


def worker_path(worker: dict) -> str:
    return "/workers/" + urllib.parse.quote(worker["id"], safe="")


def sync(gateway: str, workers: list[dict], env_file: str, keys_file: str, state_file: str,
         timeout: float) -> dict:
    """Register the missing workers, remove those this script registered that are gone."""
    key = env_value(env_file, GATEWAY_KEY)
    keys, which = read_keys(keys_file)
    # Without the link (a gateway registered by an older deploy) the keys they hold are not
    # known: none is registered again for it.
    held, known = read_keys(registered_keys_path(keys_file))
    now = wait_listed(gateway, key, timeout)
    present = {norm(w["url"]): w for w in now}
    wanted = {norm(w["url"]): w for w in workers}
    ours = read_state(state_file)
    added, removed, rekeyed = [], [], []
    for url, worker in wanted.items():
        if url not in present:
            call(gateway, "POST", "/workers", key, worker_spec(worker, keys))
            added.append(url)
        elif (url in ours and known and worker_spec(worker, held) != worker_spec(worker, keys)
              and isinstance(present[url].get("id"), str)):
            call(gateway, "DELETE", worker_path(present[url]), key)
            settled(gateway, key, lambda urls, url=url: url not in urls, timeout)
            call(gateway, "POST", "/workers", key, worker_spec(worker, keys))
            settled(gateway, key, lambda urls, url=url: url in urls, timeout)
            rekeyed.append(url)
    for url in ours:
        if url not in wanted and url in present and isinstance(present[url].get("id"), str):
            call(gateway, "DELETE", worker_path(present[url]), key)
            removed.append(url)
    tmp = state_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"registered": sorted(wanted)}, handle)
    os.replace(tmp, state_file)
    link_registered(keys_file, which)
    # Registration runs in the background of the gateway: wait until each added one is listed
    # (one still missing then is named by the deploy's next read).
    if added:
        wait_until(gateway, key, lambda urls: all(url in urls for url in added), timeout)
    return {"added": added, "removed": removed, "rekeyed": rekeyed,
            "listed": len(present) + len(added) - len(removed)}


def status(gateway: str, env_file: str, keys_file: str, state_file: str) -> dict:
    key = env_value(env_file, GATEWAY_KEY)
    return {"workers": [{"url": w["url"], "is_healthy": w.get("is_healthy"),
                         "status": w.get("status")} for w in listed(gateway, key)],
            "registered": read_state(state_file), "keys_current": keys_current(keys_file)}


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
            result = status(args.gateway, args.env_file, args.keys_file, args.state)
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
