"""Where a model lives and what the deploy says about it: the store's layout, the checks
before a download, the progress lines. Pure functions; ``model_fetch.py`` does the work on
the target and ``operations.py`` runs it (both beside this module).

The store (``model_store``, a folder on the host) holds each model once per host:

``STORE/<org>--<name>/<commit>/``        the files of one commit, verified, mounted read-only
                                         into each container that serves it
``STORE/<org>--<name>/<commit>/`` ``.pve-sglang-model.json``  written last: the commit is complete
``STORE/<org>--<name>/revisions.json``   each branch or tag, resolved once to a commit
``STORE/<org>--<name>/serving/<rev>``    a link to the commit that revision serves: what the
                                         containers' mounts name

Old commits are kept: the deploy removes no commit (one a container may serve is never at
risk); remove a commit folder by hand once no container's revision links to it.
"""

from __future__ import annotations

import posixpath
from enum import Enum
from typing import NamedTuple, Protocol
from urllib.parse import quote

#: The link name of the default branch (no model_revision).
DEFAULT_REVISION = "_default"


def entry(store: str, repo: str) -> str:
    """The store's folder of REPO (``org/name`` -> ``STORE/org--name``, as the hub's cache)."""
    return posixpath.join(store.rstrip("/") or "/", repo.replace("/", "--"))


def serving_link(store: str, repo: str, revision: str | None) -> str:
    """The link, stable across runs, to the commit REVISION serves: the containers mount it."""
    name = quote(revision, safe="") if revision else DEFAULT_REVISION
    return posixpath.join(entry(store, repo), "serving", name)


class ModelSource(Protocol):
    """The settings a model's fetch reads (a ``ContainerSettings`` is one)."""

    @property
    def model_download(self) -> str | None: ...
    @property
    def model_revision(self) -> str | None: ...
    @property
    def model_store(self) -> str | None: ...
    @property
    def model_path(self) -> str: ...
    @property
    def model_accept_unhashed(self) -> bool: ...


class FetchRequest(NamedTuple):
    """What ``operations.checked`` and ``operations.fetched`` are asked (their keywords, as
    ``**request._asdict()``): the host's fetch into its model store, or a container's into its
    own ``model_path``."""

    python: str
    script: str
    repo: str
    revision: str | None
    root: str
    flat: bool
    link: str | None
    env_file: str
    space_of: str
    accept_unhashed: bool


def fetch_request(model: ModelSource, python: str, script: str, env_file: str) -> FetchRequest:
    """The fetch of MODEL's ``model_download`` by PYTHON running SCRIPT (the uploaded
    ``model_fetch.py``), its token in ENV_FILE: with a ``model_store``, once into the store's
    entry and its ``serving`` link (what the container mounts at ``model_path``); without, into
    the container's own ``model_path`` itself."""
    repo, revision, store = model.model_download, model.model_revision, model.model_store
    assert repo is not None, "no model_download: nothing to fetch"
    if store is not None:
        return FetchRequest(python, script, repo, revision, entry(store, repo), False,
                            serving_link(store, repo, revision), env_file,
                            f"the model store {store}", model.model_accept_unhashed)
    return FetchRequest(python, script, repo, revision, model.model_path, True, None, env_file,
                        f"the container's filesystem of {model.model_path}",
                        model.model_accept_unhashed)


def size_text(count: float) -> str:
    """Bytes as a person reads them (decimal units, as the hub shows sizes)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_text(p: dict) -> str:
    """One progress line: bytes done of total, rate, ETA, files done of total, and of those
    verified (each is hashed as it completes)."""
    total = p.get("total") or 0
    done = p.get("done") or 0
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    verified = f", {p['verified']} verified" if "verified" in p else ""
    return (f"{size_text(done)} of {size_text(total)}{pct}, {size_text(p.get('rate') or 0)}/s, "
            f"ETA {duration_text(p.get('eta'))}, {p.get('files_done', 0)} of {p.get('files', 0)} "
            f"files{verified}")


def space_error(plan: dict, where: str, what: str) -> str | None:
    """Why the download cannot fit (None: it fits): the bytes still to fetch (a partial file
    resumes) against the free space of WHAT (the store's or the root disk's filesystem)."""
    need = max(0, (plan.get("missing_bytes") or 0) - (plan.get("partial_bytes") or 0))
    free = plan.get("free_bytes")
    if free is None or need <= free:
        return None
    revision = f" (revision {plan['revision']!r})" if plan.get("revision") else ""
    return (f"{where}: model {plan.get('repo', '')}@{(plan.get('commit') or '')[:12]}{revision} needs "
            f"{size_text(need)} more ({size_text(plan.get('bytes') or 0)} in all, "
            f"{plan.get('missing_files')} of {plan.get('files')} files to fetch), and {what} has "
            f"{size_text(free)} free: free {size_text(need - free)} there, or set model_store "
            "to a folder on a larger filesystem")


def moved_warning(plan: dict, where: str, repo: str, revision: str | None) -> str | None:
    """A branch or tag the hub moved since it was resolved: reported, not followed."""
    recorded, hub = plan.get("recorded"), plan.get("hub_commit")
    if not recorded or not hub or recorded == hub:
        return None
    name = f"revision {revision!r}" if revision else "the default branch"
    return (f"{where}: {name} of {repo} moved on the hub to {hub}; this host keeps serving "
            f"{recorded}, resolved before. To serve the new one, set model_revision: {hub}")


def log_path(root: str, flat: bool, commit: str) -> str:
    """Where ``model_fetch.py fetch`` writes its lines (its ``Layout.log``)."""
    state = posixpath.join(root.rstrip("/") or "/", ".cache", "pve-sglang") if flat else root.rstrip("/")
    return posixpath.join(state, f"{commit}.log")


def served_problem(marker: dict | None, sizes: dict[str, int], repo: str, path: str) -> str | None:
    """Why the model at PATH is not a verified REPO (None: it is): its marker (written last
    by the fetch) must name REPO, and each file the marker lists must be on disk (SIZES: name
    -> bytes) at its size. A stat, not a hash: the fetch's plan hashes."""
    if not marker or marker.get("repo") != repo:
        return f"{path} holds no verified {repo} (no marker of it): the model's fetch did not end"
    listed = marker.get("sizes")
    if not isinstance(listed, dict):
        return (f"{path}: its marker predates the list of files it verified: the next deploy's "
                "fetch checks the files and writes it again")
    for name, size in sorted(listed.items()):
        if name not in sizes:
            return f"{path}: {name} of {repo} at commit {marker.get('commit')} is missing: the next deploy fetches it again"
        if size is not None and sizes[name] != size:
            return (f"{path}: {name} of {repo} at commit {marker.get('commit')} has {sizes[name]} "
                    f"bytes, the hub's {size}: the next deploy fetches it again")
    return None


