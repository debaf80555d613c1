"""The user's hosts file (YAML) turned into pyinfra inventory groups.

A host entry holds host settings, connection keys (``ssh_*``) and container settings that
act as defaults for its containers; ``containers`` lists the containers, each with ``vmid``
(Proxmox) or ``name`` (plain LXC) and its own overrides.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .connectors.container import LOCAL_HOSTNAMES as LOCAL_NAMES
from .settings import (
    CONTAINER_FIELDS,
    HOST_FIELDS,
    SettingsError,
    check_container_keys,
    check_vmid,
    load_defaults,
    validate_container,
    validate_host,
)

HOSTS_FILE_ENV = "PVE_SGLANG_HOSTS"
DEFAULT_HOSTS_FILE = "hosts.yml"
# Used when no hosts file exists: a local Debian LXC container on this machine.
EMBEDDED_HOSTS_FILE = Path(__file__).resolve().parent / "embedded_hosts.yml"

Group = list[tuple[str, dict[str, Any]]]


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a hosts file must not."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise SettingsError(
                    f"hosts file line {key_node.start_mark.line + 1}: key {key!r} appears twice"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def hosts_file_path(cwd: Path | None = None) -> Path:
    """The hosts file in use: ``$PVE_SGLANG_HOSTS``, else ``hosts.yml``, else the embedded one."""
    if os.environ.get(HOSTS_FILE_ENV):
        path = Path(os.environ[HOSTS_FILE_ENV])
        if not path.is_file():
            raise SettingsError(f"{HOSTS_FILE_ENV}={path}: no such file")
        return path
    path = (cwd or Path.cwd()) / DEFAULT_HOSTS_FILE
    return path if path.is_file() else EMBEDDED_HOSTS_FILE


def read_hosts_file(path: Path) -> dict[str, Any]:
    """Parse the YAML hosts file, rejecting duplicate keys."""
    with open(path) as handle:
        content = yaml.load(handle, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    if not isinstance(content, dict) or not content:
        raise SettingsError(f"{path}: expected a mapping of host names to host entries")
    return content


def _connection_data(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k.startswith("ssh_")}


def _host_inventory_name(name: str, data: dict[str, Any]) -> str:
    if name in LOCAL_NAMES or data.get("ssh_hostname") in LOCAL_NAMES:
        return "@local"
    return name


def _container_inventory_name(platform: str, host: str, key: Any, local: bool) -> str:
    if platform == "pve":
        return f"@pct/{host}/{key}"
    return f"@lxc/{key}" if local else f"@lxc/{host}/{key}"


def build_groups(
    hosts: dict[str, Any], defaults: dict[str, Any] | None = None
) -> tuple[Group, Group]:
    """Validate every host and container, then return (pve_hosts, gpu_containers).

    Raises SettingsError on the first bad value, before anything connects or changes.
    """
    defaults = load_defaults() if defaults is None else defaults
    pve_hosts: Group = []
    gpu_containers: Group = []
    for host_name, entry in hosts.items():
        entry = dict(entry or {})
        containers = entry.pop("containers", None) or []
        if not isinstance(containers, list):
            raise SettingsError(f"host {host_name}: field 'containers' must be a list of entries")
        host_settings = validate_host(host_name, entry, defaults)
        inventory_name = _host_inventory_name(host_name, entry)
        local = inventory_name == "@local"
        identity = "vmid" if host_settings.platform == "pve" else "name"
        host_data = {k: v for k, v in entry.items() if k in HOST_FIELDS or k.startswith("ssh_")}
        container_defaults = {k: v for k, v in entry.items() if k in CONTAINER_FIELDS}

        seen: set[Any] = set()
        names = []
        for container in containers:
            container = dict(container or {})
            if identity not in container:
                raise SettingsError(
                    f"host {host_name}: a container entry has no '{identity}' "
                    f"(platform {host_settings.platform} names containers by {identity})"
                )
            key = container.pop(identity)
            check_vmid(host_name, host_settings.platform, key)
            if key in seen:
                raise SettingsError(
                    f"host {host_name}: {identity} {key} is declared twice; each container "
                    f"on a host needs its own {identity}"
                )
            seen.add(key)
            check_container_keys(host_name, str(key), container)
            data = {**container_defaults, **container}
            validate_container(host_name, str(key), data, defaults)
            name = _container_inventory_name(host_settings.platform, host_name, key, local)
            names.append(name)
            gpu_containers.append(
                (
                    name,
                    {
                        **_connection_data(entry),
                        **data,
                        "pve_host": inventory_name,
                        "platform": host_settings.platform,
                        **({"pct_vmid": key} if identity == "vmid" else {"lxc_name": key}),
                        **({"lxc_path": host_settings.lxc_path} if identity == "name" else {}),
                    },
                )
            )
        pve_hosts.append((inventory_name, {**host_data, "containers": names}))
    _check_nodes(gpu_containers)
    return pve_hosts, gpu_containers


def _check_nodes(gpu_containers: Group) -> None:
    """Every name in ``nodes`` must be a container of this inventory."""
    known = {name for name, _ in gpu_containers}
    for name, data in gpu_containers:
        nodes = data.get("nodes") or []
        for node in nodes:
            if node not in known:
                raise SettingsError(
                    f"container {name}: field 'nodes' names {node!r}, which is not a container "
                    f"of this inventory; allowed: {', '.join(sorted(known))}"
                )
        if nodes and name not in nodes:
            raise SettingsError(f"container {name}: field 'nodes' must include the container itself")
