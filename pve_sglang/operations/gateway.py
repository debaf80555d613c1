"""Operations on a gateway's container: smg installed exactly as its hashed lock says, the
gateway's worker list kept through its worker API, and each worker's health as it sees it."""

from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from pve_sglang.facts.gateway import GatewayWorkers, SmgVenvPackages
from pve_sglang.gateway.workers import Worker, judge, strays, verdict
from pve_sglang.operations.venv import lock_differences
from pve_sglang.stack.lock import Lock


#: What a venv holds besides its packages (``python3 -m venv``'s ensurepip).
VENV_TOOLS = frozenset({"pip", "setuptools", "wheel"})


def install_args(wheelhouse: str | None, index_url: str | None) -> list[str]:
    """Where pip takes the lock's files from: a wheelhouse (offline), else an index, else
    pip's default."""
    if wheelhouse:
        return ["--no-index", "--find-links", wheelhouse]
    return ["--index-url", index_url] if index_url else []


@operation()
def smg_venv(venv: str, lock_file: str, lock: Lock, args: list[str]):
    """
    Make the venv at VENV hold exactly the packages of LOCK at their versions, every file
    checked against the lock's sha256 (``pip install --require-hashes``), and no other (pip
    aside); a venv that already does costs one read.

    + venv: the venv's folder, e.g. ``/opt/smg/venv`` (made from the system ``python3``)
    + lock_file: the lock's path in the container (uploaded before)
    + lock: the parsed lock (``stack.lock.parse``)
    + args: where the files come from (``install_args``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import gateway
        from pve_sglang.stack import lock

        gateway.smg_venv(
            name="smg as locked",
            venv="/opt/smg/venv",
            lock_file="/opt/smg/smg-1.13.0-py3.11.txt",
            lock=lock.parse(Path("group_data/locks/smg-1.13.0-py3.11.txt")),
            args=gateway.install_args(None, None),
        )
    """
    python = f"{venv.rstrip('/')}/bin/python"
    installed = host.get_fact(SmgVenvPackages, python=python)
    install = ["python3 -m venv"]
    extra: list[str] = []
    if installed is not None:
        # pip itself comes with the venv (ensurepip) and installs the lock: not a difference.
        have = {name: version for name, version in installed.items() if name not in VENV_TOOLS}
        differences = lock_differences(have, lock.packages)
        if not differences:
            host.noop(f"the venv holds the lock's {len(lock.packages)} packages")
            return
        logger.info(f"{host.name}: the smg venv differs from its lock: {', '.join(differences[:6])}")
        extra = sorted(name for name in have if name not in lock.packages)
        install = [] if all(w.startswith("not in the lock") for w in differences) else ["pip"]
    if installed is None:
        yield StringCommand("python3 -m venv", QuoteString(venv))
    if install:
        yield StringCommand(QuoteString(python), "-m pip install --quiet --disable-pip-version-check "
                            "--require-hashes --no-deps", *(QuoteString(a) for a in args),
                            "-r", QuoteString(lock_file))
    if extra:
        yield StringCommand(QuoteString(python), "-m pip uninstall --quiet --yes",
                            *(QuoteString(name) for name in extra))


@operation()
def workers_registered(status_argv: list[str], sync_argv: list[str], workers: list[Worker]):
    """
    The gateway lists every worker of WORKERS (smg's ``GET /workers``), registered with the
    workers' keys file as it is; when one is missing, one the deploy registered before is no
    longer wanted, or a key changed since they were registered, the worker script syncs the list
    through the worker API (``POST /workers``, ``DELETE /workers/{id}``; a worker whose key
    changed is deleted and posted again with it, one at a time): no restart, the requests in
    flight on the other workers go on. A gateway that lists them all with their keys current
    costs one read.

    + status_argv: ``remote/gateway_workers.py status`` (``render.sync_argv(gs, "status")``)
    + sync_argv: its ``sync`` command line (``render.sync_argv(gs)``)
    + workers: the gateway's workers (``gateway_worker_list``)

    **Example:**

    .. code:: python

        from pve_sglang.gateway import render
        from pve_sglang.operations import gateway

        gateway.workers_registered(
            name="The gateway lists its workers",
            status_argv=render.sync_argv(gs, "status"),
            sync_argv=render.sync_argv(gs),
            workers=workers,
        )
    """
    answer = host.get_fact(GatewayWorkers, argv=status_argv)
    listed = answer.get("workers")
    if isinstance(listed, list):
        urls = {str(item.get("url", "")).rstrip("/") for item in listed if isinstance(item, dict)}
        wanted = {w.url.rstrip("/") for w in workers}
        # A worker the deploy registered and no longer wants is in the script's state: the
        # sync removes it; one listed by someone else stays.
        registered = {str(url) for url in answer.get("registered") or ()}
        if wanted <= urls and not (urls - wanted) & registered and answer.get("keys_current"):
            host.noop(f"the gateway lists its {len(workers)} workers")
            return
    yield StringCommand(*(QuoteString(arg) for arg in sync_argv))


@operation()
def workers_healthy(status_argv: list[str], check_argv: list[str], workers: list[Worker]):
    """
    Log each worker as the gateway sees it (healthy, unhealthy, not up, or removed from its
    list) and as it answers one short generation asked straight from the gateway's container,
    as the gateway forwards one (smg lists a worker healthy while its every generation fails or
    hangs: its ``/health`` answers); fail naming every worker it removed, marks unhealthy,
    still waits for, or that fails its generation, and each registration the deploy made that
    smg still holds for a worker no longer in the inventory. Read-only: a check, no change.

    + status_argv: ``remote/gateway_workers.py status``
    + check_argv: ``remote/gateway_workers.py check`` (``render.sync_argv(gs, "check", S)``)
    + workers: the gateway's workers

    **Example:**

    .. code:: python

        from pve_sglang.gateway import render
        from pve_sglang.operations import gateway

        gateway.workers_healthy(name="Each worker healthy in the gateway",
                                status_argv=render.sync_argv(gs, "status"),
                                check_argv=render.sync_argv(gs, "check", 60), workers=workers)
    """
    if not state.is_executing:
        host.noop("the workers' health in the gateway: checked after the run")
        return
    answer = host.get_fact(GatewayWorkers, argv=status_argv)
    listed = answer.get("workers")
    if not isinstance(listed, list):
        raise OperationError(f"{host.name}: the gateway does not answer: {answer.get('error')}")
    pending = [str(url) for url in answer.get("pending") or ()]
    checked = host.get_fact(GatewayWorkers, argv=check_argv)
    answers = checked.get("workers")
    if not isinstance(answers, list):
        raise OperationError(f"{host.name}: the workers' generation check did not run: "
                             f"{checked.get('error')}")
    lines, problems = verdict(judge(workers, listed, pending, answers), strays(workers, pending))
    for line in lines:
        logger.info(f"{host.name}: gateway worker {line}")
    if problems:
        raise OperationError(f"{host.name}: " + "; ".join(problems))
    host.noop(f"the gateway routes to all {len(workers)} workers, each answering")
    yield from ()
