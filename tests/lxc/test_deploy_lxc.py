"""The whole deploy through the real CLI into a real LXC container (systemd), as far as no GPU allows.

`pyinfra inventory.py deploy.py -y --json` on a plain LXC host (this machine) creates the
container from the cached Debian rootfs, installs uv, a venv and the real sglang 0.5.9 wheel
from a local wheelhouse (without its dependencies: no GPU here), applies the autotune patch to
the real sglang files, renders and enables the unit. Steps that need a GPU (user-space driver,
CUDA toolkit, starting the server, CUDA and /health checks) are skipped with a message naming
them; the test checks those messages too.

Nothing is downloaded during a deploy: the wheels (sglang's, and uv's that the deploy's
``pip install uv==...`` takes) come from tests/wheels.py's cache, fetched once with retries; a
read-only ``/etc/pip.conf`` in the container points its pip at them (``no-index``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_runs import changed, failed

from devtools import lxc_env
from pve_sglang.project import load_defaults

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
NAME = "pvs-deploy"
UNIT = "/etc/systemd/system/sglang.service"
# Lets the test run the unit without a GPU: only ExecStart is replaced, in a drop-in, so the
# unit file under test stays the deploy's own.
NO_GPU_DROPIN = "[Service]\nExecStartPre=\nExecStart=\nExecStart=/bin/sleep infinity\n"
#: Where the container's pip finds its wheels (the deploy's tools venv: uv), and nothing else.
PIP_WHEELS = "/opt/pvs-pip-wheels"
PIP_CONF = f"[global]\nno-index = true\nfind-links = {PIP_WHEELS}\n"


class Deploy:
    """A hosts file for one local LXC container, and the pyinfra CLI run against it.
    SGLANG_WHEEL and PYPI_WHEEL: the fixtures of those names (tests/conftest.py). FILES_OF:
    the root of another Deploy whose wheel folders this one mounts instead of its own (a
    snapshot of its container names them in its mount lines: tests/provisioned.py)."""

    def __init__(self, root: Path, sglang_wheel, pypi_wheel, name: str = NAME,
                 files_of: Path | None = None):
        self.root = root
        self.name = name
        self.lxc_path = root / "lxc"
        files = files_of or root
        self.wheelhouse = files / "wheelhouse"
        self.pip_wheels = files / "pip-wheels"
        self.pip_conf = files / "pip.conf"
        self.lxc_path.mkdir(parents=True)
        # The unprivileged container's root (host uid 100000) walks down to its rootfs:
        # pytest's own folders are 0700.
        for folder in [self.lxc_path, *self.lxc_path.parents]:
            if folder.stat().st_mode & 0o001 == 0:
                folder.chmod(folder.stat().st_mode | 0o011)
        # An address of its own on the bridge (the test rootfs has no DHCP client): another
        # module's Deploy may run beside this one on the other pytest worker.
        bridge = lxc_env.bridge_interface()
        self.address, self._address_lock = lxc_env.reserve_address(bridge)
        self.gateway = bridge.ip
        if files_of is None:
            self.wheelhouse.mkdir()
            shutil.copy(sglang_wheel("0.5.9"), self.wheelhouse)
            self.pip_wheels.mkdir()
            shutil.copy(pypi_wheel("uv", load_defaults()["uv_version"]), self.pip_wheels)
            self.pip_conf.write_text(PIP_CONF)
        self.container: dict = {
            "name": name,
            # The wheelhouse's release: the one whose autotune patch these tests watch (the
            # default, 0.5.23, needs none).
            "sglang_version": "0.5.9",
            "wheelhouse": "/opt/wheelhouse",
            "stack_install": "sglang-no-deps",
            "ca_certificates": [str(lxc_env.HOST_CA_DIR / "*.crt")],
            "hf_token": "hf_test_secret_value",
        }
        self.hosts_file = root / "hosts.yml"

    def write_hosts(self) -> None:
        hosts = {
            "local": {
                "platform": "lxc",
                "require_gpu": False,
                "lxc_path": str(self.lxc_path),
                "lxc_rootfs_tarball": str(lxc_env.ensure_rootfs_tarball()),
                # Unprivileged (the default) on LXC's NAT bridge, a static address (the test
                # rootfs has no DHCP client); the wheelhouse is a user line of lxc_config.
                "net0": f"name=eth0,bridge={lxc_env.BRIDGE},ip={self.address},gw={self.gateway}",
                "lxc_config": [
                    f"lxc.mount.entry = {self.wheelhouse} opt/wheelhouse none bind,ro,create=dir 0 0",
                    f"lxc.mount.entry = {self.pip_wheels} {PIP_WHEELS.lstrip('/')} none "
                    "bind,ro,create=dir 0 0",
                    f"lxc.mount.entry = {self.pip_conf} etc/pip.conf none bind,ro,create=file 0 0",
                ],
                "containers": [self.container],
            }
        }
        self.hosts_file.write_text(yaml.safe_dump(hosts))

    def cli(self, *args: str) -> tuple[list[str], dict]:
        """The pyinfra command line and environment of a deploy against the hosts file."""
        self.write_hosts()
        env = {**os.environ, "PVE_SGLANG_HOSTS": str(self.hosts_file)}
        return [str(PYINFRA), "inventory.py", "deploy.py", "-y", "--json", *args], env

    def run_cli(self, *args: str) -> subprocess.CompletedProcess:
        """Run the deploy through pyinfra's CLI against the hosts file."""
        command, env = self.cli(*args)
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900)

    def run(self, *args: str) -> tuple[dict, str]:
        """Run the deploy, which must succeed; returns pyinfra's JSON results and its log."""
        done = self.run_cli(*args)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        return json.loads(done.stdout), done.stderr

    def attach(self, command: str, check: bool = True) -> str:
        done = subprocess.run(
            ["lxc-attach", "-P", str(self.lxc_path), "-n", self.name, "--clear-env",
             "-v", f"PATH={lxc_env.CONTAINER_PATH}", "--", "sh", "-c", command],
            capture_output=True, text=True, timeout=120,
        )
        if check:
            assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    def destroy(self) -> None:
        subprocess.run(["lxc-stop", "-P", str(self.lxc_path), "-n", self.name, "-k"],
                       capture_output=True)
        subprocess.run(["lxc-destroy", "-P", str(self.lxc_path), "-n", self.name],
                       capture_output=True)
        self.release_address()

    def release_address(self) -> None:
        """Give the container's bridge address back (it will not run again)."""
        self._address_lock.close()




