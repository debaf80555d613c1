"""A stand-in of smg 1.13.0's worker API (stdlib only), for fast tests of the deploy's worker
script (``pve_sglang/remote/gateway_workers.py``) without the real gateway.

It answers as the real smg 1.13.0 (from the project's hashed lock) answered when asked, in
front of stand-in SGLang servers (``tests/standin_sglang.py``), with
``--worker-startup-timeout-secs``; the answers' shapes, codes and messages are copied from it:

+ ``GET /workers``: ``{"workers": [...], "total": N, "stats": {...}}``, the workers it has
  added (each ``{"id", "url", "is_healthy", "status": "ready", ...}``); a registration still
  pending is not listed.
+ ``POST /workers`` ``{"url", "api_key"?}``: 202 ``{"status": "accepted", "worker_id", "url",
  "location", "message"}``, the registration then done in the background: a worker whose server
  answers (a URL in ``up``) is listed a moment later; another stays pending (``GET
  /workers/{id}``: ``"status": "pending"``) until its server answers, or for
  ``startup_timeout`` seconds, then forgotten (404). A second POST of a listed URL: 409
  ``WORKER_ALREADY_EXISTS``; of a pending one: 409 ``WORKER_CREATE_IN_PROGRESS`` ("... with ID
  <id>. Poll GET /workers/<id>."). A body without a string ``url``: 400 ``BAD_REQUEST``.
+ ``DELETE /workers/{id}``: a listed worker: 202, removed a moment later; a pending one: 202,
  but the registration goes on (smg's removal job fails, "not found", and the worker is added
  once its server answers); an unknown id: 404 ``WORKER_NOT_FOUND``; not a UUID: 400.
+ ``GET /workers/{id}``: the worker (``pending`` for a registration in progress), or 404.
+ With a key: 401 ``{"error": {"message": "Invalid API key", ..., "code": "invalid_api_key"}}``
  to a request without it.

``others`` adds workers someone else registered (listed, never this script's); ``filler``
pads ``GET /workers`` with that many such workers of about 0.9 KB each, as smg describes one (a
large fleet: 7,000 make about 6 MB). ``echo_bad_body``: a 400 that quotes the request's body
(a gateway that does; smg 1.13.0 quotes only its parser's words). ``requests`` records each
(method, path). Not a mock of the deploy's code: a server the script talks HTTP to.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

ADD_DELAY_S = 0.05
REMOVE_DELAY_S = 0.05


@dataclass
class Registration:
    url: str
    ident: str
    api_key: str | None
    since: float
    status: str = "pending"  # pending -> ready (listed); draining (deleted, listed a moment)
    ready_at: float | None = None
    gone_at: float | None = None
    by_us: bool = True


@dataclass
class StandinSmg:
    """The stand-in's state; ``start()`` serves it on 127.0.0.1, ``url`` is its base URL."""

    key: str | None = None
    up: set[str] = field(default_factory=set)
    #: Workers listed but unhealthy (their health checks failing in smg's view).
    sick: set[str] = field(default_factory=set)
    startup_timeout: float = 60.0
    filler: int = 0
    echo_bad_body: bool = False
    requests: list[tuple[str, str]] = field(default_factory=list)
    workers: dict[str, Registration] = field(default_factory=dict)  # by id
    url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._fleet: list[dict] | None = None

    # --- the test's side ---------------------------------------------------------------------

    def start(self) -> StandinSmg:
        owner = self

        class Handler(_Handler):
            smg = owner

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def add_other(self, url: str, api_key: str | None = None) -> str:
        """A worker someone else registered, listed at once; its id."""
        with self._lock:
            ident = str(uuid.uuid4())
            now = time.monotonic()
            self.workers[ident] = Registration(url, ident, api_key, now, "ready", now, by_us=False)
            return ident

    def listed_urls(self) -> list[str]:
        with self._lock:
            self._advance()
            return sorted(r.url for r in self.workers.values() if r.status in ("ready", "draining"))

    def key_of(self, url: str) -> str | None:
        with self._lock:
            self._advance()
            return next((r.api_key for r in self.workers.values() if r.url == url
                         and r.status == "ready"), None)

    def pending_urls(self) -> list[str]:
        with self._lock:
            self._advance()
            return sorted(r.url for r in self.workers.values() if r.status == "pending")

    # --- smg's side --------------------------------------------------------------------------

    def _advance(self) -> None:
        """The background jobs, brought up to now: registrations done, given up, removals."""
        now = time.monotonic()
        for ident, reg in list(self.workers.items()):
            if reg.status == "pending":
                if reg.url in self.up and reg.ready_at is None:
                    reg.ready_at = now + ADD_DELAY_S
                if reg.ready_at is not None and now >= reg.ready_at:
                    reg.status = "ready"
                elif now - reg.since >= self.startup_timeout:
                    del self.workers[ident]
            elif reg.status == "draining" and reg.gone_at is not None and now >= reg.gone_at:
                del self.workers[ident]

    def describe(self, reg: Registration) -> dict:
        """A worker as smg 1.13.0's ``GET /workers`` describes one (its fields, no key)."""
        listed = reg.status in ("ready", "draining")
        return {
            "id": reg.ident, "model_id": "standin-model" if listed else None, "url": reg.url,
            "models": [{"id": "standin-model",
                        "model_type": ["chat", "completions", "responses", "tools"]}],
            "worker_type": "regular", "connection_mode": "http",
            "runtime_type": "sglang" if listed else "unspecified",
            "labels": {"version": "standin", "model_path": "/models/standin", "tp_size": "1",
                       "served_model_name": "standin-model"},
            "priority": 50, "cost": 1.0, "max_connection_attempts": 20,
            "is_healthy": reg.status == "ready" and reg.url not in self.sick, "status": reg.status, "load": 0,
            "http2": False,
            **({"job_status": {"job_type": "AddWorker", "worker_url": reg.url,
                               "status": "processing", "message": None,
                               "timestamp": int(time.time())}}
               if reg.status == "pending" else {}),
        }

    def listing(self) -> dict:
        workers = [self.describe(r) for r in self.workers.values()
                   if r.status in ("ready", "draining")]
        if self._fleet is None:
            self._fleet = [self._fleet_worker(n) for n in range(self.filler)]
        workers += self._fleet
        return {"workers": workers, "total": len(workers),
                "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(workers)}}

    def listing_bytes(self) -> bytes:
        """``listing`` as JSON, the fleet's part encoded once (a large fleet's 6 MB)."""
        if not self.filler:
            return json.dumps(self.listing()).encode()
        if self._fleet is None:
            self._fleet = [self._fleet_worker(n) for n in range(self.filler)]
            self._fleet_json = json.dumps(self._fleet)[1:-1].encode()
        own = [json.dumps(self.describe(r)).encode() for r in self.workers.values()
               if r.status in ("ready", "draining")]
        total = len(own) + len(self._fleet)
        return (b'{"workers": [' + b", ".join([*own, self._fleet_json]) + b'], "total": '
                + str(total).encode() + b', "stats": {"prefill_count": 0, "decode_count": 0, '
                b'"regular_count": ' + str(total).encode() + b"}}")

    def _fleet_worker(self, n: int) -> dict:
        filler = Registration(f"http://fleet-{n}.example:30000", str(uuid.uuid4()), None, 0.0,
                              "ready", by_us=False)
        return {**self.describe(filler), "engine_load": {
                "timestamp": "", "version": "", "dp_rank_count": 1, "loads": [
                    {"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
                     "num_waiting_uncached_tokens": 0, "num_total_reqs": 0, "num_used_tokens": 0,
                     "max_total_num_tokens": 0, "token_usage": 0.0, "gen_throughput": 0.0,
                     "cache_hit_rate": 0.0, "utilization": 0.0, "max_running_requests": 0}]}}

    def post(self, body: object, raw: bytes) -> tuple[int, dict]:
        url = body.get("url") if isinstance(body, dict) else None
        if not isinstance(url, str):
            said = ("Invalid JSON data: " + raw.decode("utf-8", "replace")) if self.echo_bad_body \
                else "Invalid JSON data: Failed to deserialize the JSON body into the target type"
            return 400, {"error": said, "code": "BAD_REQUEST"}
        for reg in self.workers.values():
            if reg.url == url and reg.status == "pending":
                return 409, {"error": f"Worker creation already in progress for URL '{url}' with "
                                      f"ID {reg.ident}. Poll GET /workers/{reg.ident}.",
                             "code": "WORKER_CREATE_IN_PROGRESS"}
            if reg.url == url:
                return 409, {"error": f"Worker already exists at URL '{url}' with ID {reg.ident}. "
                                      f"Use PUT /workers/{reg.ident} to replace or PATCH "
                                      f"/workers/{reg.ident} to update.",
                             "code": "WORKER_ALREADY_EXISTS"}
        if self.echo_bad_body and body.get("api_key"):
            return 400, {"error": "Invalid JSON data: " + raw.decode("utf-8", "replace"),
                         "code": "BAD_REQUEST"}
        ident = str(uuid.uuid4())
        self.workers[ident] = Registration(url, ident, body.get("api_key"), time.monotonic())
        return 202, {"status": "accepted", "worker_id": ident, "url": url,
                     "location": f"/workers/{ident}",
                     "message": "Worker addition queued for background processing"}

    def delete(self, ident: str) -> tuple[int, dict]:
        try:
            uuid.UUID(ident)
        except ValueError:
            return 400, {"error": f"Invalid worker_id '{ident}' (expected UUID).",
                         "code": "BAD_REQUEST"}
        reg = self.workers.get(ident)
        if reg is None:
            return 404, {"error": f"Worker {ident} not found", "code": "WORKER_NOT_FOUND"}
        if reg.status == "ready":  # a pending one goes on: smg's removal job finds no worker
            reg.status, reg.gone_at = "draining", time.monotonic() + REMOVE_DELAY_S
        return 202, {"status": "accepted", "worker_id": ident,
                     "message": "Worker removal queued for background processing"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    smg: StandinSmg

    def _answer(self, code: int, value: dict | bytes) -> None:
        body = value if isinstance(value, bytes) else json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, method: str) -> None:
        smg = self.smg
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with smg._lock:
            smg.requests.append((method, self.path))
            if smg.key and self.headers.get("Authorization") != f"Bearer {smg.key}":
                self._answer(401, {"error": {"message": "Invalid API key",
                                             "type": "invalid_request_error", "param": None,
                                             "code": "invalid_api_key"}})
                return
            smg._advance()
            ident = self.path.removeprefix("/workers/") if self.path.startswith("/workers/") else None
            if method == "GET" and self.path == "/workers":
                self._answer(200, smg.listing_bytes())
            elif method == "POST" and self.path == "/workers":
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = None
                self._answer(*smg.post(body, raw))
            elif method == "DELETE" and ident:
                self._answer(*smg.delete(ident))
            elif method == "GET" and ident:
                reg = smg.workers.get(ident)
                if reg is None:
                    self._answer(404, {"error": f"Worker {ident} not found",
                                       "code": "WORKER_NOT_FOUND"})
                else:
                    self._answer(200, smg.describe(reg))
            else:
                self._answer(404, {"error": {"type": "invalid_request_error",
                                             "code": "unknown_url", "message":
                                             f"Invalid URL ({method} {self.path})", "param": None}})

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, *args) -> None:
        pass
