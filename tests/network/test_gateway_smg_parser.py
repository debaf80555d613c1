"""The gateway's command line against the pinned smg's own parser: its wheel set from the
package index (the gateway's lock), its router_args.py run as smg runs it. The rest of the
gateway's rules, in the fast tier: tests/unit/test_gateway.py."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from pve_sglang.config.gateway import smg_lock_path
from pve_sglang.gateway import render
from pve_sglang.server.command import EnvRef
from test_gateway import gateway
from wheels import locked_wheels


def test_the_command_line_parses_with_the_pinned_smg(package_index, tmp_path):
    """Every flag as smg 1.13.0's own parser reads it (its router_args.py from the wheel)."""
    # smg and what it imports (cp311 wheels, as the containers take them)
    for wheel in locked_wheels(smg_lock_path("1.13.0", "3.11")).glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp_path)
    gs = gateway(gateway_api_key="k", gateway_remove_unhealthy=True, gateway_policy="power_of_two")
    argv = render.smg_argv(gs)
    args = [("secret-value" if isinstance(a, EnvRef) else a) for a in argv[3:]]
    probe = (
        "import sys, argparse, json; from smg.launch_router import parse_router_args; "
        "a = parse_router_args(sys.argv[1:]); print(json.dumps([a.host, a.port, a.policy, "
        "a.prometheus_port, a.health_check_interval_secs, a.health_check_timeout_secs, "
        "a.health_failure_threshold, a.health_check_endpoint, a.remove_unhealthy_workers, "
        "a.api_key, a.worker_startup_timeout_secs, a.worker_startup_check_interval]))")
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (
        '["127.0.0.1", 30000, "power_of_two", 29000, 10, 5, 3, "/health", true, "secret-value", '
        '3600, 10]')
