"""The gateway's worker list, kept through smg's worker API, and each worker's answer (stdlib only).

Usage (in the gateway's container; keys are read from ENV_FILE and KEYS, never from a command
line)::

    python3 gateway_workers.py sync   --gateway URL --workers FILE --env-file ENV --keys-file KEYS --state FILE [--timeout S] [--not-up-ok]
    python3 gateway_workers.py status --gateway URL --workers FILE --env-file ENV --keys-file KEYS --state FILE
    python3 gateway_workers.py check  --gateway URL --workers FILE --env-file ENV --keys-file KEYS [--timeout S] [--worker NAME]
    python3 gateway_workers.py out    --gateway URL --workers FILE --env-file ENV --keys-file KEYS --state FILE --worker NAME [--timeout S] [--drain S]
    python3 gateway_workers.py in     --gateway URL --workers FILE --env-file ENV --keys-file KEYS --state FILE --worker NAME [--timeout S]

WORKERS (JSON, written by the deploy, no secret): ``{"workers": [{"name", "url", "key_env"}]}``;
``key_env`` names KEYS' variable holding that worker's API key (or null); ENV holds the
gateway's own key (``SGLANG_API_KEY``), which its control API asks for too.

``sync`` (the unit's ``ExecStartPost`` and the deploy after the list changed) waits until the
gateway answers ``GET /workers``, registers each worker of WORKERS it does not list
(``POST /workers``, the worker's key in the body), and removes (``DELETE /workers/{id}``) the
workers STATE says it registered before that WORKERS no longer names: a worker someone else
added is left alone (STATE records only what this script posted). A worker whose key in KEYS is
not the one it was registered with (a key rotated: the deploy renamed a new KEYS into place) is
registered again with it, one at a time (``DELETE`` it, wait until it is gone, ``POST`` it, wait
until it is listed: smg 1.13.0's ``PUT /workers/{id}`` keeps the old key), the others serving
meanwhile. No restart: requests in flight on the other workers go on. It prints one JSON line,
``{"added", "removed", "rekeyed", "not_up", "stray", "listed"}``: ``listed`` is the count the
gateway lists at the end, read back from it.

smg 1.13.0 registers in the background: a POST for a worker whose server does not answer yet
leaves a registration pending (not in ``GET /workers``; ``GET /workers/{id}`` says
``pending``) that smg keeps trying for ``--worker-startup-timeout-secs`` and completes when the
server answers; meanwhile another POST answers 409 ``WORKER_CREATE_IN_PROGRESS``, and a DELETE
does not cancel it. So a worker still not listed when the sync ends is ``not_up`` (pending or
not), exit 4 (``--not-up-ok``: exit 0, the unit's start, which must not fail for a server
still loading); a 409 in progress is such a worker, not an error. A pending registration of a
worker that WORKERS no longer names cannot be withdrawn: it stays in STATE and is reported
(``stray``, exit 4) until it is gone or listed, and then removed.

STATE (JSON, no secret): ``{"registered": [URLs], "ids": {URL: id}}``, what this script posted
(older forms: ``{"registered": [...]}``, a plain list). The keys they were registered with:
``KEYS.registered``, a hard link to the KEYS file of the last sync (no copy: the same inode,
root's, mode 0600, until the deploy renames a new KEYS into place; then it is the old file,
which the next sync compares with the new one, and links again).

``status`` prints one JSON line: ``{"workers": [the gateway's answer, each worker's url,
is_healthy, status], "registered": [the URLs STATE holds], "pending": [those of them smg
holds as pending], "keys_current": whether the workers were registered with KEYS as it is
(its link)}``; the deploy judges it.

``check`` asks each worker of WORKERS for one short streamed generation (SGLang's
``/generate``) straight from this container, with its key, as the gateway forwards one: a
worker is healthy when it answers, not when its ``/health`` says so (smg retries a failed
request on another worker and lists a worker healthy while its every generation fails).
TIMEOUT bounds each whole answer (headers and every event). Prints
``{"workers": [{"name", "url", "ok", "why", "status", "events", "elapsed_s"}]}``.

``out`` and ``in`` are a roll's two ends (the deploy restarting the replicas one at a time):
``out`` takes worker NAME out of the rotation once every other worker the gateway lists is
healthy in its view, and one is (waiting up to TIMEOUT for that: never the last healthy one),
deletes it (``DELETE /workers/{id}``: smg sends it nothing new), waits until it is not listed,
then until its requests in flight are done (SGLang's ``sglang:num_running_reqs`` on its
``/metrics``), bounded by DRAIN seconds: those still running then are cut, and counted.
Prints ``{"worker", "url", "was_listed", "drain_s", "in_flight", "cut"}`` (``in_flight``:
null where the worker has no metrics). ``in`` registers it again and waits until the gateway
lists it healthy; prints ``{"worker", "url", "listed_s"}``.

Exit codes: 0 done; 2 bad usage or files; 3 the gateway did not answer in time or refused (its
error and code in the message); 4 a worker is not up, or a stray registration is pending; 5 a roll's worker may not go out (the others are not
healthy in the gateway's view: it would take capacity the gateway needs).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

try:  # uploaded beside this script (remote.COMPANIONS)
    from remote_env import env_value, env_values
except ImportError:  # imported as part of pve_sglang (the tests, the bench)
    from pve_sglang.remote.remote_env import env_value, env_values

GATEWAY_KEY = "SGLANG_API_KEY"
#: The most bytes an answer of the gateway is read to: ``GET /workers`` holds about 1 KB a
#: worker (6 MB: some 7,000 workers); a larger one is refused, said so, not cut and misread.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: The most bytes of an error answer kept for the message.
MAX_ERROR_BYTES = 64 * 1024
READ_CHUNK = 1024 * 1024
#: smg 1.13.0's error codes (the ``code`` of its JSON error answers).
IN_PROGRESS = "WORKER_CREATE_IN_PROGRESS"
ALREADY_EXISTS = "WORKER_ALREADY_EXISTS"
NOT_FOUND = "WORKER_NOT_FOUND"
#: "Worker creation already in progress for URL '...' with ID <id>. Poll GET /workers/<id>."
_IN_PROGRESS_ID = re.compile(r"\bwith ID ([0-9A-Za-z-]+)")
PENDING = "pending"
EXIT_USAGE, EXIT_GATEWAY, EXIT_NOT_UP, EXIT_CAPACITY = 2, 3, 4, 5
#: SGLang's gauge of the requests a server is running (its ``/metrics``).
RUNNING = "sglang:num_running_reqs"
#: What ``check`` asks each worker: a few tokens, as SGLang's native API takes them.
PROMPT = "The capital of France is"
CHECK_TOKENS = 8


class GatewayError(Exception):
    """The gateway did not answer as expected; the message names no key. STATUS and CODE: its
    HTTP status and smg's error code, where it answered one."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


