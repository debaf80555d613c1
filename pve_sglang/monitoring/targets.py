"""What the monitoring's Prometheus scrapes, chosen from the inventory (pure).

Three jobs: ``sglang`` (each serving container's ``/metrics``, with its API key where it has
one), ``smg`` (each gateway's Prometheus port) and ``node`` (each host's node exporter, where
the GPU sampler's figures are). Every target carries the labels the rules join on: ``container``
(its inventory name) and ``pve_host`` (the host it runs on).
"""

from __future__ import annotations

from dataclasses import dataclass

from pve_sglang.config.settings import SettingsError
from pve_sglang.gateway.workers import LOOPBACK_PREFIXES, WILDCARDS
from pve_sglang.server.addresses import host_port

JOBS = ("sglang", "smg", "node")


@dataclass(frozen=True)
class Target:
    """One scrape target: its job, its inventory name, ``host:port``, its host, and whether
    the scrape sends the container's API key."""

    job: str
    name: str
    address: str
    pve_host: str
    has_key: bool = False

    def as_data(self) -> dict:
        return {"job": self.job, "name": self.name, "address": self.address,
                "pve_host": self.pve_host, "has_key": self.has_key}


def reached_at(where: str, field: str, bound: str, hostname: str, port: int) -> str:
    """``host:port`` the monitoring container reaches a listener bound to BOUND at, in the
    container named HOSTNAME; one bound to loopback cannot be reached: a SettingsError naming
    FIELD."""
    if bound.startswith(LOOPBACK_PREFIXES):
        raise SettingsError(
            f"{where}: field '{field}' = {bound!r} is reachable from its own container only, "
            "not from the monitoring container; allowed: the container's address, or 0.0.0.0 "
            "(every interface)")
    return host_port(hostname if bound in WILDCARDS else bound, port)


def server_target(where: str, name: str, pve_host: str, data: dict) -> Target | None:
    """The target of a serving container (its merged settings DATA); None for a node of a
    multi-node group that is not its first (it serves no HTTP)."""
    nodes = data.get("nodes") or ()
    if nodes and nodes[0] != name:
        return None
    if not data.get("enable_metrics"):
        raise SettingsError(f"{where}: field 'enable_metrics' = False: its server serves no "
                            "/metrics for the monitoring to scrape; allowed: true")
    address = reached_at(where, "server_host", str(data.get("server_host")),
                         str(data["hostname"]), int(data["server_port"]))
    return Target("sglang", name, address, pve_host, data.get("api_key") is not None)


def gateway_target(where: str, name: str, pve_host: str, data: dict) -> Target:
    """The target of a gateway: smg's Prometheus port, on its ``gateway_host``."""
    address = reached_at(where, "gateway_host", str(data.get("gateway_host")),
                         str(data["hostname"]), int(data["gateway_prometheus_port"]))
    return Target("smg", name, address, pve_host)


def node_target(name: str, address: str, port: int) -> Target:
    """The target of host NAME's node exporter at ADDRESS:PORT."""
    return Target("node", name, host_port(address, port), name)
