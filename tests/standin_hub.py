"""A stand-in for the Hugging Face Hub (stdlib only): the part of its HTTP API that
``huggingface_hub`` uses to download a model, serving synthetic repositories from files on disk.

Spoken as huggingface_hub 0.36 asks it (``hf_api.py`` ``model_info``, ``file_download.py``
``get_hf_file_metadata`` / ``http_get``, ``utils/_http.py`` ``hf_raise_for_status``):

+ ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (``?blobs=true``): ``id``,
  ``sha`` (the commit), ``gated`` and ``siblings`` with ``rfilename``, ``size``, ``blobId`` and,
  for LFS files, ``lfs: {sha256, size, pointerSize}``
+ ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag`` (the git blob id, or
  the sha256 for LFS files, with ``X-Linked-Etag`` and ``X-Linked-Size``), ``Content-Length``,
  ``Accept-Ranges`` and ``Range: bytes=N-`` answered 206 with ``Content-Range``
+ what a hostile mirror could answer: any file name (``commits``' keys), any ``sha``
  (``claimed``), any file header (``answers``: an ``ETag`` that is a path, another commit),
  files listed without size or hash (``bare``)
+ errors as the hub gives them: an unknown repository 401 ``X-Error-Code: RepoNotFound``, an
  unknown revision 404 ``RevisionNotFound``, a file of a gated repository without a granted
  token 401 ``GatedRepo``

It records each request (``requests``: method, path, range start) so a test can tell what was
fetched, and can send at most ``rate`` bytes a second per response (a download slow enough to
be killed half way). Run alone for the bench: ``python tests/standin_hub.py --port N --repo
ORG/NAME --dir FILES``.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
CHUNK = 1024 * 1024


@dataclass
class Repo:
    """A repository: its branches and tags (name -> commit) and each commit's files (name ->
    path on disk)."""

    refs: dict[str, str]
    commits: dict[str, dict[str, Path]]
    gated: bool = False
    default: str = "main"
    #: Sizes the metadata claims instead of the files' (a model too large for the disk).
    declared: dict[str, int] = field(default_factory=dict)
    #: The commit the metadata claims instead of the real one (a hostile mirror; a file name
    #: of its own, such as ``../../victim.txt``, is a key of ``commits``).
    claimed: str | None = None
    #: Headers a hostile mirror answers for a file (name -> {header: value}) instead of its
    #: own, on HEAD and GET: an ``ETag`` that is a path, another ``X-Repo-Commit``, a size.
    answers: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Files the metadata lists by name alone, without size, blob id or LFS sha256 (a mirror
    #: that keeps no hashes).
    bare: set[str] = field(default_factory=set)


def digests(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of PATH."""
    sha, blob = hashlib.sha256(), hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK * 8):
            sha.update(chunk)
            blob.update(chunk)
    return sha.hexdigest(), blob.hexdigest()