class TooLarge(ValueError):
    pass


class CapacityError(Exception):
    """A roll's worker may not go out: the others cannot serve without it."""


class NotUpError(Exception):
    """A worker given back is not listed healthy in time."""


def read_bounded(stream, limit: int) -> bytes:
    """STREAM's bytes to its end; TooLarge where there are more than LIMIT (read in chunks:
    no buffer of the limit's size is made for a small answer)."""
    parts: list[bytes] = []
    size = 0
    while True:
        part = stream.read(min(READ_CHUNK, limit + 1 - size))
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
        if size > limit:
            raise TooLarge(f"over {limit:,} bytes")


def smg_error(text: str) -> tuple[str | None, str]:
    """(code, message) of an error answer of smg: ``{"error": "...", "code": "..."}`` or
    ``{"error": {"code", "message"}}``; of SGLang (``{"message", "code": 500}``) or FastAPI
    (``{"detail"}``); another answer's text as its message."""
    try:
        value = json.loads(text)
    except ValueError:
        return None, " ".join(text.split())[:500]
    if not isinstance(value, dict):
        return None, " ".join(text.split())[:500]
    error = next((value[k] for k in ("error", "message", "detail") if value.get(k)), None)
    code = value.get("code")
    if isinstance(error, dict):
        code = code or error.get("code")
        error = error.get("message")
    said = error if isinstance(error, str) else json.dumps(value)
    return (code if isinstance(code, str) and code else None), " ".join(said.split())[:500]


