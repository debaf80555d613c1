"""The container's one read (``ContainerState``) on a real LXC container: a converged run reads
the container once, and each drift the separate reads caught is still caught by the next run.

One container, deployed as ``test_deploy_lxc`` deploys it (a copy of the run's deployed
template: tests/provisioned.py). Then, all at once: a base Debian
package marked not installed, uv replaced by another release, sglang's installed version
changed, the unit enabled (it must stay disabled without a GPU), the hostname changed, the env
file's mode opened. A ``--dry`` plan must name the operation that fixes each; a real run fixes
those that need no network (uv and the apt package are put back by hand first), and the run
after it changes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_deploy_lxc import REPO, Deploy, changed, failed

NAME = "pvs-state"
UV = "/opt/sglang/tools/bin/uv"
ENV = "/etc/sglang/sglang.env"


@pytest.fixture(scope="module")
def deploy(deployed_copy):
    deploy = deployed_copy(NAME)
    yield deploy
    deploy.destroy()


def recorded_run(deploy: Deploy, tmp_path) -> tuple[dict, list[dict]]:
    """A real run through the bench's driver: pyinfra's JSON and every command it sent."""
    command, env = deploy.cli()
    log = tmp_path / "commands.json"
    done = subprocess.run([sys.executable, "-m", "devtools.deploy_cost.driver",
                           str(log), "--", *command[1:]], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout[done.stdout.find("{"):]), json.loads(log.read_text())["commands"]


def test_converged_run_reads_the_container_once(deploy, tmp_path):
    results, commands = recorded_run(deploy, tmp_path)
    assert changed(results) == [] and failed(results) == []
    inside = [c for c in commands if c["host"] == f"@lxc/{NAME}"]
    # The connector's one lxc-info (is it running?) and the one read of everything checked:
    # no part read on its own (the paths, packages, uv, venv, unit and hostname were read
    # one by one before).
    assert sorted((c["kind"], c["name"]) for c in inside) == [
        ("connector", "container state (lxc-info)"), ("fact", "ContainerState")], inside


def test_every_drift_is_still_caught_by_the_next_run(deploy, tmp_path):
    site = deploy.attach("/opt/sglang/venv/bin/python -c 'import importlib.util as u; "
                         "print(u.find_spec(\"sglang\").submodule_search_locations[0])'")
    # python3-venv not installed, as dpkg sees it (put back below: a reinstall needs the network).
    deploy.attach("cp /var/lib/dpkg/status /root/status.saved && awk '/^Package: /{p=$2} "
                  "p==\"python3-venv\" && /^Status: /{$0=\"Status: deinstall ok config-files\"} "
                  "{print}' /root/status.saved > /var/lib/dpkg/status")
    deploy.attach(f"mv {UV} /root/uv.saved && printf '#!/bin/sh\\necho uv 0.0.1\\n' > {UV} "
                  f"&& chmod 755 {UV}")
    # Another sglang release, as the venv's metadata (and uv) see it.
    deploy.attach(f"sed -i 's/^Version: 0.5.9$/Version: 0.5.8/' {site}-0.5.9.dist-info/METADATA "
                  f"&& mv {site}-0.5.9.dist-info {site}-0.5.8.dist-info")
    deploy.attach("systemctl enable sglang.service")
    deploy.attach("hostname drifted-name")
    deploy.attach(f"chmod 644 {ENV}")

    # A plan without -y: each operation's commands are made at prepare, from that stage's read.
    command, env = deploy.cli("--dry")
    done = subprocess.run([c for c in command if c != "-y"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    plan = json.loads(done.stdout[done.stdout.find("{"):])["plan"]
    planned = {op["name"] for op in plan if op["hosts_with_change"]}
    expected = ["Base packages", "Tools venv with uv", "sglang sglang==0.5.9",
                "sglang.service enabled and running", "Hostname sglang-pvs-state (now)",
                f"Server environment {ENV}"]
    for step in expected:
        assert any(step in name for name in planned), (step, sorted(planned))

    # Back by hand: what needs the network (apt, pip); the rest the deploy fixes.
    deploy.attach("mv /root/status.saved /var/lib/dpkg/status && mv /root/uv.saved " + UV)
    results, _ = deploy.run()
    assert failed(results) == []
    names = changed(results)
    for step in expected[2:]:
        assert any(step in name for name in names), (step, names)
    assert not any("Base packages" in n or "Tools venv" in n for n in names), names
    assert deploy.attach("systemctl is-enabled sglang.service", check=False) == "disabled"
    assert deploy.attach("uname -n") == "sglang-pvs-state"
    assert deploy.attach(f"stat -c %a {ENV}") == "600"
    assert deploy.attach(f"grep '^Version:' {site}-0.5.9.dist-info/METADATA") == "Version: 0.5.9"
    # uv removed what the old RECORD lists, not the renamed folder of this test's making.
    deploy.attach(f"rm -r {site}-0.5.8.dist-info")

    results, _ = deploy.run()
    assert changed(results) == [] and failed(results) == []
