"""A client of a gateway or a server (stdlib only), run where they are reached: in the
gateway's container for the tests, beside the workers for the bench.

``python3 gateway_client.py requests --url URL --count N --concurrency C [--prefix-words W]
[--tokens T] [--seconds S] [--whole-every K]``: N requests to SGLang's ``/generate`` (streamed,
as ``bench_serving``'s ``sglang`` backend sends them; with ``--whole-every`` K, every K-th one
asks its answer whole, not streamed, as most API clients do), C at a time; each prompt is unique, and with
``--prefix-words`` W they all open with the same W words (a shared system prompt). With
``--seconds`` it sends for that long instead (N ignored); with ``--until FILE``, until FILE
exists (a test's change is over). URL may list several servers,
comma-separated: the client then sends to each in turn (balancing by hand, no gateway). The key, if any, comes from the
``API_KEY`` environment variable. Prints one JSON line: the count of each HTTP status (or
``error``; ``cut``: HTTP 200, but the stream ended without its last event ``data: [DONE]``, as
smg ends a stream whose worker died: a failed request, whatever its status; for an answer
asked whole, ``cut`` where it is not one JSON object with every token asked), the same per kind
(``stream``, ``whole``), wall seconds, output tokens per second, and each request's (start, end,
status, kind).
``--counts URL...`` prints each server's ``sglang:num_requests_total`` from its /metrics.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid


#: The status of a request whose stream ended without its last event.
CUT = "cut"


def one(url: str, key: str | None, text: str, tokens: int, stream: bool = True) -> tuple[str, int]:
    """(status, tokens generated) of one /generate, STREAM or asked whole: the HTTP status,
    ``cut`` where the stream ended without ``data: [DONE]`` (or the whole answer is not one
    JSON object with TOKENS tokens), ``error`` where none came."""
    body = json.dumps({"text": text, "stream": stream,
                       "sampling_params": {"max_new_tokens": tokens}}).encode()
    request = urllib.request.Request(url.rstrip("/") + "/generate", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            if not stream:
                return whole(answer.status, answer.read(), tokens)
            generated, ended = 0, False
            for line in answer:
                if line.startswith(b"data: {"):
                    meta = json.loads(line[6:]).get("meta_info", {})
                    generated = int(meta.get("completion_tokens", generated))
                elif line.strip() == b"data: [DONE]":
                    ended = True
            return (str(answer.status) if ended else CUT), generated
    except urllib.error.HTTPError as error:
        return str(error.code), 0
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return "error", 0


def whole(status: int, body: bytes, tokens: int) -> tuple[str, int]:
    """(status, tokens generated) of an answer asked whole: ``cut`` unless BODY is SGLang's
    one JSON object with TOKENS completion tokens (a worker that died midway sends less)."""
    try:
        meta = json.loads(body).get("meta_info") or {}
        generated = int(meta.get("completion_tokens"))
    except (ValueError, TypeError, AttributeError):
        return CUT, 0
    return (str(status) if generated == tokens else CUT), generated


def run(args: argparse.Namespace) -> dict:
    key = os.environ.get("API_KEY") or None
    urls = args.url.split(",")  # several: the client spreads its requests itself, in turn
    prefix = " ".join(["shared system prompt words"] * args.prefix_words)
    counter = {"next": 0}
    lock = threading.Lock()
    log: list[tuple[float, float, str, str]] = []
    tokens = {"total": 0}
    by_kind: dict[str, dict[str, int]] = {}
    deadline = time.time() + args.seconds if args.seconds else None

    def worker() -> None:
        while True:
            with lock:
                n = counter["next"]
                if args.until:
                    if os.path.exists(args.until):
                        return
                elif (deadline is None and n >= args.count) or (deadline and time.time() >= deadline):
                    return
                counter["next"] += 1
            # Unique from its first character: a prefix router (cache_aware) matches no other
            # prompt by a shared opening ("question 1..."), only by the W words asked for.
            text = f"{prefix} {uuid.uuid4().hex} question {n}".strip()
            start = time.time()
            stream = not (args.whole_every and n % args.whole_every == args.whole_every - 1)
            status, generated = one(urls[n % len(urls)], key, text, args.tokens, stream)
            with lock:
                log.append((start, time.time(), status, "stream" if stream else "whole"))
                kind = by_kind.setdefault("stream" if stream else "whole", {})
                kind[status] = kind.get(status, 0) + 1
                tokens["total"] += generated

    began = time.time()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.time() - began
    codes: dict[str, int] = {}
    for _, _, status, _ in log:
        codes[status] = codes.get(status, 0) + 1
    return {"codes": codes, "by_kind": by_kind, "wall_s": wall, "tok_s": tokens["total"] / wall if wall else 0.0,
            "requests": sorted(log)}


def counts(urls: list[str]) -> dict:
    found = {}
    for url in urls:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as answer:
            total = 0.0
            for line in answer.read().decode().splitlines():
                if line.startswith("sglang:num_requests_total"):
                    total += float(line.rsplit(" ", 1)[1])
        found[url] = int(total)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("requests", "counts"))
    parser.add_argument("--url", default="")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--prefix-words", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0)
    parser.add_argument("--until", default="")
    parser.add_argument("--whole-every", type=int, default=0)
    parser.add_argument("urls", nargs="*")
    args = parser.parse_args(argv)
    print(json.dumps(run(args) if args.command == "requests" else counts(args.urls)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