def in_progress_id(message: str) -> str | None:
    """The id of the pending registration a 409 ``WORKER_CREATE_IN_PROGRESS`` names."""
    found = _IN_PROGRESS_ID.search(message)
    return found[1] if found else None


def call(gateway: str, method: str, path: str, key: str | None, body: dict | None = None,
         timeout: float = 10, limit: int = MAX_ANSWER_BYTES) -> dict:
    """One request to the gateway's control API; its JSON answer (at most LIMIT bytes)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(gateway.rstrip("/") + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            raw = read_bounded(answer, limit)
    except urllib.error.HTTPError as error:
        try:
            text = error.read(MAX_ERROR_BYTES).decode("utf-8", "replace")
        except OSError:
            text = ""
        code, said = smg_error(text)
        raise GatewayError(f"{method} {path}: HTTP {error.code}" + (f" {code}" if code else "")
                           + (f": {said}" if said else ""), error.code, code) from None
    except TooLarge:
        raise GatewayError(f"{method} {path}: the answer is over {limit // (1024 * 1024)} MiB, "
                           f"the most this script reads (MAX_ANSWER_BYTES); not read") from None
    except (urllib.error.URLError, OSError) as error:
        raise GatewayError(f"{method} {path}: {getattr(error, 'reason', error)}") from None
    try:
        value = json.loads(raw.decode("utf-8", "replace") or "{}")
    except ValueError:
        raise GatewayError(f"{method} {path}: not JSON ({len(raw):,} bytes)") from None
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


def urls_of(workers: list[dict]) -> set[str]:
    return {norm(w["url"]) for w in workers}


def wait_until(gateway: str, key: str | None, done, timeout: float) -> list[dict]:
    """The gateway's workers once DONE(their URLs) holds, or when TIMEOUT seconds have passed
    (smg adds and removes workers in the background of the request)."""
    deadline = time.monotonic() + timeout
    while True:
        workers = listed(gateway, key)
        if done(urls_of(workers)) or time.monotonic() >= deadline:
            return workers
        time.sleep(0.25)


def settled(gateway: str, key: str | None, done, timeout: float) -> None:
    """``wait_until``, a GatewayError where DONE did not come to hold."""
    if not done(urls_of(wait_until(gateway, key, done, timeout))):
        raise GatewayError(f"the worker list did not settle in {timeout:.0f}s")


def registration(gateway: str, key: str | None, ident: str) -> str | None:
    """smg's status of the registration IDENT (``GET /workers/{id}``: ``pending``, ``ready``,
    ...), None where smg holds none (404: done with it, or given up)."""
    try:
        value = call(gateway, "GET", "/workers/" + urllib.parse.quote(ident, safe=""), key)
    except GatewayError as error:
        if error.status in (400, 404):
            return None
        raise
    found = value.get("status")
    return found if isinstance(found, str) else None


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


def read_registrations(path: str) -> dict[str, str | None]:
    """{URL: the id smg gave its registration, None where STATE does not say} of STATE."""
    value = read_json(path, {}) if path else {}
    ids = value.get("ids") if isinstance(value, dict) else None
    ids = ids if isinstance(ids, dict) else {}
    return {norm(url): (ids.get(url) if isinstance(ids.get(url), str) else None)
            for url in read_state(path)}


def write_registrations(path: str, registrations: dict[str, str | None]) -> None:
    """STATE as REGISTRATIONS, replaced whole (a run killed meanwhile leaves the old one)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"registered": sorted(registrations),
                   "ids": {url: ident for url, ident in sorted(registrations.items()) if ident}},
                  handle)
    os.replace(tmp, path)


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


def worker_key(worker: dict, keys: dict[str, str]) -> str | None:
    """WORKER's API key in KEYS (by its ``key_env``), None where it has none."""
    return (keys.get(worker["key_env"]) or None) if worker.get("key_env") else None


def worker_spec(worker: dict, keys: dict[str, str]) -> dict:
    """The body smg registers WORKER from: its URL and, where it has one, its key in KEYS."""
    body = {"url": worker["url"]}
    key = worker_key(worker, keys)
    if key:
        body["api_key"] = key
    return body


def listed_id(ids: dict[str, str | None], url: str) -> str:
    """The id the gateway lists URL with: ``plan`` rekeys and deletes only those listed with one."""
    ident = ids[url]
    assert ident is not None, f"{url}: planned to delete, but listed without an id"
    return ident


