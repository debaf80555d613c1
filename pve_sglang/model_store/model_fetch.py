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

``plan --repo R [--revision REV] --root ROOT [--flat] [--link L] [--env-file F]
[--accept-unhashed]``
    Changes nothing (but its cache of the hashes verified, where it can write it). Resolves REV
    (default: the default branch) to a commit: a branch or tag fetched before keeps the commit
    recorded in revisions.json, and a hub that moved it since is reported (``recorded``
    differs from ``hub_commit``), never followed. Checks every file present at the hub's size,
    LFS files at their sha256 and the others at their git blob id (a file whose size, mtime,
    inode and ctime are those it was verified at is not hashed again).
    Prints ``{"repo", "commit", "revision", "recorded", "hub_commit", "files", "bytes",
    "missing_files", "missing_bytes", "partial_bytes", "free_bytes", "complete", "settled",
    "gated", "unverified", "dir"}`` (``settled``: the revision is recorded and the link L names
    the commit; ``unverified``: the files the hub gave no hash or size of, taken with
    ``--accept-unhashed`` only) or ``{"error": {"kind", "message"}}`` and exit 1 (kinds: invalid,
    not-found, revision-not-found, gated, unauthorized, network, untrusted, no-weights,
    unverifiable, unconfined, disk-full). ``complete``: no file missing and the marker is this
    commit's.
``fetch --repo R --commit C [--revision REV] --root ROOT [--flat] [--link L] [--env-file F]
[--accept-unhashed] [--interval S] [--workers N] [--background]``
    Pins REV to C (revisions.json) and removes the commit folders a changed pin left
    half-fetched; removes the marker (MARKER in the commit's folder) before anything else
    changes, then each file that is not the hub's; refuses when what is missing does not fit
    the free space; downloads what is missing (huggingface_hub resumes a ``.incomplete``
    file), hashing each file as it completes; writes the marker (each file with its size)
    last, then points the link L (the path the containers mount) at the commit's folder.
    Writes ``{"begun": true}``, then ``{"p": {"done", "total", "files_done", "files",
    "verified", "rate", "eta"}}`` every S seconds and at the end ``{"done": {...}}`` or
    ``{"error": {...}}`` to ROOT's ``<commit>.log`` (and the last line to stdout, which also
    gets the error of a fetch that could not begin: a full disk, no confinement). One fetch of a commit
    runs at a time (a lock file): another prints ``{"busy": true}`` and returns. Ctrl-C (to
    whichever thread the kernel gives it): the last line ``{"error": {"kind": "interrupted",
    ...}}``, exit 130, at once: the client's downloads are not waited for.
    ``--background``: returns once the lock is held and the log is fresh (``{"started":
    true}``), the fetch going on in its own session.
``watch --log L --offset N --max-wait S``
    The fetch log L's lines after byte N as they come, for up to S seconds, returning at
    once on the fetch's last line; then ``{"offset": M, "running": bool}``.

