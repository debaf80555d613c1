"""``make status``: one row per GPU container and gateway, read-only (``status.py``).

Each container is one command: its state from its host (the connector's status command), then,
when it runs, one ``ContainerStatus`` read. The rows are printed together once every reached
host has its own; a host pyinfra could not reach is a row that says so. ``STATUS_JSON=1``
prints them as JSON instead of a table.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pyinfra import host
from pyinfra.context import state

from pve_sglang.config.gateway import GatewaySettings
from pve_sglang.config.settings import ContainerSettings, ServerView, host_settings
from pve_sglang.connectors.container import ContainerConnector
from pve_sglang.facts.status import ContainerStatus
from pve_sglang.gateway import render as gateway_render
from pve_sglang.model_store.model_fetch import MARKER
from pve_sglang.server import bench_history, status
from pve_sglang.server.addresses import base_url, client_address
from pve_sglang.server.unit_text import restart_since, unit_name
from pve_sglang.stack import switch_rules

#: The groups that have rows.
GROUPS = ("gpu_containers", "gateways")
#: A host pyinfra could not connect to: its reason is pyinfra's line above the table.
UNREACHABLE = "unreachable: could not connect"
#: Each pyinfra run's rows so far, by host name (one run per process; keyed by the state).
_ROWS: dict[int, dict[str, dict[str, str]]] = {}


def _has_row(candidate) -> bool:
    return any(group in candidate.groups for group in GROUPS)


def _read_args(server: ServerView) -> dict:
    return {"unit": unit_name(server), "venv_path": server.venv_path,
            "state": switch_rules.state_path(server.service_name), "model_path": server.model_path,
            "marker": MARKER, "metrics": True, "since": restart_since(server),
            "base_url": base_url(client_address(server.server_host), server.server_port)}


def _row() -> dict[str, str]:
    where = str(host.data.get("pve_host") or "")
    # container_ready asks the host once and keeps a yes for the read below (container_state
    # would be asked again by it); a no is asked once more for its word (stopped, missing).
    connector = host.connector
    if isinstance(connector, ContainerConnector) and not connector.container_ready():
        return status.down_row(where, host.name, connector.container_state())
    if "gateways" in host.groups:
        gs = host_settings(GatewaySettings)
        read = host.get_fact(ContainerStatus, python="/nonexistent",
                             args={"unit": gateway_render.unit_name(gs),
                                   "base_url": gateway_render.gateway_url(gs)})
        return status.gateway_row(where, host.name, read)
    cs = host_settings(ContainerSettings)
    read = host.get_fact(ContainerStatus, python=f"{cs.venv_path}/bin/python", args=_read_args(cs.server))
    runs = bench_history.load_runs(cs.bench_history_dir, host.name)
    tuned = host.data.get("tuned_file")
    tuned_mtime = Path(tuned).stat().st_mtime if tuned and Path(tuned).is_file() else None
    return status.container_row(where, host.name, cs.venv_path, read, runs, tuned_mtime,
                                time.time())


def status_phase() -> None:
    """This host's row; the whole table once the last reached host has given its own."""
    if not _has_row(host):
        return
    try:
        row = _row()
    except Exception as error:  # a row with the reason, not a traceback: the others still show
        row = status.down_row(str(host.data.get("pve_host") or ""), host.name,
                              f"read failed: {type(error).__name__}: {error}")
    rows = _ROWS.setdefault(id(state), {})
    rows[host.name] = row
    active = [h for h in state.inventory.get_active_hosts() if _has_row(h)]
    if any(h.name not in rows for h in active):
        return
    for other in state.inventory:
        # Outside --limit: no row; within it and not reached: pyinfra could not connect.
        if _has_row(other) and other.name not in rows and state.is_host_in_limit(other):
            rows[other.name] = status.down_row(str(other.data.get("pve_host") or ""), other.name,
                                               UNREACHABLE)
    ordered = [rows[h.name] for h in state.inventory if h.name in rows]
    text = status.as_json(ordered) if os.environ.get("STATUS_JSON") == "1" else status.table(ordered)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