def worker_path(ident: str) -> str:
    return "/workers/" + urllib.parse.quote(ident, safe="")


@dataclass(frozen=True)
class Plan:
    """What a sync does, from what the gateway lists and what this script registered before."""

    post: tuple[str, ...]  # wanted, not listed: registered (again)
    rekey: tuple[str, ...]  # ours, listed, wanted with another key: deleted and posted again
    delete: tuple[str, ...]  # ours, listed, no longer wanted
    unlisted: tuple[str, ...]  # ours, not listed, no longer wanted: pending in smg, or gone


def plan(wanted: list[str], listed_ids: dict[str, str | None], ours: set[str],
         key_changed: set[str]) -> Plan:
    """The sync's steps (pure). WANTED: the URLs of WORKERS, in order; LISTED_IDS: the URLs the
    gateway lists, each with its id (None: none given, so it cannot be deleted); OURS: the
    URLs this script posted (STATE); KEY_CHANGED: wanted URLs whose key is not the one they
    were registered with. A worker someone else added is never deleted or posted again."""
    post = tuple(url for url in wanted if url not in listed_ids)
    rekey = tuple(url for url in wanted if url in ours and url in key_changed
                  and listed_ids.get(url))
    gone = sorted(ours - set(wanted))
    delete = tuple(url for url in gone if listed_ids.get(url))
    unlisted = tuple(url for url in gone if url not in listed_ids)
    return Plan(post, rekey, delete, unlisted)


def register(gateway: str, key: str | None, worker: dict, keys: dict[str, str]) -> tuple[str, str | None]:
    """POST WORKER: (``posted``, its id) when smg took it; (``in_progress``, the id) when smg
    already holds a pending registration of it (409); (``exists``, None) when it was listed
    meanwhile (409). Another refusal: a GatewayError with smg's code and message."""
    try:
        answer = call(gateway, "POST", "/workers", key, worker_spec(worker, keys))
    except GatewayError as error:
        if error.status == 409 and error.code == IN_PROGRESS:
            return "in_progress", in_progress_id(str(error))
        if error.status == 409 and error.code == ALREADY_EXISTS:
            return "exists", None
        raise
    ident = answer.get("worker_id")
    return "posted", ident if isinstance(ident, str) else None


def sync(gateway: str, workers: list[dict], env_file: str, keys_file: str, state_file: str,
         timeout: float) -> dict:
    """Register the missing workers, remove those this script registered that are gone; what
    the gateway lists at the end, read back."""
    key = env_value(env_file, GATEWAY_KEY)
    keys, which = read_keys(keys_file)
    # Without the link (a gateway registered by an older deploy) the keys they hold are not
    # known: none is registered again for it.
    held, known = read_keys(registered_keys_path(keys_file))
    deadline = time.monotonic() + timeout
    present = {norm(w["url"]): w for w in wait_listed(gateway, key, timeout)}
    wanted = {norm(w["url"]): w for w in workers}
    ours = read_registrations(state_file)
    changed = {url for url, w in wanted.items()
               if known and worker_spec(w, held) != worker_spec(w, keys)}
    ids = {url: (w.get("id") if isinstance(w.get("id"), str) else None)
           for url, w in present.items()}
    steps = plan(list(wanted), ids, set(ours), changed)
    for url in steps.post:
        how, ident = register(gateway, key, wanted[url], keys)
        # Only what this script posted is its own: a registration pending for someone else,
        # or a worker listed meanwhile, is not recorded.
        if how == "posted" or (how == "in_progress" and url in ours):
            ours[url] = ident
        write_registrations(state_file, ours)
    for url in steps.rekey:
        call(gateway, "DELETE", worker_path(listed_id(ids, url)), key)
        settled(gateway, key, lambda urls, url=url: url not in urls, timeout)
        _, ours[url] = register(gateway, key, wanted[url], keys)
        write_registrations(state_file, ours)
        settled(gateway, key, lambda urls, url=url: url in urls, timeout)
    for url in steps.delete:
        call(gateway, "DELETE", worker_path(listed_id(ids, url)), key)
    stray = []
    for url in steps.unlisted:
        # smg cannot withdraw a pending registration: it stays ours until it is gone, or
        # listed (and then deleted by the next sync).
        if (ident := ours[url]) and registration(gateway, key, ident) == PENDING:
            stray.append(url)
        else:
            del ours[url]
    write_registrations(state_file, ours)
    link_registered(keys_file, which)
    # Registration and removal run in the background of the gateway: wait until each added
    # one is listed and each removed one gone, then read what it lists.
    final = wait_until(gateway, key, lambda urls: set(wanted) <= urls
                       and not urls & set(steps.delete), max(0.0, deadline - time.monotonic()))
    urls = urls_of(final)
    for url in steps.delete:
        if url not in urls:
            ours.pop(url, None)
    write_registrations(state_file, ours)
    not_up = [{"name": wanted[url].get("name") or url, "url": url,
               "pending": url in ours and bool(ours[url])}
              for url in wanted if url not in urls]
    return {"added": [url for url in steps.post if url in urls],
            "removed": [url for url in steps.delete if url not in urls],
            "rekeyed": list(steps.rekey), "not_up": not_up, "stray": stray,
            "listed": len(final)}