#: The fetch errors a later run can cure by itself (the network, a download cut, the space
#: freed): said so. The others (a hostile or unhashed answer, a name the filesystem cannot
#: hold, a file in the way, no confinement) say what to fix instead.
RESUMES = frozenset({"network", "download", "disk-full"})


def fetch_failure(where: str, repo: str, commit: str, error: dict) -> str:
    """What the deploy says of a fetch whose last line is ERROR (``{"kind", "message"}``)."""
    resumes = "; the next run resumes" if error.get("kind") in RESUMES else ""
    return f"{where}: model {repo} at commit {commit}: {error.get('message')}{resumes}"


def unverified_text(count: int | None) -> str:
    """The files taken without a hash or size (``model_accept_unhashed``), said each time."""
    if not count:
        return ""
    return (f"; {count} files not verified: the hub gave no hash or size of them "
            "(model_accept_unhashed; a size not given is not counted against the free space)")


class FetchVerdict(Enum):
    """What the preflight of a model says before any change (``preflight``)."""

    READY = "ready"  # verified and settled: nothing to fetch
    FETCH = "fetch"  # a fetch will run, and it fits
    REFUSE = "refuse"  # the run would fail: stop before any change
    AT_RUN = "at_run"  # cannot be told now (the fetcher, its client or the token come later)


class Preflight(NamedTuple):
    verdict: FetchVerdict
    #: What to tell the user: the error, the plan, or why it is checked later.
    text: str


#: Hub errors a new token may cure: with the env file rewritten by this run, checked at run time.
TOKEN_KINDS = frozenset({"gated", "unauthorized", "not-found"})


def preflight(plan: dict | None, where: str, repo: str, revision: str | None, space_of: str,
              token_pending: bool = False, later: dict[str, str] | None = None) -> Preflight:
    """The verdict on ``model_fetch.py plan``'s answer PLAN (the ``ModelPlan`` fact), read
    before any change where the fetch will run.

    + token_pending: this run rewrites the env file the token is read from: an answer the token
      may change (gated, unauthorized, not found) is left to run time
    + later: why a plan cannot be read yet, by ``unavailable`` value (``script``, ``client``)
    """
    model = f"model {repo}" + (f" at revision {revision!r}" if revision else "")
    if plan is None or "unavailable" in plan:
        why = (later or {}).get((plan or {}).get("unavailable", ""), "the fetcher did not answer")
        return Preflight(FetchVerdict.AT_RUN, f"{where}: {model}: its preflight (size against the free "
                                              f"space, access, revision) runs at run time, before any "
                                              f"byte moves: {why}")
    if "error" in plan:
        message = f"{where}: {plan['error'].get('message')}"
        if token_pending and plan["error"].get("kind") in TOKEN_KINDS:
            return Preflight(FetchVerdict.AT_RUN, f"{message} (with the token on the host now; this "
                                                  "run writes a new env file: checked again at run time)")
        return Preflight(FetchVerdict.REFUSE, message)
    commit = plan.get("commit") or ""
    if plan.get("complete") and plan.get("settled"):
        return Preflight(FetchVerdict.READY, f"{where}: {model}: commit {commit}, {plan.get('files')} "
                                             f"files, {size_text(plan.get('bytes') or 0)}, verified in "
                                             f"{plan.get('dir')}{unverified_text(plan.get('unverified'))}")
    problem = space_error(plan, where, space_of)
    if problem:
        return Preflight(FetchVerdict.REFUSE, problem)
    return Preflight(FetchVerdict.FETCH, f"{where}: {model}: commit {commit}: "
                                         f"{plan.get('missing_files')} of {plan.get('files')} files to "
                                         f"fetch, {size_text(plan.get('missing_bytes') or 0)} of "
                                         f"{size_text(plan.get('bytes') or 0)} "
                                         f"({size_text(plan.get('partial_bytes') or 0)} partly there), "
                                         f"{size_text(plan.get('free_bytes') or 0)} free in {space_of}"
                                         f"{unverified_text(plan.get('unverified'))}")
