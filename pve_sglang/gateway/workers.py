"""Which servers a gateway fronts, and at which URL it reaches each (pure).

A worker is a serving container's server as the gateway's container reaches it: a container
serving alone, or the first node of a multi-node group (its other nodes serve no HTTP).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pve_sglang.config.settings import SettingsError
from pve_sglang.server.addresses import base_url

#: Addresses a server bound to is reachable from its own container only.
LOOPBACK_PREFIXES = ("127.", "::1")
#: Addresses that mean "every interface": the gateway reaches the server by its hostname.
WILDCARDS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class Serving:
    """What the worker choice needs of one serving container (from its settings)."""

    name: str  # inventory name, e.g. "@pct/pve1/105"
    hostname: str  # the container's hostname (the bridge's DNS name)
    server_host: str
    server_port: int
    model: str  # what it serves: served_model_name, else model_download, else model_path
    nodes: tuple[str, ...] = ()
    has_key: bool = False


@dataclass(frozen=True)
class Worker:
    """One worker of a gateway: its container, URL, and whether it asks for an API key."""

    name: str
    url: str
    has_key: bool


def model_of(data: Any) -> str:
    """The model a container serves, as the gateway's default groups them."""
    return (data.get("served_model_name") or data.get("model_download")
            or data.get("model_path") or "")


def worker_url(where: str, container: Serving) -> str:
    """The URL the gateway's container reaches CONTAINER's server at; a server bound to
    loopback cannot be reached from another container: a SettingsError naming it."""
    host = container.server_host
    if host.startswith(LOOPBACK_PREFIXES):
        raise SettingsError(
            f"{where}: worker {container.name} has field 'server_host' = {host!r}, reachable "
            "from its own container only; allowed for a gateway's worker: the container's "
            "address, or 0.0.0.0 (every interface; set api_key)")
    address = container.hostname if host in WILDCARDS else host
    return base_url(address, container.server_port)


def gateway_address(host: str, hostname: str) -> str:
    """Where a worker's container reaches a gateway listening on HOST in the container named
    HOSTNAME: its hostname for a wildcard, else the address itself."""
    return hostname if host in WILDCARDS else host


def is_first_node(container: Serving) -> bool:
    """A container serving alone, or the first node (rank 0) of its group."""
    return not container.nodes or container.nodes[0] == container.name


def choose_workers(where: str, wanted: list[str] | None,
                   containers: list[Serving]) -> list[Worker]:
    """The gateway's workers, in inventory order: the containers WANTED names, or (None) every
    serving container of the inventory, which must then serve one model. A node that is not
    its group's first serves no HTTP: naming it is an error, the default leaves it out."""
    known = {c.name: c for c in containers}
    if wanted is None:
        chosen = [c for c in containers if is_first_node(c)]
        if not chosen:
            raise SettingsError(f"{where}: no serving container in the inventory to front; "
                                "allowed: a host with containers, or gateway_workers")
        models = sorted({c.model for c in chosen})
        if len(models) > 1:
            raise SettingsError(
                f"{where}: field 'gateway_workers' = None fronts every serving container, but "
                f"they serve {len(models)} models ({', '.join(models)}); allowed: list the "
                f"containers of one model in gateway_workers ({', '.join(known)})")
    else:
        chosen = []
        for name in wanted:
            if name not in known:
                raise SettingsError(
                    f"{where}: field 'gateway_workers' names {name!r}, which is not a serving "
                    f"container of this inventory; allowed: {', '.join(known) or 'none'}")
            if not is_first_node(known[name]):
                raise SettingsError(
                    f"{where}: field 'gateway_workers' names {name!r}, a node of the group "
                    f"{list(known[name].nodes)}; allowed: its first node {known[name].nodes[0]!r} "
                    "(a multi-node group is one worker)")
            chosen.append(known[name])
        models = sorted({c.model for c in chosen})
        if len(models) > 1:
            raise SettingsError(
                f"{where}: field 'gateway_workers' = {wanted!r} mixes {len(models)} models "
                f"({', '.join(models)}); allowed: containers serving one model")
    return [Worker(c.name, worker_url(where, c), c.has_key) for c in chosen]


@dataclass(frozen=True)
class WorkerView:
    """A worker as the gateway reports it (``GET /workers``), or not at all, and its answer to
    one generation asked straight from the gateway's container (``gateway_workers.py check``)."""

    name: str
    url: str
    listed: bool
    healthy: bool | None = None
    status: str | None = None
    pending: bool = False  # not listed: smg holds its registration until its server answers
    fails: str | None = None  # why its generation failed; None: it answered (or was not asked)
    answered_s: float | None = None


