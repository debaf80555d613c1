"""The model a server loads: fetched once where it is kept, verified, resumable, with progress.

``model_fetch.py`` (beside this module) does the work on the target (a container's own ``model_path``, or
the host's model store); this operation runs it and relays its progress through pyinfra's
logger while other hosts go on.
"""

from __future__ import annotations

import math

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.context import state

from pve_sglang.model_store.facts import HubClientVersion, ModelFetchLog, ModelMarker, ModelPlan, fetch_args
from pve_sglang.model_store.model_fetch import MARKER
from pve_sglang.runtime.errors import PreflightError
from pve_sglang.model_store.rules import (
    FetchVerdict,
    fetch_failure,
    log_path,
    moved_warning,
    preflight,
    progress_text,
    served_problem,
    size_text,
    space_error,
    unverified_text,
)

#: Seconds between two progress lines of a fetch, by default: a 400 GB download shows about
#: a hundred lines an hour.
PROGRESS_EVERY_S = 30.0
#: The commit a plan shows for a fetch whose preflight runs at run time.
UNRESOLVED = "the-commit-resolved-at-run-time"


def checked(python: str, script: str, repo: str, revision: str | None, root: str,
            flat: bool = False, link: str | None = None, env_file: str | None = None,
            space_of: str = "the model's filesystem", fallback: str | None = None,
            token_pending: bool = False, accept_unhashed: bool = False) -> dict | None:
    """
    The model's preflight, read by the deploy's code before any change, in a plan (``--dry``)
    and a run (``-y`` too) alike: ``model_fetch.py plan`` on the machine that will download
    (the token read there from ENV_FILE). A missing repository or revision, a gated model
    without access, or too little free space raises ``PreflightError`` naming the host, the
    model and the numbers. Returns the plan for ``fetched(planned=...)``; None when it cannot be
    read yet (the fetcher, its huggingface_hub, or the token come with this run: said so, and
    ``fetched`` checks it at run time).

    + fallback: a second Python to run the plan with (the serving stack's, while this run
      builds the one PYTHON names)
    + token_pending: this run rewrites ENV_FILE (a token the plan cannot see yet)
    + accept_unhashed: files the hub lists without a hash or size are taken, unverified (a
      mirror of the user's own, ``model_accept_unhashed``), and said so; else refused
    """
    plan = host.get_fact(ModelPlan, python=python, script=script, repo=repo, revision=revision,
                         root=root, flat=flat, link=link, env_file=env_file, fallback=fallback,
                         accept_unhashed=accept_unhashed)
    where = f"host {host.name}"
    later = {"script": f"{script} is uploaded by this run",
             "client": f"huggingface_hub for {python} is installed by this run"}
    verdict, text = preflight(plan, where, repo, revision, space_of, token_pending, later)
    if verdict is FetchVerdict.REFUSE:
        raise PreflightError(text)
    moved = moved_warning(plan or {}, where, repo, revision)
    if moved:
        logger.warning(moved)
    logger.info(text)
    return plan if verdict in (FetchVerdict.READY, FetchVerdict.FETCH) else None