What the hub answers is not trusted (``HF_ENDPOINT`` may name any mirror): every commit must
be 40 hex digits, every file name a relative path inside the commit's folder, every file
listed with its size and hash (``--accept-unhashed``: a mirror of the user's own that lists
none), and among them weights; each file's own answer (its ETag, commit and size, of which
huggingface_hub makes its paths) must be what the listing said, checked before the client
writes a byte of it. Else nothing is written and the error (kind ``untrusted``,
``unverifiable`` or ``no-weights``) names what it sent. Whatever the client does, ``plan``
and ``fetch`` write only under ROOT (and L's folder): ``confine.py`` beside this script
(Landlock; else a read-only mount namespace), or they refuse (kind ``unconfined``).

The token is read from the env file (``HF_TOKEN="..."``) by this process: never on a
command line, never printed. ``HF_ENDPOINT`` in the env file names a hub mirror.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
import unicodedata
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

try:  # uploaded beside this script (remote.COMPANIONS)
    from confine import Unconfined, confine
    from file_hash import file_digest
    from remote_env import env_value
except ImportError:  # imported as part of pve_sglang (the deploy's side, the tests)
    from pve_sglang.remote.confine import Unconfined, confine
    from pve_sglang.remote.file_hash import file_digest
    from pve_sglang.remote.remote_env import env_value

MARKER = ".pve-sglang-model.json"
TOKEN_VAR = "HF_TOKEN"
ENDPOINT_VAR = "HF_ENDPOINT"
#: The key of the default branch (no revision) in revisions.json.
DEFAULT_LABEL = "_default"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
#: The longest part of a file name: a Linux name holds 255 bytes, and huggingface_hub keeps
#: ``<part>.metadata`` beside it in its ``.cache``.
NAME_PART_MAX = 255 - len(".metadata")
#: What a model's weights are named (what sglang loads: safetensors, PyTorch, GGUF).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
#: An ETag a mirror may answer for a file it lists no hash of (``--accept-unhashed``): a word,
#: never a path (huggingface_hub names its ``.incomplete`` file after it).
PLAIN_ETAG_RE = re.compile(r"[0-9A-Za-z_-]{1,128}")
#: Seconds the main thread waits at most before it looks at a signal again: the kernel may
#: give a Ctrl-C to a download thread, and Python runs its handler in the main thread only.
SIGNAL_POLL_S = 0.2


def emit(obj: dict) -> None:
    """OBJ as one line on stdout."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Log:
    """A fetch's log (``<commit>.log``): its lines go whole with one ``write`` each, from the
    fetch and its progress thread. On a full disk a progress line is dropped, and the last line
    takes the place of the progress lines (the log cut to nothing first): the watch that reads
    it always learns how the fetch ended."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def line(self, obj: dict) -> bool:
        data = (json.dumps(obj) + "\n").encode()
        try:
            return os.write(self.fd, data) == len(data)
        except OSError:
            return False

    def last(self, obj: dict) -> None:
        if not self.line(obj):
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)  # frees the progress lines' blocks for this one
                self.line(obj)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# --- where things are ---------------------------------------------------------------------


class Layout:
    def __init__(self, root: str, flat: bool):
        # Absolute: the search for an existing parent folder ends at /, never at '' (a
        # relative ROOT that does not exist looped for ever there).
        self.root, self.flat = os.path.abspath(root), flat
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


def existing_folder(path: str) -> str:
    """PATH, or the nearest folder above it that exists (PATH is absolute)."""
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


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