@pytest.fixture(scope="module")
def deploy(tmp_path_factory, lxc_host, sglang_wheel, pypi_wheel):
    deploy = Deploy(tmp_path_factory.mktemp("deploy"), sglang_wheel, pypi_wheel)
    yield deploy
    deploy.destroy()


@pytest.fixture(scope="module")
def first_run(deploy):
    return deploy.run()


def test_first_run_creates_and_installs_and_says_what_needs_a_gpu(deploy, first_run):
    results, log = first_run
    assert failed(results) == []
    names = set(changed(results))
    assert any("Create container" in n for n in names), names
    assert any("sglang==0.5.9" in n for n in names), names
    assert any("autotune" in n for n in names), names
    for skipped in ("NVIDIA user-space driver and the CUDA toolkit", "not started: the SGLang "
                    "server needs a GPU", "verify skipped (GPUs visible, CUDA init, /health"):
        assert skipped in log, log[-3000:]


def test_container_has_patched_sglang_enabled_unit_and_private_env(deploy, first_run):
    site = deploy.attach(
        "/opt/sglang/venv/bin/python -c 'import importlib.util as u; "
        "print(u.find_spec(\"sglang\").submodule_search_locations[0])'"
    )
    runner = deploy.attach(f"cat {site}/srt/model_executor/model_runner.py")
    assert '"flashinfer_cutlass",  # pve-sglang: autotune enabled' in runner
    # No GPU: not enabled at boot, where it would fail and restart every RestartSec.
    assert deploy.attach("systemctl is-enabled sglang.service", check=False) == "disabled"
    # The test rootfs keeps sshd from starting (devtools/lxc_env.py), and the deploy enables none.
    assert deploy.attach("systemctl is-enabled ssh.service", check=False) == "masked"
    deploy.attach(f"systemd-analyze verify {UNIT}")
    assert deploy.attach("stat -c '%a %U' /etc/sglang/sglang.env") == "600 root"
    assert "HF_TOKEN=" in deploy.attach("cat /etc/sglang/sglang.env")
    unit = deploy.attach(f"cat {UNIT}")
    assert "hf_test_secret_value" not in unit
    assert "--mem-fraction-static 0.92" in unit and "--max-running-requests" not in unit


def test_second_run_changes_nothing(deploy, first_run):
    results, _ = deploy.run()
    assert changed(results) == [] and failed(results) == []
    # Nothing changed because everything was checked, not because nothing ran.
    checked = " | ".join(op["name"] for op in results["results"]["operations"] if op["no_change"])
    for step in ("Create container", "Base packages", "sglang==0.5.9", "autotune",
                 "Server environment", "systemd unit sglang.service", "enabled and running"):
        assert step in checked, f"{step!r} was not checked in the converged run: {checked}"