def sync_problems(result: dict) -> list[str]:
    """A sync's RESULT in words: each worker not up, each stray registration, each worker
    still listed that was removed."""
    lines = []
    for worker in result.get("not_up") or []:
        lines.append(f"worker {worker['name']} ({worker['url']}) is not up: "
                     + ("the gateway holds its registration (pending) and adds it once its "
                        "server answers /health" if worker.get("pending") else
                        "the gateway does not list it"))
    for url in result.get("stray") or []:
        lines.append(f"{url} is no longer a worker of this gateway, but the gateway still holds "
                     "the registration this script made (pending: smg cannot withdraw it): it "
                     "serves once its server answers, until a sync removes it")
    return lines


def status(gateway: str, env_file: str, keys_file: str, state_file: str) -> dict:
    key = env_value(env_file, GATEWAY_KEY)
    now = listed(gateway, key)
    urls = urls_of(now)
    ours = read_registrations(state_file)
    pending = [url for url, ident in sorted(ours.items())
               if url not in urls and ident and registration(gateway, key, ident) == PENDING]
    return {"workers": [{"url": w["url"], "is_healthy": w.get("is_healthy"),
                         "status": w.get("status")} for w in now],
            "registered": read_state(state_file), "pending": pending,
            "keys_current": keys_current(keys_file)}


def stream_verdict(status: int | None, events: int, ended: bool, error: str | None,
                   timeout: float) -> str | None:
    """Why a worker's answer to a streamed generation is not a whole one, or None (pure).
    STATUS: its HTTP status (None: none came); EVENTS: the ``data:`` events with text before
    its end; ENDED: whether its last event (``data: [DONE]``) came; ERROR: what stopped the
    read (a timeout, a reset), or the error answer's text."""
    if status is None:
        return f"no answer: {error or 'nothing'}"
    if status != 200:
        return f"HTTP {status}" + (f": {error}" if error else "")
    if ended:
        return None if events else "HTTP 200, then its end with no token"
    if error == "timeout":
        return (f"HTTP 200, then nothing for {timeout:g}s after "
                + (f"{events} events" if events else "its headers") + " (the stream stalled)")
    return (f"HTTP 200, then the stream ended without its last event (data: [DONE]) after "
            f"{events} events" + (f": {error}" if error else ""))


