"""pyinfra connectors of pve-sglang (``@pct`` in ``pct``, ``@lxc`` in ``lxc``, what both share in
``container``) and the host data keys they read.

The keys come from each connector's own data definitions (``data_cls``/``data_meta``), the same
ones pyinfra reads when it builds the connector, so a key a connector gains or drops is allowed or
refused in the hosts file without a second list to keep.
"""

from __future__ import annotations

from functools import cache
from typing import Any, get_type_hints

from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.ssh import SSHConnector

from pve_sglang.connectors.lxc import LxcConnector
from pve_sglang.connectors.pct import PctConnector

#: The connectors a hosts file can reach, by their ``pyinfra.connectors`` entry point name: the
#: Proxmox or LXC host over SSH, and the containers on it (which reach the host through SSH too).
CONNECTORS: dict[str, type[BaseConnector]] = {
    "ssh": SSHConnector,
    "pct": PctConnector,
    "lxc": LxcConnector,
}


@cache
def connector_data_types(name: str) -> dict[str, Any]:
    """Host data keys of connector ``name`` and their types, from its ``data_cls``/``data_meta``."""
    connector = CONNECTORS[name]
    hints = get_type_hints(connector.data_cls)
    return {key: hints.get(key, Any) for key in (*hints, *connector.data_meta)}


def connector_data_keys() -> frozenset[str]:
    """Every host data key that some connector of this project reads."""
    return frozenset(key for name in CONNECTORS for key in connector_data_types(name))