def causes(error: BaseException | None) -> list[BaseException]:
    """ERROR and those it was raised from (or while handling), outermost first."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def disk_full(error: BaseException | None) -> bool:
    """Whether ERROR, or one it was raised from, is a full disk (or quota)."""
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in causes(error))


def local_failure(error: BaseException, root: str) -> tuple[str, str] | None:
    """(kind, message) of a failure on this machine's side, or None (the hub's answer, the
    network: ``hub_error``). A full disk is ``disk-full`` (its message, with the numbers, made
    by ``no_space``); what no retry cures says what to fix, never that the next run resumes.
    ROOT: where the fetch may write."""
    for cause in causes(error):
        if isinstance(cause, HubError):
            return cause.kind, str(cause)
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk-full", ""
        path = repr(getattr(cause, "filename", None) or "a file")
        if isinstance(cause, OSError) and cause.errno == errno.ENAMETOOLONG:
            return "name-too-long", (f"{path} is a longer name than the filesystem of {root} takes "
                                     "(255 bytes a part, 4096 in all): set model_store (or "
                                     "model_path) to a shorter folder, or one on another filesystem")
        if isinstance(cause, OSError) and cause.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
            return "in-the-way", (f"{path} is in the way of a file of the model (a file where a "
                                  f"folder goes, or a folder where a file goes): remove it, then "
                                  "run again")
        if isinstance(cause, OSError) and cause.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return "denied", (f"writing {path} was refused ({os.strerror(cause.errno)}): the fetch "
                              f"writes only under {root}, and there only where its permissions "
                              "allow (a path outside it came from the hub's answer)")
        if isinstance(cause, ValueError) and str(cause).startswith("Invalid filename"):
            return "invalid-name", (f"huggingface_hub refuses a file name of the hub: "
                                    f"{str(cause).splitlines()[0][:300]}")
    return None


def no_space(folder: str, need: int | None) -> HubError:
    """A full disk under FOLDER, NEED bytes still to fetch (None: not known yet)."""
    free = shutil.disk_usage(existing_folder(folder)).free
    still = "" if need is None else f", {need} bytes still to fetch"
    return HubError("disk-full", f"the filesystem of {folder} is full: {free} bytes free{still}: "
                                 "free space there, or set model_store to a folder on a larger "
                                 "filesystem")


def client():
    """huggingface_hub, imported once the environment (HF_ENDPOINT) is set: it reads its
    constants when imported."""
    try:
        import huggingface_hub
        import huggingface_hub.errors  # noqa: F401 - the submodule, for its attribute
        import huggingface_hub.file_download  # noqa: F401 - Answers wraps a function of it
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
    (None: it can): a mirror is not trusted to keep its names inside it, and a name that no
    client writes on Linux is refused before the first byte."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if name.startswith("/"):
        return "is absolute"
    if any(unicodedata.category(c) == "Cc" for c in name):
        return "holds a control character"
    if any(unicodedata.category(c) == "Cs" for c in name):
        return "is not text (a lone surrogate)"
    if "\\" in name:
        return "holds a backslash (a folder on Windows: huggingface_hub refuses it)"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part"
    if any(re.match(r"[A-Za-z]:", part) for part in parts):
        return "has a part that is a Windows drive (huggingface_hub refuses it)"
    longest = max(len(part.encode()) for part in parts)
    if longest > NAME_PART_MAX:
        return (f"has a part of {longest} bytes (a Linux file name holds {NAME_PART_MAX} beside "
                "huggingface_hub's '.metadata')")
    if parts[0] == ".cache" or name == MARKER:
        return "is where the fetcher keeps its own state"
    return None


def commit_problem(commit: object) -> str | None:
    return None if isinstance(commit, str) and COMMIT_RE.fullmatch(commit) else "is not 40 lowercase hex digits"


def size_ok(size: object) -> bool:
    """A size the hub may answer: a whole number of bytes, 0 included (an empty file)."""
    return isinstance(size, int) and not isinstance(size, bool) and size >= 0


def entry_problem(entry: dict) -> str | None:
    """Why a file of the hub's answer is refused (None: it is taken; a size or hash it lacks
    is ``unverifiable``'s)."""
    name = entry["name"]
    problem = name_problem(name)
    if problem:
        return f"file name {name!r} {problem}"
    if entry["size"] is not None and not size_ok(entry["size"]):
        return f"file {name!r} has size {entry['size']!r}"
    for key, pattern in (("sha256", r"[0-9a-f]{64}"), ("blob", r"[0-9a-f]{40}")):
        if entry[key] is not None and not (isinstance(entry[key], str) and re.fullmatch(pattern, entry[key])):
            return f"file {name!r} has {key} {entry[key]!r}"
    return None