def ask(url: str, key: str | None, timeout: float) -> dict:
    """One short streamed generation from the worker at URL, TIMEOUT bounding the whole answer
    (each read waits only as long as is left)."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    start = time.monotonic()
    deadline = start + timeout
    status, events, ended, error = None, 0, False, None
    body = json.dumps({"text": PROMPT, "stream": True, "sampling_params": {
        "max_new_tokens": CHECK_TOKENS, "temperature": 0}})
    headers = {"Content-Type": "application/json", **(
        {"Authorization": f"Bearer {key}"} if key else {})}
    assert parts.hostname, f"{url}: a worker's URL has a host (gateway/workers.py renders it)"
    connection = kind(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.connect()
        # The socket itself: the connection lets go of it once an answer says "close".
        sock = connection.sock
        connection.request("POST", parts.path.rstrip("/") + "/generate", body, headers)
        answer = connection.getresponse()
        status = answer.status
        if status != 200:
            _, error = smg_error(answer.read(MAX_ERROR_BYTES).decode("utf-8", "replace"))
        else:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                line = answer.readline()
                if not line:
                    break
                if line.strip() == b"data: [DONE]":
                    ended = True
                    break
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    if isinstance(event, dict) and event.get("text") is not None:
                        events += 1
    except TimeoutError:
        error = "timeout"
    except (OSError, http.client.HTTPException, ValueError) as failure:
        error = f"{type(failure).__name__}: {failure}"[:300]
    finally:
        connection.close()
    why = stream_verdict(status, events, ended, error, timeout)
    return {"ok": why is None, "why": why, "status": status, "events": events,
            "elapsed_s": round(time.monotonic() - start, 3)}


def check(workers: list[dict], keys_file: str, timeout: float) -> dict:
    """Each worker's answer to one generation, asked of all at once."""
    keys, _ = read_keys(keys_file)
    found: dict[int, dict] = {}

    def one(index: int, worker: dict) -> None:
        found[index] = {"name": worker.get("name") or worker["url"], "url": worker["url"],
                        **ask(worker["url"], worker_key(worker, keys), timeout)}

    threads = [threading.Thread(target=one, args=(i, w)) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"workers": [found[i] for i in range(len(workers))]}


def capacity_problem(url: str, listing: list[dict]) -> str | None:
    """Why the worker at URL may not go out of the rotation now, or None (pure). LISTING: the
    gateway's workers (``GET /workers``). Every other worker it lists must be healthy in its
    view, and one at least: a roll never takes the last healthy worker out."""
    others = [w for w in listing if norm(w["url"]) != norm(url)]
    sick = sorted(w["url"] for w in others if w.get("is_healthy") is not True)
    if sick:
        return (f"{len(sick)} other worker{'s' if len(sick) != 1 else ''} not healthy in the "
                f"gateway's view: {', '.join(sick)}")
    if not others:
        return "no other worker is listed: it is the last one serving"
    return None


def running_requests(metrics: str) -> int | None:
    """The requests a server is running, summed over its ``sglang:num_running_reqs`` samples
    (one per rank), from its ``/metrics`` text; None where it has none (pure)."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        if line.startswith(RUNNING) and line[len(RUNNING):len(RUNNING) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(None, 1)[-1])
            except ValueError:
                continue
            seen = True
    return int(total) if seen else None


def in_flight(url: str) -> int | None:
    """The worker's requests in flight (its ``/metrics``, which asks no key), None where it
    does not answer them."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5) as answer:
            return running_requests(read_bounded(answer, MAX_ERROR_BYTES * 16).decode(
                "utf-8", "replace"))
    except (urllib.error.URLError, OSError, TooLarge, ValueError):
        return None


def named(workers: list[dict], name: str) -> dict:
    """The worker of WORKERS named NAME (its name, else its URL)."""
    for worker in workers:
        if name in (worker.get("name"), worker["url"]):
            return worker
    raise ValueError(f"no worker named {name!r} in the worker list; allowed: "
                     + ", ".join(str(w.get("name") or w["url"]) for w in workers))


def take_out(gateway: str, worker: dict, env_file: str, state_file: str, timeout: float,
             drain: float) -> dict:
    """``out``: WORKER out of the rotation once the others can serve, its requests in flight
    done (up to DRAIN seconds)."""
    key = env_value(env_file, GATEWAY_KEY)
    url = norm(worker["url"])
    deadline = time.monotonic() + timeout
    while True:
        listing = listed(gateway, key)
        problem = capacity_problem(url, listing)
        if problem is None or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    if problem:
        raise CapacityError(f"{worker.get('name') or url} stays in: {problem} (waited "
                            f"{timeout:g}s)")
    start = time.monotonic()
    ident = next((w.get("id") for w in listing if norm(w["url"]) == url), None)
    was_listed = any(norm(w["url"]) == url for w in listing)
    if was_listed and isinstance(ident, str):
        call(gateway, "DELETE", worker_path(ident), key)
        settled(gateway, key, lambda urls: url not in urls, timeout)
        ours = read_registrations(state_file)
        if url in ours:
            ours[url] = None  # the id is gone with it; ``in`` records the new one
            write_registrations(state_file, ours)
    out_s = time.monotonic() - start  # smg removes a worker in the background of the DELETE
    left = in_flight(url)
    until = time.monotonic() + drain
    while left and time.monotonic() < until:
        time.sleep(0.1)
        left = in_flight(url)
    return {"worker": worker.get("name") or url, "url": url, "was_listed": was_listed,
            "out_s": round(out_s, 3), "drain_s": round(time.monotonic() - start, 3),
            "in_flight": left,
            "cut": left or 0}