def _by_url(items: list) -> dict[str, dict]:
    return {str(item.get("url", "")).rstrip("/"): item for item in items if isinstance(item, dict)}


def judge(workers: list[Worker], listed: list[dict], pending: Iterable[str] = (),
          answers: list[dict] | None = None) -> list[WorkerView]:
    """Each worker of the inventory as the gateway's LISTED answer (``GET /workers``'s
    ``workers``) shows it: missing (removed, or PENDING: registered, its server not up),
    healthy or not; and, with ANSWERS (``check``'s ``workers``), whether it answered a
    generation: a worker that does not is no worker, whatever its /health says."""
    by_url = _by_url(listed)
    waiting = {str(url).rstrip("/") for url in pending}
    answered = _by_url(answers or [])
    views = []
    for worker in workers:
        url = worker.url.rstrip("/")
        item = by_url.get(url)
        if item is None:
            views.append(WorkerView(worker.name, worker.url, False, pending=url in waiting))
            continue
        healthy = item.get("is_healthy")
        fails, took = None, None
        if answers is not None:
            answer = answered.get(url)
            if answer is None:
                fails = "not asked (no answer of the check)"
            elif answer.get("ok") is not True:
                fails = str(answer.get("why") or "no answer")[:300]
            elif isinstance(answer.get("elapsed_s"), (int, float)):
                took = float(answer["elapsed_s"])
        views.append(WorkerView(worker.name, worker.url, True,
                                healthy if isinstance(healthy, bool) else None,
                                str(item.get("status", ""))[:40] or None, fails=fails,
                                answered_s=took))
    return views


def strays(workers: list[Worker], pending: list[str]) -> list[str]:
    """The PENDING registrations (the deploy's, smg still waiting for their server) of URLs no
    worker of the inventory has: each serves once its server answers."""
    wanted = {w.url.rstrip("/") for w in workers}
    return sorted({str(url).rstrip("/") for url in pending} - wanted)


def verdict(views: list[WorkerView], stray: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(lines for the log, problems): every worker's state as the gateway sees it; a worker
    it removed, marks unhealthy, still waits for (pending) or that fails a generation is a
    problem, named; so is each STRAY registration."""
    lines, problems = [], []
    for view in views:
        if not view.listed and view.pending:
            lines.append(f"{view.name} {view.url}: not up (the gateway holds its registration, "
                         "pending until its server answers /health)")
            problems.append(f"{view.name} ({view.url}) is not up: the gateway waits for its "
                            "server (registration pending)")
        elif not view.listed:
            lines.append(f"{view.name} {view.url}: not in the gateway's list (removed)")
            problems.append(f"{view.name} ({view.url}) was removed by the gateway")
        elif view.healthy is False:
            lines.append(f"{view.name} {view.url}: unhealthy ({view.status or 'no status'})")
            problems.append(f"{view.name} ({view.url}) is unhealthy in the gateway")
        elif view.fails:
            lines.append(f"{view.name} {view.url}: listed healthy "
                         f"({view.status or 'no status'}), but fails a generation: {view.fails}")
            problems.append(f"{view.name} ({view.url}) fails a generation asked as the gateway "
                            f"asks it: {view.fails}")
        else:
            took = f", answered in {view.answered_s:.2f}s" if view.answered_s is not None else ""
            lines.append(f"{view.name} {view.url}: healthy ({view.status or 'no status'}{took})")
    for url in stray:
        lines.append(f"{url}: no longer a worker, registration pending")
        problems.append(
            f"{url} is no longer a worker of this gateway, but the gateway still holds the "
            "registration the deploy made (pending: smg cannot withdraw it): it serves once its "
            "server answers, until the next deploy removes it; restart the gateway to drop it now")
    return lines, problems


def key_problem(where: str, gateway_key: str | None, worker_keys: dict[str, str | None]) -> str | None:
    """Why the keys cannot work together, or None. smg 1.13.0 sends a worker its own key only
    when the client sent none: a client's ``Authorization`` is passed on as it is (seen with
    the real smg and a server that checks the key). So with a gateway key, every worker that
    asks for a key must ask for that one."""
    if gateway_key is None:
        return None
    other = sorted(name for name, key in worker_keys.items() if key is not None and key != gateway_key)
    if not other:
        return None
    return (f"{where}: field 'gateway_api_key' differs from the api_key of {', '.join(other)}: "
            "smg passes the client's key on to the worker, which would refuse every request "
            "(401); allowed: the workers' api_key, or null (the gateway then sends each worker "
            "its own key; keep gateway_host on loopback)")