@operation()
def fetched(python: str, script: str, repo: str, revision: str | None, root: str,
            flat: bool = False, link: str | None = None, env_file: str | None = None,
            space_of: str = "the model's filesystem", interval_s: float = PROGRESS_EVERY_S,
            planned: dict | None = None, accept_unhashed: bool = False):
    """
    Hugging Face REPO at REVISION, resolved once to a commit, every file of it present at the
    hub's size and hash, under ROOT; fetched (resumed) when not, with a progress line (bytes
    done of total, rate, ETA, files done of total) every INTERVAL_S seconds. Before any byte
    moves: the repository and revision must exist, a gated model needs a token with access,
    and what is missing must fit in the free space (``checked`` says so before any change;
    this checks again when it runs). A branch the hub moved since it was resolved is reported,
    and the recorded commit kept. A deploy stopped meanwhile leaves the fetch running (or,
    killed with it, resumable): the next run follows it.

    + python: a Python with huggingface_hub that runs SCRIPT
    + script: the uploaded ``model_store/model_fetch.py``
    + repo: the repository, e.g. ``Qwen/Qwen3-30B-A3B``
    + revision: a branch, tag or commit; ``None``: the default branch
    + root: the store's folder of REPO (``model_store.rules.entry``), or with FLAT the model folder
    + flat: the files go in ROOT itself (a container's own ``model_path``)
    + link: the path, stable across runs, made to name the commit's folder (what the
      containers mount); ``None`` for none
    + env_file: the 0600 env file whose ``HF_TOKEN`` the script reads (never on a command line)
    + space_of: what ROOT's filesystem is, in an error (e.g. ``the store /tank/models``)
    + interval_s: seconds between two progress lines
    + planned: ``checked``'s plan: a plan (``--dry``) lists the fetch when it will run (a
      change, so the server's restart it causes is planned too); None: it is listed as one
    + accept_unhashed: files the hub lists without a hash or size are fetched unverified (a
      mirror of the user's own), and said so; else the fetch refuses them

    **Example:**

    .. code:: python

        from pve_sglang.model_store import operations as model

        model.fetched(
            name="Model Qwen/Qwen3-30B-A3B in /models/model",
            python="/opt/sglang/venv/bin/python",
            script="/opt/sglang/model_fetch.py",
            repo="Qwen/Qwen3-30B-A3B",
            revision=None,
            root="/models/model",
            flat=True,
            env_file="/etc/sglang/sglang.env",
        )
    """
    shared = fetch_args(repo, root, flat, link, env_file, revision, accept_unhashed)
    if not state.is_executing:
        if planned is not None and planned.get("complete") and planned.get("settled"):
            host.noop(f"model {repo} at commit {planned['commit'][:12]} verified")
            return
        commit = (planned or {}).get("commit") or UNRESOLVED
        yield StringCommand(QuoteString(python), QuoteString(script), "fetch", "--commit",
                            QuoteString(commit), *shared, "--interval", str(float(interval_s)),
                            "--background")
        return
    where = f"host {host.name}"
    plan = host.get_fact(ModelPlan, python=python, script=script, repo=repo, revision=revision,
                         root=root, flat=flat, link=link, env_file=env_file,
                         accept_unhashed=accept_unhashed)
    if plan is None or "unavailable" in plan:
        raise OperationError(f"{where}: {script} did not answer: is it there, and "
                             f"huggingface_hub installed for {python}?")
    if "error" in plan:
        raise OperationError(f"{where}: {plan['error']['message']}")
    moved = moved_warning(plan, where, repo, revision)
    if moved:
        logger.warning(moved)
    commit = plan["commit"]
    if plan["complete"] and plan["settled"]:
        logger.info(f"{where}: model {repo} at commit {commit}: {plan['files']} files, "
                    f"{size_text(plan['bytes'])}, verified in {plan['dir']}"
                    f"{unverified_text(plan.get('unverified'))}")
        host.noop(f"model {repo} at commit {commit[:12]} verified")
        return
    problem = space_error(plan, where, space_of)
    if problem:
        raise OperationError(problem)
    logger.info(f"{where}: model {repo} at commit {commit}: {plan['missing_files']} of "
                f"{plan['files']} files to fetch, {size_text(plan['missing_bytes'])} of "
                f"{size_text(plan['bytes'])} ({size_text(plan['partial_bytes'])} partly there), "
                f"into {plan['dir']}")
    yield StringCommand(QuoteString(python), QuoteString(script), "fetch", "--commit",
                        QuoteString(commit), *shared, "--interval", str(float(interval_s)),
                        "--background")
    log, offset = log_path(root, flat, commit), 0
    while True:
        watch = host.get_fact(ModelFetchLog, python=python, script=script, log=log,
                              offset=offset, max_wait=max(1, math.ceil(interval_s)))
        offset = watch["offset"] if watch["offset"] is not None else offset
        progress = [line["p"] for line in watch["lines"] if "p" in line]
        if progress:
            logger.info(f"{where}: {repo}: {progress_text(progress[-1])}")
        for line in watch["lines"]:
            if "error" in line:
                raise OperationError(fetch_failure(where, repo, commit, line["error"]))
            if "done" in line:
                done = line["done"]
                logger.info(f"{where}: model {repo} at commit {commit}: {done['files']} files, "
                            f"{size_text(done['bytes'])} verified; fetched "
                            f"{done['fetched_files']} files, {size_text(done['fetched_bytes'])} "
                            f"in {done['seconds']:.0f}s{unverified_text(done.get('unverified'))}")
                return
        if not watch["running"]:
            raise OperationError(f"{where}: the fetch of {repo} stopped without a last line "
                                 f"(killed?); see {log}; the next run resumes")


@operation()
def served(path: str, repo: str):
    """
    Say which commit of REPO the model at PATH is (the marker the fetch writes last, once
    every file is verified); fail when PATH holds no verified model, or a file the marker
    lists is gone or of another size since (a stat of each, no hash). Checked once the deploy
    has run.

    + path: the model folder the server loads (``model_path``)
    + repo: the repository it should hold

    **Example:**

    .. code:: python

        from pve_sglang.model_store import operations as model

        model.served(name="The model served", path="/models/model", repo="Qwen/Qwen3-30B-A3B")
    """
    if not state.is_executing:
        host.noop(f"model in {path}: checked after the run")
        return
    found = host.get_fact(ModelMarker, path=path, marker=MARKER)
    problem = served_problem(found["marker"], found["sizes"], repo, path)
    if problem:
        raise OperationError(f"{host.name}: {problem}")
    marker = found["marker"]
    logger.info(f"{host.name}: serves {repo} at commit {marker['commit']}: {marker['files']} "
                f"files, {size_text(marker['bytes'])}, from {path}")
    host.noop(f"serves {repo} at commit {marker['commit'][:12]}")
    yield from ()


@operation()
def client_venv(path: str, version: str):
    """
    A venv at PATH (from the system ``python3``) with huggingface_hub VERSION, which runs the
    model fetcher on a host: a Proxmox host has Python but not huggingface_hub. Debian's
    ``python3-venv`` is installed first when ``python3 -m venv`` lacks it.

    + path: where the venv goes, e.g. ``/opt/pve-sglang/model-tools``
    + version: the huggingface_hub release (the locked set's, as the containers run)

    **Example:**

    .. code:: python

        from pve_sglang.model_store import operations as model

        model.client_venv(name="huggingface_hub 0.36.2 on the host",
                          path="/opt/pve-sglang/model-tools", version="0.36.2")
    """
    python = f"{path.rstrip('/')}/bin/python"
    if host.get_fact(HubClientVersion, python=python) == version:
        host.noop(f"huggingface_hub {version} in {path}")
        return
    venv, pip = QuoteString(path), QuoteString(f"{path.rstrip('/')}/bin/pip")
    yield StringCommand("[ -x", pip, "] || python3 -m venv", venv, "|| { DEBIAN_FRONTEND=noninteractive "
                        "apt-get install -y -q --no-install-recommends python3-venv && python3 -m venv",
                        venv, "; }")
    yield StringCommand(pip, "install -q", QuoteString(f"huggingface_hub=={version}"))