def give_back(gateway: str, worker: dict, env_file: str, keys_file: str, state_file: str,
              timeout: float) -> dict:
    """``in``: WORKER registered again, listed healthy by the gateway (up to TIMEOUT)."""
    key = env_value(env_file, GATEWAY_KEY)
    keys, _ = read_keys(keys_file)
    url = norm(worker["url"])
    start = time.monotonic()
    healthy = lambda: any(norm(w["url"]) == url and w.get("is_healthy") is True  # noqa: E731
                          for w in listed(gateway, key))
    if not any(norm(w["url"]) == url for w in listed(gateway, key)):
        how, ident = register(gateway, key, worker, keys)
        if how in ("posted", "in_progress"):
            ours = read_registrations(state_file)
            ours[url] = ident
            write_registrations(state_file, ours)
    deadline = start + timeout
    while not healthy():
        if time.monotonic() >= deadline:
            raise NotUpError(f"{worker.get('name') or url} is not listed healthy by the "
                             f"gateway {timeout:g}s after it was registered again")
        time.sleep(0.25)
    return {"worker": worker.get("name") or url, "url": url,
            "listed_s": round(time.monotonic() - start, 3)}


def scrub(text: str, secrets: list[str]) -> str:
    """TEXT with each of SECRETS masked (an error answer that quoted a request's body)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "<secret>")
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gateway_workers.py")
    parser.add_argument("command", choices=("sync", "status", "check", "out", "in"))
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--workers", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--keys-file", required=True)
    parser.add_argument("--state", default="")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--not-up-ok", action="store_true")
    parser.add_argument("--worker", default="")
    parser.add_argument("--drain", type=float, default=60)
    args = parser.parse_args(argv)
    secrets = [env_value(args.env_file, GATEWAY_KEY) or "",
               *read_keys(args.keys_file)[0].values()]
    code = 0
    try:
        workers = wanted_workers(args.workers)
        if args.command == "sync":
            if not args.state:
                raise ValueError("sync needs --state FILE")
            result = sync(args.gateway, workers, args.env_file, args.keys_file, args.state,
                          args.timeout)
            problems = sync_problems(result)
            for line in problems:
                print(f"gateway_workers.py: {line}", file=sys.stderr)
            code = EXIT_NOT_UP if problems and not args.not_up_ok else 0
        elif args.command == "status":
            result = status(args.gateway, args.env_file, args.keys_file, args.state)
        elif args.command in ("out", "in"):
            if not args.state or not args.worker:
                raise ValueError(f"{args.command} needs --state FILE and --worker NAME")
            worker = named(workers, args.worker)
            result = (take_out(args.gateway, worker, args.env_file, args.state, args.timeout,
                               args.drain) if args.command == "out" else
                      give_back(args.gateway, worker, args.env_file, args.keys_file,
                                args.state, args.timeout))
        else:
            if args.worker:
                workers = [named(workers, args.worker)]
            result = check(workers, args.keys_file, args.timeout)
    except ValueError as error:
        print(json.dumps({"error": scrub(str(error), secrets)}))
        return EXIT_USAGE
    except GatewayError as error:
        print(json.dumps({"error": scrub(f"the gateway at {args.gateway}: {error}", secrets)}))
        return EXIT_GATEWAY
    except CapacityError as error:
        print(json.dumps({"error": scrub(str(error), secrets)}))
        return EXIT_CAPACITY
    except NotUpError as error:
        print(json.dumps({"error": scrub(str(error), secrets)}))
        return EXIT_NOT_UP
    print(scrub(json.dumps(result), secrets))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
