"""Fetch a Hugging Face model once, verified and resumable, with progress lines.

Stand-alone: the standard library and ``huggingface_hub`` (the Python that runs it has it: the
sglang venv in a container, the model tools venv on a host). Uploaded by the deploy and run as
``PYTHON model_fetch.py COMMAND ...``; each command prints JSON objects, one a line.

Layout under ROOT (``--root``):

store (default)   ROOT/<commit>/ holds the files (mounted read-only into containers);
                  ROOT/revisions.json, ROOT/<commit>.log and ROOT/<commit>.lock beside it.
``--flat``        ROOT holds the files itself (a container's own ``model_path``); the state
                  goes to ROOT/.cache/pve-sglang/.

Commands:

``plan --repo R [--revision REV] --root ROOT [--flat] [--link L] [--env-file F]``
    Changes nothing. Resolves REV (default: the default branch) to a commit: a branch or tag
    fetched before keeps the commit recorded in revisions.json, and a hub that moved it since
    is reported (``recorded`` differs from ``hub_commit``), never followed. Checks every file
    present at the hub's size, LFS files at their sha256 and the others at their git blob id
    (a file whose size, mtime, inode and ctime are those it was verified at is not hashed again).
    Prints ``{"repo", "commit", "revision", "recorded", "hub_commit", "files", "bytes",
    "missing_files", "missing_bytes", "partial_bytes", "free_bytes", "complete", "settled",
    "gated", "dir"}`` (``settled``: the revision is recorded and the link L names the commit)
    or ``{"error": {"kind", "message"}}`` and exit 1 (kinds: invalid, not-found,
    revision-not-found, gated, unauthorized, network, untrusted, disk-full). ``complete``: no
    file missing and the marker is this commit's.
``fetch --repo R --commit C [--revision REV] --root ROOT [--flat] [--link L] [--env-file F]
[--interval S] [--workers N] [--background]``
    Pins REV to C (revisions.json) and removes the commit folders a changed pin left
    half-fetched; removes the marker (MARKER in the commit's folder) before anything else
    changes, then each file that is not the hub's; refuses when what is missing does not fit
    the free space; downloads what is missing (huggingface_hub resumes a ``.incomplete``
    file), hashing each file as it completes; writes the marker (each file with its size)
    last, then points the link L (the path the containers mount) at the commit's folder.
    Writes ``{"p": {"done", "total", "files_done", "files", "verified", "rate", "eta"}}``
    every S seconds and at the end ``{"done": {...}}`` or ``{"error":
    {...}}`` to ROOT's ``<commit>.log`` (and the last line to stdout). One fetch of a commit
    runs at a time (a lock file): another prints ``{"busy": true}`` and returns. Ctrl-C: the
    last line ``{"error": {"kind": "interrupted", ...}}``, exit 130.
    ``--background``: returns once the lock is held and the log is fresh (``{"started":
    true}``), the fetch going on in its own session.
``watch --log L --offset N --max-wait S``
    The fetch log L's lines after byte N as they come, for up to S seconds, returning at
    once on the fetch's last line; then ``{"offset": M, "running": bool}``.

What the hub answers is not trusted (``HF_ENDPOINT`` may name any mirror): every commit must
be 40 hex digits and every file name a relative path inside the commit's folder, or nothing is
written and the error (kind ``untrusted``) names what it sent.

The token is read from the env file (``HF_TOKEN="..."``) by this process: never on a
command line, never printed. ``HF_ENDPOINT`` in the env file names a hub mirror.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

try:  # uploaded beside this script (remote.COMPANIONS)
    from remote_env import env_value
except ImportError:  # imported as part of pve_sglang (the deploy's side, the tests)
    from pve_sglang.remote.remote_env import env_value

MARKER = ".pve-sglang-model.json"
TOKEN_VAR = "HF_TOKEN"
ENDPOINT_VAR = "HF_ENDPOINT"
#: The key of the default branch (no revision) in revisions.json.
DEFAULT_LABEL = "_default"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
HASH_CHUNK = 8 * 1024 * 1024


def emit(obj: dict, out=None) -> None:
    (out or sys.stdout).write(json.dumps(obj) + "\n")
    (out or sys.stdout).flush()


# --- where things are ---------------------------------------------------------------------


class Layout:
    def __init__(self, root: str, flat: bool):
        self.root, self.flat = root.rstrip("/") or "/", flat
        self.state = os.path.join(self.root, ".cache", "pve-sglang") if flat else self.root

    def files(self, commit: str) -> str:
        return self.root if self.flat else os.path.join(self.root, commit)

    def revisions(self) -> str:
        return os.path.join(self.state, "revisions.json")

    def log(self, commit: str) -> str:
        return os.path.join(self.state, f"{commit}.log")

    def lock(self, commit: str) -> str:
        return os.path.join(self.state, f"{commit}.lock")

    def verified(self, commit: str) -> str:
        return os.path.join(self.files(commit), ".cache", "pve-sglang", "verified.json")


def read_json(path: str, default):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def write_json(path: str, value) -> None:
    """Written whole or not at all (a rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(value, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a full disk leaves no empty temp file behind
        raise


# --- the hub ------------------------------------------------------------------------------


class HubError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def disk_full(error: BaseException | None) -> bool:
    """Whether ERROR, or one it was raised from, is a full disk (or quota)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def no_space(folder: str, need: int) -> HubError:
    probe = folder
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    return HubError("disk-full", f"the filesystem of {folder} is full: {free} bytes free, "
                                 f"{need} bytes still to fetch: free space there, or set "
                                 "model_store to a folder on a larger filesystem")


def client():
    """huggingface_hub, imported once the environment (HF_ENDPOINT) is set: it reads its
    constants when imported."""
    try:
        import huggingface_hub
        import huggingface_hub.errors  # noqa: F401 - the submodule, for its attribute
    except ImportError:
        raise HubError("client", f"huggingface_hub is not installed for {sys.executable}") from None
    return huggingface_hub


def hub_error(error: Exception, repo: str, revision: str | None) -> HubError:
    """The hub's answer as one of a few kinds, with a message a user can act on."""
    errors = client().errors
    where = f"{repo}" + (f" at revision {revision!r}" if revision else "")
    if isinstance(error, errors.GatedRepoError):
        return HubError("gated", f"{where} is gated and the token (hf_token) has no access: "
                                 "ask for access on the model's page, or set hf_token")
    if isinstance(error, errors.RevisionNotFoundError):
        return HubError("revision-not-found", f"revision {revision!r} of {repo} does not exist "
                                              "(model_revision: a branch, tag or commit of it)")
    if isinstance(error, errors.RepositoryNotFoundError):
        return HubError("not-found", f"repository {repo} does not exist, or is private and "
                                     "hf_token cannot read it (model_download)")
    if type(error).__name__ == "HFValidationError":  # not in .errors of every release
        return HubError("invalid", f"{where}: {str(error).splitlines()[0][:300]}")
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return HubError("unauthorized", f"{where}: HTTP {status}: the token (hf_token) is refused")
    return HubError("network", f"{where}: {type(error).__name__}: {str(error).splitlines()[0][:300]}")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


#: A repository id as the hub takes it (huggingface_hub's validate_repo_id): NAME or ORG/NAME.
REPO_RE = re.compile(r"(?:[\w.-]+/)?[\w.-]{1,96}", re.ASCII)


def repo_problem(repo: str) -> str | None:
    """Why REPO is no repository id (None: it is one), before the hub is asked."""
    if not REPO_RE.fullmatch(repo) or "--" in repo or ".." in repo or repo.endswith(".git") \
            or any(part[:1] in "-." or part[-1:] in "-." for part in repo.split("/")):
        return (f"repository id {repo!r} is invalid: ORG/NAME (or NAME) of letters, digits, "
                "'-', '_' and '.', at most 96 characters each, no '--' or '..', neither part "
                "beginning or ending with '-' or '.' (model_download)")
    return None


def name_problem(name: object) -> str | None:
    """Why NAME, a file name the hub answered, cannot be written under the commit's folder
    (None: it can): a mirror is not trusted to keep its names inside it."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if name.startswith("/"):
        return "is absolute"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds a control character"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part"
    if parts[0] == ".cache" or name == MARKER:
        return "is where the fetcher keeps its own state"
    return None


def commit_problem(commit: object) -> str | None:
    return None if isinstance(commit, str) and COMMIT_RE.fullmatch(commit) else "is not 40 lowercase hex digits"


def entry_problem(entry: dict) -> str | None:
    """Why a file of the hub's answer is refused (None: it is taken)."""
    name = entry["name"]
    problem = name_problem(name)
    if problem:
        return f"file name {name!r} {problem}"
    if entry["size"] is not None and not (isinstance(entry["size"], int) and entry["size"] >= 0):
        return f"file {name!r} has size {entry['size']!r}"
    for key, pattern in (("sha256", r"[0-9a-f]{64}"), ("blob", r"[0-9a-f]{40}")):
        if entry[key] is not None and not (isinstance(entry[key], str) and re.fullmatch(pattern, entry[key])):
            return f"file {name!r} has {key} {entry[key]!r}"
    return None


def untrusted(repo: str, what: str) -> HubError:
    return HubError("untrusted", f"the hub {endpoint()} answered {repo} with {what}: refused, "
                                 "nothing written (a commit is 40 hex digits, a file name a "
                                 "relative path inside the commit's folder)")


def model_files(repo: str, revision: str | None, token: str | None) -> tuple[str, list[dict], object]:
    """(commit, [{"name", "size", "sha256" | None, "blob"}], gated) of REPO at REVISION, each
    checked before it names anything on disk."""
    problem = repo_problem(repo)
    if problem:
        raise HubError("invalid", problem)
    api = client().HfApi(token=token or False)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
    except Exception as error:  # noqa: BLE001 - each is named by hub_error
        raise hub_error(error, repo, revision) from None
    if commit_problem(info.sha):
        raise untrusted(repo, f"commit {info.sha!r}")
    files = [{"name": s.rfilename, "size": s.lfs.size if s.lfs else s.size,
              "sha256": s.lfs.sha256 if s.lfs else None, "blob": s.blob_id}
             for s in info.siblings or ()]
    for entry in files:
        problem = entry_problem(entry)
        if problem:
            raise untrusted(repo, problem)
    return info.sha, files, info.gated


def check_access(repo: str, commit: str, files: list[dict], token: str | None,
                 revision: str | None = None) -> None:
    """A gated repository answers its metadata to anyone and its files only to a granted
    token: ask for one file's metadata (a HEAD, no bytes). REVISION: what the user asked for
    (named in the error; the commit when None)."""
    if not files:
        return
    hub = client()
    try:
        hub.get_hf_file_metadata(hub.hf_hub_url(repo, files[0]["name"], revision=commit), token=token or False)
    except Exception as error:  # noqa: BLE001
        raise hub_error(error, repo, revision or commit) from None


# --- verification -------------------------------------------------------------------------


def file_digest(path: str, git_blob: bool) -> str:
    size = os.path.getsize(path)
    digest = hashlib.sha1(f"blob {size}\0".encode()) if git_blob else hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stat_key(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    # ctime too: an edit of the same size with its mtime put back (touch -r) moves it.
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def verify_file(folder: str, entry: dict, records: dict) -> bool:
    """Whether the file is the hub's: its size, then its sha256 (LFS) or git blob id, hashed
    only when its stat differs from the one recorded at its last verification."""
    path = os.path.join(folder, entry["name"])
    key = stat_key(path)
    if key is None or (entry["size"] is not None and key[0] != entry["size"]):
        return False
    expected = entry["sha256"] or entry["blob"]
    if expected is None:
        return True
    record = records.get(entry["name"])
    if record and record.get("stat") == key and record.get("hash") == expected:
        return True
    if file_digest(path, git_blob=entry["sha256"] is None) != expected:
        return False
    records[entry["name"]] = {"stat": key, "hash": expected}
    return True


def inside(folder: str, path: str) -> bool:
    """Whether PATH's folder, links followed, is FOLDER or under it."""
    base = os.path.realpath(folder)
    return os.path.commonpath([base, os.path.realpath(os.path.dirname(path))]) == base


def forget_file(folder: str, name: str) -> None:
    """Remove a file that is not the hub's, and huggingface_hub's note of it (which would
    otherwise call it downloaded); never one outside FOLDER (NAME was checked, a link in the
    way is not followed out)."""
    if name_problem(name) or not inside(folder, os.path.join(folder, name)):
        raise HubError("untrusted", f"{name!r} is not inside {folder}: not removed")
    if os.path.isdir(os.path.join(folder, name)) and not os.path.islink(os.path.join(folder, name)):
        shutil.rmtree(os.path.join(folder, name))  # the deploy's folder: a directory where a file goes
    for path in (os.path.join(folder, name),
                 os.path.join(folder, ".cache", "huggingface", "download", f"{name}.metadata")):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def client_resumes() -> bool:
    """Whether this huggingface_hub resumes a partial download. Up to 1.x it appends to
    ``<name>.<etag>.incomplete``; later releases (its PR 4228; 1.33 here) download into a file
    unique to the process (``<name>.<etag>.<uuid>.incomplete``), which a killed run leaves
    behind and no run resumes. Read from its download function, not its version number."""
    import inspect

    try:
        from huggingface_hub import file_download
    except ImportError:  # the fetch itself says the client is missing (client())
        return True
    mover = getattr(file_download, "_download_to_tmp_and_move", None)
    try:
        return mover is None or "uuid" not in inspect.getsource(mover)
    except (OSError, TypeError):
        return True


def remove_partials(folder: str) -> None:
    """Remove the ``.incomplete`` files under FOLDER (the caller holds the fetch's lock: none
    is being written)."""
    for base, _dirs, names in os.walk(os.path.join(folder, ".cache", "huggingface", "download")):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    os.unlink(os.path.join(base, name))
                except FileNotFoundError:
                    pass


def partial_bytes(folder: str) -> int:
    """Bytes in huggingface_hub's ``.incomplete`` files under FOLDER (resumed next)."""
    total = 0
    for base, _dirs, names in os.walk(os.path.join(folder, ".cache", "huggingface", "download")):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    total += os.path.getsize(os.path.join(base, name))
                except OSError:
                    pass
    return total


def each(function, items: list, workers: int) -> list:
    """FUNCTION of each item on WORKERS threads (hashlib and the downloads release the GIL),
    in order. On an error the items not begun are cancelled; on Ctrl-C nothing is waited for."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        results = [future.result() for future in [pool.submit(function, item) for item in items]]
    except Exception:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def load_records(verified_path: str, commit: str) -> dict:
    """The verified files' records ({name: {"stat", "hash"}}) of COMMIT."""
    records = read_json(verified_path, {})
    ok = isinstance(records, dict) and records.get("commit") == commit and isinstance(records.get("files"), dict)
    return records["files"] if ok else {}


def check(folder: str, files: list[dict], records: dict, workers: int = 4) -> list[dict]:
    """The files that are missing or not the hub's (RECORDS updated in place); removes
    nothing (``invalidate`` does, the marker first)."""
    verdicts = each(lambda entry: verify_file(folder, entry, records), files, workers)
    missing = [entry for entry, ok in zip(files, verdicts) if not ok]
    for entry in missing:
        records.pop(entry["name"], None)
    return missing


def marker_of(repo: str, commit: str, files: list[dict]) -> dict:
    """What the marker says of a verified commit: each file with its size, so that a reader
    can tell a file gone since without hashing."""
    return {"repo": repo, "commit": commit, "files": len(files),
            "bytes": sum(e["size"] or 0 for e in files),
            "sizes": {e["name"]: e["size"] for e in files}}


def marker_current(marker: object, repo: str, commit: str, files: list[dict]) -> bool:
    """Whether MARKER is the one a verified COMMIT of REPO writes (its time aside): in the flat
    layout an older commit's marker, or one from before the sizes were recorded, is not."""
    if not isinstance(marker, dict):
        return False
    return {k: marker.get(k) for k in ("repo", "commit", "files", "bytes", "sizes")} == marker_of(repo, commit, files)


def invalidate(folder: str, marker: str, missing: list[dict]) -> None:
    """The marker removed first, then the files that are not the hub's: a kill between two
    steps never leaves a marker over a removed file."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(marker)
    for entry in missing:
        if os.path.lexists(os.path.join(folder, entry["name"])):
            forget_file(folder, entry["name"])


# --- revisions ----------------------------------------------------------------------------


def pinned(layout: Layout, repo: str, revision: str | None, hub_commit: str) -> tuple[str, str | None]:
    """(the commit to serve, the commit recorded before, if any) for REVISION: a commit is
    itself; a branch or tag keeps the commit recorded the first time it was fetched."""
    if revision and COMMIT_RE.fullmatch(revision):
        return revision, None
    known = read_json(layout.revisions(), {})
    known = known if isinstance(known, dict) else {}
    recorded = (known.get(repo) or {}).get(revision or DEFAULT_LABEL)
    if isinstance(recorded, dict) and not commit_problem(recorded.get("commit")):
        return recorded["commit"], recorded["commit"]
    return hub_commit, None


def record(layout: Layout, repo: str, revision: str | None, commit: str) -> None:
    """Pin REVISION to COMMIT (a commit is pinned to itself: a record that its folder is in
    use, see ``leftovers``)."""
    known = read_json(layout.revisions(), {})
    known = known if isinstance(known, dict) else {}
    label = revision or DEFAULT_LABEL
    if (known.get(repo) or {}).get(label, {}).get("commit") != commit:
        known.setdefault(repo, {})[label] = {"commit": commit, "resolved_at": int(time.time())}
        write_json(layout.revisions(), known)


def pins(layout: Layout) -> set[str]:
    """Every commit revisions.json pins, of any repository and revision."""
    known = read_json(layout.revisions(), {})
    return {entry.get("commit") for labels in (known.values() if isinstance(known, dict) else ())
            if isinstance(labels, dict) for entry in labels.values() if isinstance(entry, dict)}


def leftovers(folders: dict[str, bool], pinned_commits: set[str], current: str) -> list[str]:
    """The commit folders (FOLDERS: commit -> complete) that a changed pin left half-fetched:
    never complete, pinned by no revision, not the one being fetched. The deploy made them and
    nothing serves them (a serving link names a complete commit only)."""
    return sorted(c for c, complete in folders.items()
                  if not complete and c not in pinned_commits and c != current)


def remove_leftovers(layout: Layout, current: str, link: str | None) -> None:
    """Remove ``leftovers`` in the store (the flat layout has one folder), each under its own
    lock (a fetch of it running keeps it)."""
    if layout.flat:
        return
    folders = {}
    for name in os.listdir(layout.root):
        path = os.path.join(layout.root, name)
        if COMMIT_RE.fullmatch(name) and os.path.isdir(path) and not os.path.islink(path):
            folders[name] = read_json(os.path.join(path, MARKER), {}).get("commit") == name
    served = {os.path.basename(os.path.realpath(os.path.join(os.path.dirname(link), n)))
              for n in (os.listdir(os.path.dirname(link)) if link and os.path.isdir(os.path.dirname(link)) else ())}
    for commit in leftovers(folders, pins(layout) | served, current):
        with open(layout.lock(commit), "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue
            shutil.rmtree(layout.files(commit), ignore_errors=True)
            for path in (layout.log(commit), layout.lock(commit)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def link_ok(link: str | None, folder: str) -> bool:
    return link is None or os.path.realpath(link) == os.path.realpath(folder)


def set_link(link: str | None, folder: str) -> None:
    """LINK (the path the containers mount) names FOLDER, replaced whole (a rename)."""
    if link is None or link_ok(link, folder):
        return
    os.makedirs(os.path.dirname(link), exist_ok=True)
    tmp = f"{link}.tmp{os.getpid()}"
    os.symlink(os.path.relpath(folder, os.path.dirname(link)), tmp)
    os.replace(tmp, link)


# --- commands -----------------------------------------------------------------------------


def plan(args) -> dict:
    """What a fetch would do; changes nothing (but the cache of verified hashes)."""
    token = env_value(args.env_file, TOKEN_VAR)
    layout = Layout(args.root, args.flat)
    try:
        hub_commit, files, gated = model_files(args.repo, args.revision, token)
        commit, recorded = pinned(layout, args.repo, args.revision, hub_commit)
        if commit != hub_commit:
            _c, files, gated = model_files(args.repo, commit, token)
        if gated:
            check_access(args.repo, commit, files, token, args.revision)
    except HubError as error:
        return {"error": {"kind": error.kind, "message": str(error)}}
    folder = layout.files(commit)
    marker = read_json(os.path.join(folder, MARKER), None)
    records = load_records(layout.verified(commit), commit)
    missing = check(folder, files, records, args.workers)
    if os.path.isdir(folder):
        try:
            write_json(layout.verified(commit), {"commit": commit, "files": records})
        except OSError as error:
            if not disk_full(error):
                raise
            need = sum(e["size"] or 0 for e in missing) - partial_bytes(folder)
            return {"error": {"kind": "disk-full", "message": str(no_space(folder, max(0, need)))}}
    total = sum(entry["size"] or 0 for entry in files)
    probe = folder
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    return {
        "repo": args.repo, "commit": commit, "revision": args.revision, "recorded": recorded,
        "hub_commit": hub_commit, "files": len(files), "bytes": total, "dir": folder,
        "missing_files": len(missing), "missing_bytes": sum(e["size"] or 0 for e in missing),
        "partial_bytes": partial_bytes(folder), "free_bytes": shutil.disk_usage(probe).free,
        "complete": not missing and marker_current(marker, args.repo, commit, files),
        "settled": (recorded is not None or bool(args.revision and COMMIT_RE.fullmatch(args.revision)))
                   and link_ok(args.link, folder),
        "gated": bool(gated),
    }


class Meter:
    """Bytes done of the commit's total, from what is on disk (finished files and
    huggingface_hub's ``.incomplete`` files), sampled every INTERVAL seconds."""

    def __init__(self, folder: str, files: list[dict], missing: list[dict], out, interval: float):
        self.folder, self.out, self.interval = folder, out, interval
        self.total = sum(e["size"] or 0 for e in files)
        self.files = len(files)
        self.base = self.total - sum(e["size"] or 0 for e in missing)
        self.base_files = self.files - len(missing)
        self.missing = missing
        self.finished: set[str] = set()
        self.verified: set[str] = set()
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def done(self) -> int:
        on_disk = 0
        for entry in self.missing:
            try:
                on_disk += os.path.getsize(os.path.join(self.folder, entry["name"]))
            except OSError:
                pass
        return self.base + on_disk + partial_bytes(self.folder)

    def line(self) -> dict:
        now, done = time.monotonic(), self.done()
        self.samples = [s for s in self.samples if now - s[0] <= 30.0] + [(now, done)]
        (t0, d0) = self.samples[0]
        rate = (done - d0) / (now - t0) if now > t0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else None
        return {"p": {"done": done, "total": self.total, "rate": rate, "eta": eta,
                      "files_done": self.base_files + len(self.finished), "files": self.files,
                      "verified": self.base_files + len(self.verified)}}

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            emit(self.line(), self.out)


def fetch(args) -> int:
    layout = Layout(args.root, args.flat)
    os.makedirs(layout.state, exist_ok=True)
    lock = open(layout.lock(args.commit), "a+")  # noqa: SIM115 - held for the whole fetch
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        emit({"busy": True})
        return 0
    out = open(layout.log(args.commit), "w", encoding="utf-8")  # noqa: SIM115
    if args.background:
        # The lock (held by this open file) and the fresh log go with the child: once this
        # returns, a watch of the log sees this fetch, never an earlier one's last line.
        if os.fork():
            emit({"started": True})
            os._exit(0)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    with out:
        try:
            result = fetch_locked(args, layout, out)
        except KeyboardInterrupt:
            result = {"error": {"kind": "interrupted", "message": "interrupted (Ctrl-C): the "
                                "files fetched are kept, the next run resumes"}}
            emit(result, out)
            emit(result)
            os._exit(130)  # the downloads' threads are not waited for
        except HubError as error:
            result = {"error": {"kind": error.kind, "message": str(error)}}
        except Exception as error:  # noqa: BLE001 - reported, the next run resumes
            if disk_full(error):
                result = {"error": {"kind": "disk-full", "message": str(no_space(layout.files(args.commit), 0))}}
            else:
                result = {"error": {"kind": "download", "message": f"{type(error).__name__}: "
                                    f"{str(error).splitlines()[0][:300] if str(error) else ''}"}}
        emit(result, out)
        emit(result)
    return 0 if "done" in result else 1


def fetch_locked(args, layout: Layout, out) -> dict:
    hf_hub_download = client().hf_hub_download
    token = env_value(args.env_file, TOKEN_VAR)
    commit, files, _gated = model_files(args.repo, args.commit, token)
    if commit != args.commit:
        raise untrusted(args.repo, f"commit {commit!r} for commit {args.commit}")
    folder = layout.files(commit)
    os.makedirs(folder, exist_ok=True)
    # Pinned before the first byte: a branch that moves before this fetch ends is not followed
    # by the next run; what an older pin of it left half-fetched goes.
    record(layout, args.repo, args.revision, commit)
    remove_leftovers(layout, commit, args.link)
    marker = os.path.join(folder, MARKER)
    records = load_records(layout.verified(commit), commit)
    missing = check(folder, files, records, args.workers)
    current = marker_current(read_json(marker, None), args.repo, commit, files)
    if missing or not current:
        invalidate(folder, marker, missing)
    if not client_resumes():
        remove_partials(folder)  # a killed run's: this client would only leave more beside them
    resumed = partial_bytes(folder)
    need = sum(e["size"] or 0 for e in missing) - resumed
    if need > shutil.disk_usage(folder).free:
        raise no_space(folder, need)
    meter = Meter(folder, files, missing, out, args.interval)
    emit(meter.line(), out)
    ticker = threading.Thread(target=meter.run, daemon=True)
    ticker.start()
    started = time.monotonic()

    def one(entry: dict) -> None:
        hf_hub_download(args.repo, entry["name"], revision=commit, local_dir=folder,
                        token=token or False)
        meter.finished.add(entry["name"])
        # Hashed as it completes, on this worker: the check after the downloads only stats it.
        if verify_file(folder, entry, records):
            meter.verified.add(entry["name"])

    try:
        each(one, missing, args.workers)
    except Exception as error:  # noqa: BLE001
        if disk_full(error):
            raise no_space(folder, need) from None
        raise hub_error(error, args.repo, commit) from None
    finally:
        meter.stop.set()
        ticker.join()
    still = check(folder, files, records, args.workers)
    if still:
        invalidate(folder, marker, still)
    write_json(layout.verified(commit), {"commit": commit, "files": records})
    if still:
        return {"error": {"kind": "verify", "message": f"{len(still)} files differ from the hub "
                          f"after download, e.g. {still[0]['name']}: removed, fetched again next run"}}
    final = meter.line()["p"]
    if missing or not current:
        write_json(marker, {**marker_of(args.repo, commit, files), "verified_at": int(time.time())})
    set_link(args.link, folder)
    emit({"p": final}, out)
    return {"done": {"commit": commit, "files": len(files), "bytes": meter.total,
                     "fetched_files": len(missing),
                     "fetched_bytes": max(0, sum(e["size"] or 0 for e in missing) - resumed),
                     "seconds": round(time.monotonic() - started, 3)}}


def running(lock_path: str) -> bool:
    """Whether a fetch holds LOCK_PATH."""
    try:
        handle = open(lock_path, "a+")  # noqa: SIM115
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def watch(args) -> int:
    deadline = time.monotonic() + args.max_wait
    offset, last = args.offset, False
    lock_path = args.log[:-len(".log")] + ".lock"
    while True:
        # Asked before the read: a fetch that ends between the two has its last line read
        # below (asked after, that line would be missed and the fetch taken for killed).
        alive = running(lock_path)
        try:
            with open(args.log, "rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except OSError:
            data = b""
        end = data.rfind(b"\n") + 1
        for raw in data[:end].splitlines():
            line = raw.decode("utf-8", "replace")
            sys.stdout.write(line + "\n")
            last = last or '"done"' in line[:10] or '"error"' in line[:10]
        offset += end
        if last or not alive or time.monotonic() >= deadline:
            emit({"offset": offset, "running": alive and not last})
            return 0
        time.sleep(0.2)


def commit_arg(value: str) -> str:
    """--commit: a commit names folders and files on disk, so it is checked before any."""
    if commit_problem(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a commit: 40 lowercase hex digits")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="model_fetch.py")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "fetch"):
        sub = commands.add_parser(name)
        sub.add_argument("--workers", type=int, default=8)
        sub.add_argument("--repo", required=True)
        sub.add_argument("--root", required=True)
        sub.add_argument("--flat", action="store_true")
        sub.add_argument("--env-file")
        sub.add_argument("--revision")
        sub.add_argument("--link")
        if name == "fetch":
            sub.add_argument("--commit", required=True, type=commit_arg)
            sub.add_argument("--interval", type=float, default=10.0)
            sub.add_argument("--background", action="store_true")
    sub = commands.add_parser("watch")
    sub.add_argument("--log", required=True)
    sub.add_argument("--offset", type=int, default=0)
    sub.add_argument("--max-wait", type=float, default=20.0)
    args = parser.parse_args(argv)
    # A hub mirror named in the env file (read before huggingface_hub is imported: its
    # constants are read then).
    endpoint = env_value(getattr(args, "env_file", None), ENDPOINT_VAR)
    if endpoint:
        os.environ["HF_ENDPOINT"] = endpoint
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if args.command == "plan":
        answer = plan(args)
        emit(answer)
        return 1 if "error" in answer else 0
    if args.command == "fetch":
        return fetch(args)
    return watch(args)


if __name__ == "__main__":
    sys.exit(main())
