"""The server's files for one container, rendered once: its command line, unit and env file.

The container phase writes what ``server_files`` returns, and the host phase's preflight calls
it for every container (new ones too, whose container phase is deferred until they run), so a
render error stops the run before any change, in ``--dry`` as in a real run.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api.inventory import Inventory

from pve_sglang.server.addresses import host_port
from pve_sglang.config.settings import ServerView, container_hostname
from pve_sglang.server.command import ServerArgv, server_argv, venv_python
from pve_sglang.server.unit_text import render_env, render_fallback_unit, render_unit


@dataclass
class ServerFiles:
    """What the container phase writes for the server: its command line, unit and env file."""

    argv: ServerArgv
    unit: str
    env: str
    #: The unit the server's names in ``OnFailure=`` (a stack on trial switched back).
    fallback: str = ""


def server_files(
    name: str, server: ServerView, gpus: list[dict], inventory: Inventory
) -> ServerFiles:
    """Render the server's argv, unit and env file for container NAME on these GPUs (the
    host's GPUs it gets, ``gpu.passthrough.select_gpus``); the first node's hostname from INVENTORY
    when several nodes serve the model. Raises ValueError."""
    node_rank, nnodes = node_rank_for(name, server.nodes)
    address = server.dist_init_addr
    if address is None and server.nodes:
        address = container_hostname(inventory.get_host(server.nodes[0]).data)
    # Several nodes: server.nodes is not empty, so ADDRESS is set.
    rank0 = dist_init_addr(address, server.dist_init_port) if nnodes > 1 and address is not None else None
    argv = server_argv(
        server,
        gpu_count=len(gpus) or 1,
        compute_caps=[gpu["compute_cap"] for gpu in gpus],
        node_rank=node_rank,
        nnodes=nnodes,
        dist_init_addr=rank0,
        python=venv_python(server),
    )
    return ServerFiles(argv, render_unit(server, argv), render_env(server),
                       render_fallback_unit(server))


def node_rank_for(inventory_name: str, nodes: list[str]) -> tuple[int | None, int]:
    """(node rank, node count) of a container; (None, 1) when it serves alone (``nodes`` empty)."""
    if not nodes:
        return None, 1
    # Validation refuses a name listed twice (ContainerSettings._distinct).
    if inventory_name not in nodes:
        raise ValueError(f"nodes {nodes} does not list this container ({inventory_name})")
    return nodes.index(inventory_name), len(nodes)


def dist_init_addr(address: str, port: int) -> str:
    """``host:port`` of rank 0 for ``--dist-init-addr`` (IPv6 addresses in brackets)."""
    return host_port(address, port)