def test_changing_one_flag_restarts_the_running_server_exactly_once(deploy, first_run):
    deploy.attach("mkdir -p /etc/systemd/system/sglang.service.d && printf '%s' "
                  f"'{NO_GPU_DROPIN}' > /etc/systemd/system/sglang.service.d/no-gpu.conf && "
                  "systemctl daemon-reload && systemctl start sglang.service")
    pid = deploy.attach("systemctl show -p MainPID --value sglang.service")
    assert pid != "0"
    stops = "journalctl -u sglang.service --no-pager -o cat | grep -c '^Stopping' || true"
    stops_before = int(deploy.attach(stops))

    deploy.container["mem_fraction_static"] = 0.85
    results, _ = deploy.run()
    assert set(changed(results)) == {
        "GPU container | systemd unit sglang.service",
        "GPU container | Reload systemd units",
        "GPU container | sglang.service enabled and running (restarted only when its unit, env, "
        "stack or patch changed)",
    }
    assert int(deploy.attach(stops)) == stops_before + 1
    assert "--mem-fraction-static 0.85" in deploy.attach(f"cat {UNIT}")
    new_pid = deploy.attach("systemctl show -p MainPID --value sglang.service")
    assert new_pid not in ("0", pid)

    results, _ = deploy.run()
    assert changed(results) == []
    assert deploy.attach("systemctl show -p MainPID --value sglang.service") == new_pid
    assert int(deploy.attach(stops)) == stops_before + 1


def test_reinstall_drops_patch_and_next_run_restores_it(deploy, first_run):
    site = deploy.attach(
        "/opt/sglang/venv/bin/python -c 'import importlib.util as u; "
        "print(u.find_spec(\"sglang\").submodule_search_locations[0])'"
    )
    deploy.attach("/opt/sglang/tools/bin/uv pip install --python /opt/sglang/venv/bin/python "
                  "--no-index --find-links /opt/wheelhouse --no-deps --reinstall sglang==0.5.9")
    assert "pve-sglang" not in deploy.attach(f"cat {site}/srt/model_executor/model_runner.py")
    results, _ = deploy.run()
    assert changed(results) == [
        "GPU container | FlashInfer CUTLASS MoE autotune (sglang patch)",
        "GPU container | sglang.service enabled and running (restarted only when its unit, env, "
        "stack or patch changed)",
    ]
    assert "pve-sglang: autotune enabled" in deploy.attach(
        f"cat {site}/srt/model_executor/model_runner.py"
    )


def test_flag_the_release_does_not_know_stops_before_the_unit_changes(deploy, first_run):
    unit_before = deploy.attach(f"cat {UNIT}")
    deploy.container["extra_server_args"] = ["--no-such-flag"]
    done = deploy.run_cli()
    assert done.returncode != 0
    assert "sglang 0.5.9 does not know --no-such-flag" in done.stderr
    assert deploy.attach(f"cat {UNIT}") == unit_before
    deploy.container["extra_server_args"] = []
    results, _ = deploy.run()
    assert changed(results) == []


def test_changed_hostname_restarts_the_container_once_and_holds_after_boot(deploy, first_run):
    pid = subprocess.run(["lxc-info", "-P", str(deploy.lxc_path), "-n", deploy.name, "-pH"],
                         capture_output=True, text=True, check=True).stdout.strip()
    deploy.container["hostname"] = "renamed-box"
    try:
        results, _ = deploy.run()
        names = changed(results)
        assert f"Proxmox host | Container {deploy.name} running" in names  # one restart
        assert "GPU container | Hostname renamed-box (/etc/hostname)" in names
        assert "GPU container | Hostname renamed-box (now)" in names
        assert deploy.attach("hostname") == "renamed-box"
        assert deploy.attach("cat /etc/hostname") == "renamed-box"
        new_pid = subprocess.run(["lxc-info", "-P", str(deploy.lxc_path), "-n", deploy.name,
                                  "-pH"], capture_output=True, text=True, check=True).stdout.strip()
        assert new_pid != pid
        # The next boot keeps it: systemd sets the name from /etc/hostname.
        subprocess.run(["lxc-stop", "-P", str(deploy.lxc_path), "-n", deploy.name, "-t", "60"],
                       check=True)
        results, _ = deploy.run()
        # A stopped container is started, and its phases run once it runs: nothing else.
        assert [name for name in changed(results) if "(after the container starts)" not in name] \
            == [f"Proxmox host | Container {deploy.name} running"]
        assert deploy.attach("hostname") == "renamed-box"
    finally:
        deploy.container.pop("hostname")