@dataclass
class StandinHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)
    rate: int | None = None  # bytes a second per response, None: as fast as it goes
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    bytes_sent: int = 0  # file bytes sent in all responses
    _digests: dict[Path, tuple[str, str]] = field(default_factory=dict)
    _server: http.server.ThreadingHTTPServer | None = None

    # --- the repositories ---

    def digest(self, path: Path) -> tuple[str, str]:
        key = (path, path.stat().st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = digests(path)
        return self._digests[key]

    def commit_of(self, repo: Repo, rev: str) -> str | None:
        if rev in repo.commits:
            return rev
        return repo.refs.get(rev)

    def siblings(self, files: dict[str, Path], declared: dict[str, int] | None = None,
                 bare: set[str] = frozenset()) -> list[dict]:
        out = []
        for name, path in sorted(files.items()):
            if name in bare:
                out.append({"rfilename": name})
                continue
            size = (declared or {}).get(name, path.stat().st_size)
            sha, blob = self.digest(path)
            entry = {"rfilename": name, "size": size, "blobId": blob}
            if name.endswith(LFS_SUFFIXES):
                # The blob of an LFS file is its pointer; its size the pointer's; lfs.size the file's.
                entry.update(blobId=hashlib.sha1(f"lfs pointer {sha}".encode()).hexdigest(),
                             size=size, lfs={"sha256": sha, "size": size, "pointerSize": 134})
            out.append(entry)
        return out

    def model_files_gets(self, name: str) -> int:
        """How many GETs of file NAME (of any repository) the hub answered."""
        return sum(1 for method, path, _ in self.requests if method == "GET" and path.endswith("/" + name))

    # --- serving ---

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub.answer(self, head=False)

            def do_HEAD(self):
                hub.answer(self, head=True)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a client killed mid-file: quiet
                pass

        self._server = Server((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def answer(self, request, head: bool) -> None:
        path = urlparse(request.path).path
        rng = request.headers.get("Range")
        start = int(m.group(1)) if rng and (m := re.match(r"bytes=(\d+)-", rng)) else 0
        self.requests.append(("HEAD" if head else "GET", unquote(path), start))
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if api:
            return self.model_info(request, unquote(api.group(1)), unquote(api.group(2) or ""))
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if resolve:
            return self.resolve(request, head, unquote(resolve.group(1)),
                                unquote(resolve.group(2)), unquote(resolve.group(3)), start if rng else None)
        self.error(request, 404, "", "not a hub path")

    def error(self, request, status: int, code: str, message: str, head: bool = False) -> None:
        body = json.dumps({"error": message}).encode()
        request.send_response(status)
        if code:
            request.send_header("X-Error-Code", code)
        request.send_header("X-Error-Message", message)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        if not head:
            request.wfile.write(body)

    def authorized(self, request) -> bool:
        auth = request.headers.get("Authorization") or ""
        return auth.startswith("Bearer ") and auth[7:] in self.tokens

    def model_info(self, request, name: str, rev: str) -> None:
        repo = self.repos.get(name)
        if repo is None:
            return self.error(request, 401, "RepoNotFound", "Repository not found")
        commit = self.commit_of(repo, rev or repo.default)
        if commit is None:
            return self.error(request, 404, "RevisionNotFound", "Invalid rev id: " + rev)
        body = json.dumps({"id": name, "modelId": name, "sha": repo.claimed or commit, "private": False,
                           "gated": "manual" if repo.gated else False, "disabled": False,
                           "tags": [], "siblings": self.siblings(repo.commits[commit], repo.declared, repo.bare)}).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def resolve(self, request, head: bool, name: str, rev: str, filename: str, start: int | None) -> None:
        repo = self.repos.get(name)
        if repo is None:
            return self.error(request, 401, "RepoNotFound", "Repository not found", head)
        commit = self.commit_of(repo, rev)
        if commit is None:
            return self.error(request, 404, "RevisionNotFound", "Invalid rev id: " + rev, head)
        if repo.gated and not self.authorized(request):
            return self.error(request, 401, "GatedRepo", "Access to model is restricted", head)
        path = repo.commits[commit].get(filename)
        if path is None:
            return self.error(request, 404, "EntryNotFound", "Entry not found", head)
        size = path.stat().st_size
        sha, blob = self.digest(path)
        lfs = filename.endswith(LFS_SUFFIXES)
        etag = sha if lfs else blob
        first = start or 0
        if first > size or (first == size and size):
            request.send_response(416)
            request.send_header("Content-Range", f"bytes */{size}")
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        partial = start is not None and not head
        request.send_response(206 if partial else 200)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"'}
        if lfs:
            headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(size)})
        headers.update({"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"})
        if partial:
            headers["Content-Range"] = f"bytes {first}-{size - 1}/{size}"
        headers["Content-Length"] = str(size - first if partial else size)
        headers.update(repo.answers.get(filename, {}))
        for key, value in headers.items():
            request.send_header(key, value)
        request.end_headers()
        if head:
            return
        with path.open("rb") as handle:
            handle.seek(first if partial else 0)
            began, sent = time.monotonic(), 0
            try:
                while chunk := handle.read(CHUNK if self.rate is None else min(CHUNK, max(1, self.rate // 10))):
                    request.wfile.write(chunk)
                    sent += len(chunk)
                    self.bytes_sent += len(chunk)
                    if self.rate:
                        ahead = sent / self.rate - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)
            except (BrokenPipeError, ConnectionResetError):
                pass


@contextmanager
def serving(repo: str, commit: str, files: dict[str, Path], tokens: set[str] | None = None,
            host: str = "127.0.0.1") -> Iterator[StandinHub]:
    """A hub serving REPO with one commit of FILES on its ``main`` branch, at HOST, while the
    block runs; TOKENS are granted a gated repository."""
    hub = StandinHub(repos={repo: Repo(refs={"main": commit}, commits={commit: files})},
                     tokens=set(tokens or ()))
    hub.start(host)
    try:
        yield hub
    finally:
        hub.stop()


def synthetic_files(folder: Path, shards: int, shard_bytes: int, seed: str = "standin") -> dict[str, Path]:
    """A model-shaped repository in FOLDER: config.json, tokenizer files and SHARDS
    ``model-0000N-of-0000M.safetensors`` of SHARD_BYTES each (deterministic bytes from SEED),
    made once."""
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    small = {"config.json": json.dumps({"architectures": ["StandinForCausalLM"], "seed": seed}),
             "tokenizer_config.json": json.dumps({"model_max_length": 4096}),
             "generation_config.json": json.dumps({"temperature": 0.6})}
    for name, text in small.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        files[name] = path
    block = hashlib.sha256(seed.encode()).digest() * (CHUNK // 32)
    for index in range(1, shards + 1):
        name = f"model-{index:05d}-of-{shards:05d}.safetensors"
        path = folder / name
        if not path.exists() or path.stat().st_size != shard_bytes:
            with path.open("wb") as handle:
                left, salt = shard_bytes, index.to_bytes(4, "big")
                while left > 0:
                    chunk = (salt + block)[:min(left, CHUNK)]
                    handle.write(chunk)
                    left -= len(chunk)
        files[name] = path
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--rate", type=int, default=None)
    args = parser.parse_args()
    files = synthetic_files(args.dir, args.shards, args.shard_mb * 1024 * 1024)
    commit = hashlib.sha1(b"".join(sorted(n.encode() for n in files))).hexdigest()
    hub = StandinHub(repos={args.repo: Repo(refs={"main": commit}, commits={commit: files})},
                     rate=args.rate)
    print(hub.start(args.host, args.port), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
