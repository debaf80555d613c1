"""``make status`` on a real LXC container: the real ``pyinfra inventory.py status.py`` against a
container in the state a first deploy leaves (a copy of the run's deployed template:
tests/provisioned.py; no GPU, so its server is not started). Its row says what the container
serves, read in one command inside it; the run changes nothing. A Proxmox host that cannot be
reached (SSH to a closed port) and the container stopped are rows that say so, not a traceback.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from tasks.status import UNREACHABLE as UNREACHABLE_STATE
from test_deploy_lxc import REPO, Deploy

NAME = "pvs-status"
HOST = f"@lxc/{NAME}"
#: A Proxmox host nothing answers for: SSH to the discard port, closed here.
UNREACHABLE = {"nowhere": {"ssh_hostname": "127.0.0.1", "ssh_port": 9, "ssh_user": "root",
                           "platform": "pve", "template": "debian-12-standard",
                           "require_gpu": False, "containers": [{"vmid": 105}]}}


@pytest.fixture(scope="module")
def deploy(deployed_copy):
    deploy = deployed_copy(NAME)
    yield deploy
    deploy.destroy()


def status_run(deploy: Deploy, tmp_path, extra: dict | None = None) -> tuple[list[dict], list[dict]]:
    """``STATUS_JSON=1 pyinfra inventory.py status.py`` through the bench's driver, against the
    deploy's hosts file and the hosts of EXTRA: the rows printed, and every command it sent."""
    _, env = deploy.cli()
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(yaml.safe_dump({**yaml.safe_load(deploy.hosts_file.read_text()),
                                     **(extra or {})}))
    env["PVE_SGLANG_HOSTS"] = str(hosts)
    log = tmp_path / "commands.json"
    done = subprocess.run([sys.executable, "-m", "devtools.deploy_cost.driver", str(log), "--",
                           "inventory.py", "status.py", "-y"], cwd=REPO,
                          env={**env, "STATUS_JSON": "1"}, capture_output=True, text=True,
                          timeout=600)
    # pyinfra's own exit status: 1 when a host could not be reached, the rows printed still.
    assert done.returncode == (1 if extra else 0), done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    return json.loads(out[out.index("["):out.rindex("]") + 1]), json.loads(log.read_text())["commands"]


def test_a_deployed_container_is_one_row_read_in_one_command(deploy, tmp_path):
    rows, commands = status_run(deploy, tmp_path, UNREACHABLE)
    assert len(rows) == 2, rows
    row = next(r for r in rows if r["container"] == HOST)
    assert [(r["host"], r["container"], r["state"]) for r in rows if r is not row] == [
        ("nowhere", "@pct/nowhere/105", UNREACHABLE_STATE)]
    assert (row["host"], row["container"], row["state"]) == ("@local", HOST, "running"), row
    assert re.fullmatch(r"[0-9a-f]{16}", row["stack"]), row
    assert deploy.attach("readlink /opt/sglang/venv").endswith(row["stack"])
    assert row["release"] == "sglang 0.5.9", row
    # No GPU: the deploy leaves the unit stopped; nothing listens on the server's port.
    assert row["unit"] == "inactive/dead", row
    assert row["health"].startswith("down: "), row
    assert row["restart_pending"] == "" and row["rollback"] == "" and row["probation"] == ""
    inside = [c for c in commands if c["host"] == HOST]
    assert sorted((c["kind"], c["name"]) for c in inside) == [
        ("connector", "container state (lxc-info)"), ("fact", "ContainerStatus")], inside


def test_a_stopped_container_is_a_row_with_its_state(deploy, tmp_path):
    stopped = subprocess.run(["lxc-stop", "-P", str(deploy.lxc_path), "-n", NAME],
                             capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    rows, _ = status_run(deploy, tmp_path)
    assert [(r["container"], r["state"], r["unit"]) for r in rows] == [(HOST, "stopped", "")]
