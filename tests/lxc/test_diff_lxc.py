"""``--diff`` through the real CLI (``pyinfra ... --dry --diff``) against a real LXC container on
this machine: every file change shown with secrets masked, what will restart and why, and no
secret at the highest verbosity (issue 10, item 8). Planned on recorded facts:
tests/unit/test_diff.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devtools import lxc_env
from test_diff import ANSI, ENV, NEW_KEY, NEW_TOKEN, OLD_ENV, OLD_TOKEN, OLD_UNIT, UNIT

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"


# The real CLI against a real LXC container


@pytest.fixture
def running_container(lxc_container_factory):
    """A real container holding an earlier deploy's unit (running, with its ExecStart
    replaced by a sleep: no GPU here) and env file with an old token."""
    (container,) = lxc_container_factory(1)
    dropin = "[Service]\nExecStart=\nExecStart=/bin/sleep infinity\n"
    container.attach(
        f"mkdir -p /etc/sglang {UNIT}.d && chmod 700 /etc/sglang && "
        f"printf %s {shq(OLD_UNIT)} > {UNIT} && printf %s {shq(dropin)} > {UNIT}.d/no-gpu.conf"
        f" && (umask 077 && printf %s {shq(OLD_ENV)} > {ENV}) && systemctl daemon-reload && "
        "systemctl enable --now sglang.service"
    )
    return container


def like_test_container(ct) -> dict:
    """Settings matching the test environment's container: privileged, named as it is named
    (its network: ``lxc_config`` lines, ``ct.network_config()``)."""
    return {"unprivileged": False, "hostname": ct.name}


def shq(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def test_cli_dry_diff_on_real_container_shows_diff_reason_and_no_secret(running_container,
                                                                           tmp_path):
    ct = running_container
    hosts = {"local": {
        "platform": "lxc", "require_gpu": False, "lxc_path": str(ct.lxc_path),
        "lxc_rootfs_tarball": str(lxc_env.ensure_rootfs_tarball()),
        # One more line than the container has: the config changes, the container restarts.
        "lxc_config": [*ct.network_config(), "lxc.cgroup2.devices.allow = c 10:200 rwm"],
        "containers": [{"name": ct.name, "hf_token": NEW_TOKEN, "api_key": NEW_KEY,
                        **like_test_container(ct)}],
    }}
    hosts_file = tmp_path / "hosts.yml"
    hosts_file.write_text(yaml.safe_dump(hosts))
    before = ct.attach(f"cat {UNIT} {ENV}").stdout
    done = subprocess.run(
        [str(PYINFRA), "inventory.py", "deploy.py", "--dry", "--diff"],
        cwd=REPO, env={**os.environ, "PVE_SGLANG_HOSTS": str(hosts_file)},
        capture_output=True, text=True, timeout=600,
    )
    out = ANSI.sub("", done.stdout + done.stderr)
    assert done.returncode == 0, out[-4000:]
    assert f"Will modify {UNIT}" in out, out[-4000:]
    assert "- ExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server --model-path " \
           "/models/old" in out
    assert "+ ExecStart=" in out
    assert f"Will modify {ENV}" in out
    assert "- HF_TOKEN=<secret>" in out and "+ SGLANG_API_KEY=<secret>" in out
    assert "sglang.service will restart because: " in out
    assert re.search(r"sglang\.service will restart because: .*systemd unit sglang\.service "
                     r"changes", out)
    config = f"{ct.lxc_path}/{ct.name}/config"
    assert f"Will modify {config}" in out
    assert "+ lxc.cgroup2.devices.allow = c 10:200 rwm" in out
    assert f"container {ct.name} (lxc-stop, lxc-start) will restart because: Container " \
           f"{ct.name} config (id map, name, network, mounts) changes" in out
    for secret in (OLD_TOKEN, NEW_TOKEN, NEW_KEY):
        assert secret not in out
    # A dry run changes nothing.
    assert ct.attach(f"cat {UNIT} {ENV}").stdout == before


def test_cli_dry_diff_at_highest_verbosity_prints_no_secret(running_container, tmp_path):
    ct = running_container
    hosts = {"local": {
        "platform": "lxc", "require_gpu": False, "lxc_path": str(ct.lxc_path),
        "lxc_rootfs_tarball": str(lxc_env.ensure_rootfs_tarball()),
        "lxc_config": ct.network_config(),
        "containers": [{"name": ct.name, "hf_token": NEW_TOKEN, "api_key": NEW_KEY,
                        **like_test_container(ct)}],
    }}
    hosts_file = tmp_path / "hosts.yml"
    hosts_file.write_text(yaml.safe_dump(hosts))
    done = subprocess.run(
        [str(PYINFRA), "inventory.py", "deploy.py", "--dry", "--diff", "-vvv", "--debug"],
        cwd=REPO, env={**os.environ, "PVE_SGLANG_HOSTS": str(hosts_file)},
        capture_output=True, text=True, timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "HF_TOKEN=<secret>" in ANSI.sub("", out)
    for secret in (OLD_TOKEN, NEW_TOKEN, NEW_KEY):
        assert secret not in out
