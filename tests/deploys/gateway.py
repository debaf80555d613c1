"""Test deploy: the gateway phase's own steps (``tasks.gateway.gateway_steps``) on the gateway
host of the inventory, with ``group_data/all.py``'s settings and the host's ``settings``
overrides, its ``gateway_worker_list``, the workers' keys (``worker_keys``) and their generation
check's bound (``check_timeout_s``) as the phase would take them from the inventory (a test
inventory loads no group_data)."""

import sys
from pathlib import Path

from pyinfra import host

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.config.gateway import validate_gateway  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from tasks.gateway import gateway_steps, gateway_workers  # noqa: E402

if host.data.get("gateway_worker_list") is not None:
    gs = validate_gateway(host.name, host.data.get("settings", {}), load_defaults())
    workers = gateway_workers()
    gateway_steps(gs, workers, list(host.data.get("worker_keys") or [None] * len(workers)),
                  timeout_s=int(host.data.get("check_timeout_s") or 60))
