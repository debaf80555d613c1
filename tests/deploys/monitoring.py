"""Test deploy: the monitoring phase's own steps (``tasks.monitoring.prometheus_steps``, or
``existing_steps`` for an existing Prometheus's machine) on the
monitoring host of the inventory, with ``group_data/all.py``'s settings under the host's
``settings``, and its ``monitoring_targets``, ``monitoring_caps`` and the keyed servers' keys
(``server_keys``) as the phase takes them from the inventory (a test inventory loads no
group_data, and its stand-in servers are no inventory hosts)."""

import sys
from pathlib import Path

from pyinfra import host

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.config.monitoring import validate_monitoring  # noqa: E402
from pve_sglang.monitoring.targets import Target  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from tasks.monitoring import existing_steps, prometheus_steps  # noqa: E402

if host.data.get("monitoring_targets") is not None:
    ms = validate_monitoring(host.name, host.data.get("settings", {}), load_defaults())
    # An existing Prometheus's machine (``monitoring_external``): only what it includes.
    steps = existing_steps if host.data.get("monitoring_external") else prometheus_steps
    steps(ms, [Target(**t) for t in host.data.get("monitoring_targets")],
          dict(host.data.get("server_keys") or {}), dict(host.data.get("monitoring_caps") or {}))