def listing_problem(names: list[str]) -> str | None:
    """Why the hub's list of file NAMES cannot all be on disk at once (None: they can): a name
    twice, or a file that another's name makes a folder."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return f"file {name!r} twice"
        seen.add(name)
    for name in names:
        parts = name.split("/")
        for end in range(1, len(parts)):
            if "/".join(parts[:end]) in seen:
                return f"both {'/'.join(parts[:end])!r} and {name!r} (a file cannot be a folder too)"
    return None


def unverifiable(entry: dict) -> str | None:
    """What the hub did not say of a file that the check needs (None: nothing): its size (the
    space it takes, a short file told) and its hash (sha256, or the git blob id)."""
    lacks = [what for what, absent in (("size", entry["size"] is None),
                                       ("sha256 or git blob id", entry["sha256"] is None and entry["blob"] is None))
             if absent]
    return " and ".join(f"no {what}" for what in lacks) or None


def weights_problem(files: list[dict]) -> str | None:
    """Why FILES are no model (None: they hold weights): no file at all, or no weights file
    (``WEIGHT_SUFFIXES``) that the hub gave bytes to."""
    if not files:
        return "no files"
    if not any(e["name"].endswith(WEIGHT_SUFFIXES) and e["size"] != 0 for e in files):
        return (f"{len(files)} files and no weights among them (a file ending in "
                f"{', '.join(WEIGHT_SUFFIXES)}, not empty)")
    return None


def answer_problem(entry: dict, commit: str, answered_commit: object, etag: object,
                   size: object) -> str | None:
    """Why the hub's answer for one file (its HEAD: the commit, the ETag, of which
    huggingface_hub names its ``.incomplete`` file, and the size) is refused (None: it is the
    listing's ENTRY of COMMIT)."""
    name = entry["name"]
    if answered_commit != commit:
        return f"commit {answered_commit!r} for file {name!r} of commit {commit}"
    expected = entry["sha256"] or entry["blob"]
    if expected is not None and etag != expected:
        return f"ETag {etag!r} for file {name!r}, listed with {expected}"
    if expected is None and not (isinstance(etag, str) and PLAIN_ETAG_RE.fullmatch(etag)):
        return f"ETag {etag!r} for file {name!r} (listed with no hash: at most a word of letters, digits, '-' and '_')"
    if size is not None and entry["size"] is not None and size != entry["size"]:
        return f"size {size!r} for file {name!r}, listed with {entry['size']}"
    return None


def untrusted(repo: str, what: str) -> HubError:
    return HubError("untrusted", f"the hub {endpoint()} answered {repo} with {what}: refused "
                                 "before it was written (a commit is 40 hex digits, a file name "
                                 "a relative path inside the commit's folder, a file's ETag, "
                                 "commit and size those it was listed with)")


def model_files(repo: str, revision: str | None, token: str | None,
                accept_unhashed: bool = False) -> tuple[str, list[dict], object]:
    """(commit, [{"name", "size", "sha256" | None, "blob"}], gated) of REPO at REVISION, each
    checked before it names anything on disk: names and commit (``untrusted``), a model with
    weights (``no-weights``), each file with its size and a hash (``unverifiable``, unless
    ACCEPT_UNHASHED: a mirror of the user's own that lists none)."""
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
    problem = listing_problem([entry["name"] for entry in files])
    if problem:
        raise untrusted(repo, problem)
    where = f"the hub {endpoint()} answered {repo} at commit {info.sha}"
    problem = weights_problem(files)
    if problem:
        raise HubError("no-weights", f"{where} with {problem}: refused, nothing written "
                                     "(model_download names a model's repository)")
    lacking = [(entry["name"], why) for entry in files if (why := unverifiable(entry))]
    if lacking and not accept_unhashed:
        name, why = lacking[0]
        raise HubError("unverifiable", f"{where} with {len(lacking)} files that cannot be "
                                       f"verified, e.g. {name!r}: {why}: refused, nothing "
                                       "written. A mirror of your own that lists no hashes: set "
                                       "model_accept_unhashed: true (then such files are "
                                       "fetched unverified, and said so)")
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


class Answers:
    """The client's own answer for each file (the commit, the ETag, of which huggingface_hub
    makes its ``.incomplete`` file's path, and the size) checked against the listing before
    the client writes a byte of the file: ``file_download.get_hf_file_metadata``, which each
    release's download calls, wrapped. The file a download thread fetches is its own."""

    def __init__(self, repo: str, commit: str):
        self.repo, self.commit = repo, commit
        self.local = threading.local()

    def install(self, hub) -> None:
        module = hub.file_download
        original = getattr(module, "get_hf_file_metadata", None)
        if original is None:
            raise HubError("client", f"huggingface_hub {hub.__version__} has no "
                                     "file_download.get_hf_file_metadata: the answers it writes "
                                     "by cannot be checked first (a release this fetcher does "
                                     "not know)")

        def checked(*args, **kwargs):
            metadata = original(*args, **kwargs)
            entry = getattr(self.local, "entry", None)
            problem = ("an answer for no file this fetch asked for" if entry is None else
                       answer_problem(entry, self.commit, metadata.commit_hash, metadata.etag,
                                      metadata.size))
            if problem:
                raise untrusted(self.repo, problem)
            return metadata

        module.get_hf_file_metadata = checked

    @contextlib.contextmanager
    def of(self, entry: dict):
        """A block in which this thread's client asks for ENTRY."""
        self.local.entry = entry
        try:
            yield
        finally:
            self.local.entry = None


# --- verification -------------------------------------------------------------------------


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
    in order. On an error or Ctrl-C the items not begun are cancelled, and those running are
    not waited for (a download cut is resumed; the caller writes its last line and ends). The
    main thread wakes every SIGNAL_POLL_S: a signal the kernel gave a worker runs its handler
    there, not when the downloads end."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = [pool.submit(function, item) for item in items]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=SIGNAL_POLL_S, return_when=FIRST_EXCEPTION)
            for future in done:
                if (error := future.exception()) is not None:
                    raise error
        results = [future.result() for future in futures]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def missing_bytes(missing: list[dict]) -> int:
    """The bytes of the files MISSING (a file of no known size counts none)."""
    return sum(entry["size"] or 0 for entry in missing)


def bytes_to_fetch(missing: list[dict], resumed: int) -> int:
    """The bytes a fetch of MISSING still downloads: RESUMED of them are on disk already (the
    client's ``.incomplete`` files, which it resumes)."""
    return max(0, missing_bytes(missing) - resumed)


def fits(need: int, free: int) -> bool:
    return need <= free


def load_records(verified_path: str, commit: str) -> dict:
    """The verified files' records ({name: {"stat", "hash"}}) of COMMIT."""
    records = read_json(verified_path, {})
    ok = isinstance(records, dict) and records.get("commit") == commit and isinstance(records.get("files"), dict)
    return records["files"] if ok else {}


def save_records(layout: Layout, commit: str, records: dict) -> None:
    """The verified files' records written, where they can be: only a cache (a file not in it
    is hashed again), so a disk full (or read-only) since fails neither a plan nor a fetch of
    a verified model."""
    with contextlib.suppress(OSError):
        write_json(layout.verified(commit), {"commit": commit, "files": records})


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
    return {commit for labels in (known.values() if isinstance(known, dict) else ())
            if isinstance(labels, dict) for entry in labels.values()
            if isinstance(entry, dict) and isinstance(commit := entry.get("commit"), str)}


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
    parent = os.path.dirname(link) if link else ""
    served = {os.path.basename(os.path.realpath(os.path.join(parent, n)))
              for n in (os.listdir(parent) if parent and os.path.isdir(parent) else ())}
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


def writable(layout: Layout, link: str | None) -> list[str]:
    """Where a fetch writes: ROOT, and the folder of the link L where it is not under ROOT."""
    folders = [layout.root]
    if link and not inside(layout.root, os.path.abspath(link)):
        folders.append(os.path.dirname(os.path.abspath(link)))
    return folders


def unconfined(root: str, error: Unconfined) -> dict:
    return {"kind": "unconfined", "message": f"the fetch cannot be kept from writing outside {root} "
                                             f"({error}): refused, as the hub's answers name paths "
                                             "and the fetcher may run as root. It needs Linux 5.19 "
                                             "with Landlock, or a mount namespace (root, Linux 5.12)"}


def failure(error: BaseException, layout: Layout, commit: str, need: int | None = None) -> dict:
    """The last line's error of a fetch that ended in ERROR (NEED: the bytes it had to fetch)."""
    local = local_failure(error, layout.root)
    if local and local[0] == "disk-full":
        return {"kind": "disk-full", "message": str(no_space(layout.files(commit), need))}
    if local:
        return {"kind": local[0], "message": local[1]}
    return {"kind": "download", "message": f"{type(error).__name__}: "
                                           f"{str(error).splitlines()[0][:300] if str(error) else ''}"}


def plan(args) -> dict:
    """What a fetch would do; changes nothing (but the cache of verified hashes)."""
    token = env_value(args.env_file, TOKEN_VAR)
    layout = Layout(args.root, args.flat)
    try:
        # Its cache aside, a plan writes nothing, whatever the client does: none where ROOT is
        # not there yet.
        confine([layout.root] if os.path.isdir(layout.root) else [])
    except Unconfined as error:
        return {"error": unconfined(layout.root, error)}
    try:
        hub_commit, files, gated = model_files(args.repo, args.revision, token, args.accept_unhashed)
        commit, recorded = pinned(layout, args.repo, args.revision, hub_commit)
        if commit != hub_commit:
            _c, files, gated = model_files(args.repo, commit, token, args.accept_unhashed)
        if gated:
            check_access(args.repo, commit, files, token, args.revision)
    except HubError as error:
        return {"error": {"kind": error.kind, "message": str(error)}}
    folder = layout.files(commit)
    marker = read_json(os.path.join(folder, MARKER), None)
    records = load_records(layout.verified(commit), commit)
    before = dict(records)
    missing = check(folder, files, records, args.workers)
    if os.path.isdir(folder) and records != before:
        save_records(layout, commit, records)
    return {
        "repo": args.repo, "commit": commit, "revision": args.revision, "recorded": recorded,
        "hub_commit": hub_commit, "files": len(files), "bytes": missing_bytes(files), "dir": folder,
        "missing_files": len(missing), "missing_bytes": missing_bytes(missing),
        "partial_bytes": partial_bytes(folder),
        "free_bytes": shutil.disk_usage(existing_folder(folder)).free,
        "complete": not missing and marker_current(marker, args.repo, commit, files),
        "settled": (recorded is not None or bool(args.revision and COMMIT_RE.fullmatch(args.revision)))
                   and link_ok(args.link, folder),
        "gated": bool(gated), "unverified": sum(1 for entry in files if unverifiable(entry)),
    }


class Meter:
    """Bytes done of the commit's total, from what is on disk (finished files and
    huggingface_hub's ``.incomplete`` files), sampled every INTERVAL seconds into LOG."""

    def __init__(self, folder: str, files: list[dict], missing: list[dict], log: Log, interval: float):
        self.folder, self.log, self.interval = folder, log, interval
        self.total = missing_bytes(files)
        self.files = len(files)
        self.base = self.total - missing_bytes(missing)
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
            self.log.line(self.line())


INTERRUPTED = {"error": {"kind": "interrupted", "message": "interrupted (Ctrl-C): the files "
                                                           "fetched are kept, the next run resumes"}}


def fetch(args) -> int:
    layout = Layout(args.root, args.flat)
    try:
        os.makedirs(layout.state, exist_ok=True)
        if args.link:
            os.makedirs(os.path.dirname(os.path.abspath(args.link)), exist_ok=True)
        # Before the client is imported, before any thread: whatever it does from here on,
        # this process (and the background one it forks) writes only there.
        confine(writable(layout, args.link))
        lock = open(layout.lock(args.commit), "a+")  # noqa: SIM115 - held for the whole fetch
    except Unconfined as error:
        emit({"error": unconfined(layout.root, error)})
        return 1
    except OSError as error:  # a full disk, a file in the way: said on the last line
        emit({"error": failure(error, layout, args.commit)})
        return 1
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        emit({"busy": True})
        return 0
    try:
        log = Log(layout.log(args.commit))
        # Its first line takes the log's first block: an early last line fits beside it on a
        # disk that is full (the watch of a background fetch reads nothing else).
        if not log.line({"begun": True}):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), layout.log(args.commit))
    except OSError as error:
        emit({"error": failure(error, layout, args.commit)})
        return 1
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
    # The client's own files (hf_xet's cache and logs) go under ROOT too.
    os.environ["HF_HOME"] = os.path.join(layout.state, ".hf-home")

    def interrupt(_signum, _frame) -> None:
        # Whatever the threads do: the last line, then the end (a cut download is resumed).
        log.last(INTERRUPTED)
        with contextlib.suppress(Exception):
            emit(INTERRUPTED)
        os._exit(130)

    signal.signal(signal.SIGINT, interrupt)
    try:
        result = fetch_locked(args, layout, log)
    except Exception as error:  # noqa: BLE001 - each named on the last line
        result = {"error": failure(error, layout, args.commit)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the last line is this one
    log.last(result)
    emit(result)
    log.close()
    return 0 if "done" in result else 1


def fetch_locked(args, layout: Layout, log: Log) -> dict:
    hub = client()
    # huggingface_hub 0.36 probes the mode of new files in the parent of a flat model folder,
    # outside the confinement: it fails harmlessly, and is not said for each file.
    logging.getLogger("huggingface_hub.file_download").addFilter(
        lambda record: "Could not set the permissions" not in record.getMessage())
    token = env_value(args.env_file, TOKEN_VAR)
    commit, files, _gated = model_files(args.repo, args.commit, token, args.accept_unhashed)
    if commit != args.commit:
        raise untrusted(args.repo, f"commit {commit!r} for commit {args.commit}")
    answers = Answers(args.repo, commit)
    answers.install(hub)
    folder = layout.files(commit)
    os.makedirs(folder, exist_ok=True)
    # Pinned before the first byte: a branch that moves before this fetch ends is not followed
    # by the next run; what an older pin of it left half-fetched goes.
    record(layout, args.repo, args.revision, commit)
    remove_leftovers(layout, commit, args.link)
    marker = os.path.join(folder, MARKER)
    records = load_records(layout.verified(commit), commit)
    before = dict(records)
    missing = check(folder, files, records, args.workers)
    current = marker_current(read_json(marker, None), args.repo, commit, files)
    if missing or not current:
        invalidate(folder, marker, missing)
    if not client_resumes():
        remove_partials(folder)  # a killed run's: this client would only leave more beside them
    resumed = partial_bytes(folder)
    need = bytes_to_fetch(missing, resumed)
    if not fits(need, shutil.disk_usage(folder).free):
        raise no_space(folder, need)
    meter = Meter(folder, files, missing, log, args.interval)
    log.line(meter.line())
    ticker = threading.Thread(target=meter.run, daemon=True)
    ticker.start()
    started = time.monotonic()

    def one(entry: dict) -> None:
        with answers.of(entry):
            hub.hf_hub_download(args.repo, entry["name"], revision=commit, local_dir=folder,
                                token=token or False)
        meter.finished.add(entry["name"])
        # Hashed as it completes, on this worker: the check after the downloads only stats it.
        if verify_file(folder, entry, records):
            meter.verified.add(entry["name"])

    try:
        each(one, missing, args.workers)
    except Exception as error:  # noqa: BLE001
        local = local_failure(error, layout.root)
        if local and local[0] == "disk-full":
            raise no_space(folder, need) from None
        if local:
            raise HubError(*local) from None
        raise hub_error(error, args.repo, commit) from None
    finally:
        meter.stop.set()
        ticker.join()
    still = check(folder, files, records, args.workers)
    if still:
        invalidate(folder, marker, still)
    if records != before:
        save_records(layout, commit, records)
    if still:
        return {"error": {"kind": "verify", "message": f"{len(still)} files differ from the hub "
                          f"after download, e.g. {still[0]['name']}: removed, fetched again next run"}}
    final = meter.line()["p"]
    if missing or not current:
        write_json(marker, {**marker_of(args.repo, commit, files), "verified_at": int(time.time())})
    set_link(args.link, folder)
    log.line({"p": final})
    return {"done": {"commit": commit, "files": len(files), "bytes": meter.total,
                     "fetched_files": len(missing), "fetched_bytes": bytes_to_fetch(missing, resumed),
                     "unverified": sum(1 for entry in files if unverifiable(entry)),
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
                if os.fstat(handle.fileno()).st_size < offset:
                    offset = 0  # cut by the fetch on a full disk, to make room for its last line
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
        sub.add_argument("--accept-unhashed", action="store_true")
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
    code = main()
    sys.stdout.flush()
    os._exit(code)  # a download thread still running after a failure is not waited for
