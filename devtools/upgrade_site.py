"""A container for upgrades of the stack, on this machine: stand-in releases of sglang under the
deploy's own unit, and the test deploy ``tests/deploys/upgrade.py`` run on it through the
pyinfra CLI; or several such containers as the nodes of one model (``make_group``). Used by
tests/lxc/test_upgrade_lxc.py, tests/lxc/test_upgrade_nodes_lxc.py and bench/upgrade_downtime.py.

Each stack is a real venv with a real sglang wheel (``stack_install: sglang-no-deps``, from a
wheelhouse), so the autotune patch and the flag check run on real sglang code. The server is
``tests/standin_sglang.py`` run by the Python of ``venv_path``: it behaves as
``/opt/standin/cases.json`` says for the sglang release of the stack the link names (serve,
crash at load, stall in the autotune, answer degenerate text).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pve_sglang.stack import switch_rules

REPO = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"
LOGS = REPO / "tests" / "fixtures" / "sglang_logs"
STANDIN = "/opt/standin"
CASES = f"{STANDIN}/cases.json"
WHEELHOUSE = "/opt/wheelhouse"
PIP_WHEELS = "/opt/pvs-pip-wheels"
VENV = "/opt/sglang/venv"
UNIT = "sglang.service"
PORT = 39900 + os.getpid() % 90
API_KEY = "sk-upgrade-secret-Zq4"
SETTINGS = {"api_key": API_KEY, "server_port": PORT, "startup_stall_s": 3,
            "health_timeout_s": 120, "generation_timeout_s": 5,
            "upgrade_probation_s": 0, "model_path": "/models/standin",
            "stack_install": "sglang-no-deps", "wheelhouse": WHEELHOUSE, "wheel_store": None}


def stack_of(release: str) -> str:
    """The stack id of RELEASE's stack (no lock: sglang alone)."""
    return switch_rules.unlocked_id(release)


class Site:
    """The container BOX, its stand-in releases and the test deploy; ROOT: a folder here."""

    def __init__(self, box, root: Path):
        self.box, self.root = box, root
        self.times: dict[str, float] = {}

    def sh(self, command: str, check: bool = True) -> str:
        done = self.box.attach(command, check=False)
        if check:
            assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    def cases(self, **cases: str) -> None:
        """What each stand-in release does (``0_5_7="crash-load"``); the others serve."""
        self.put(CASES, json.dumps({release.replace("_", "."): case
                                    for release, case in cases.items()}))

    def put(self, path: str, text: str) -> None:
        self.box.attach(f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > "
                        f"{shlex.quote(path)}", input=text)

    def command(self, release: str, *args: str) -> list[str]:
        inventory = self.root / "inventory.py"
        settings = {**SETTINGS, "sglang_version": release}
        inventory.write_text(f"hosts = [({self.box.inventory_name!r}, "
                             f"{{**{self.box.host_data()!r}, 'settings': {settings!r}}})]\n")
        return [str(PYINFRA), str(inventory), "tests/deploys/upgrade.py", "-y", *args]

    def deploy(self, release: str, *args: str) -> subprocess.CompletedProcess:
        """The test deploy of RELEASE (ARGS: more of pyinfra's, ``--data KEY=VALUE``); its
        output in ``.log``, its wall time in ``times``."""
        started = time.monotonic()
        done = subprocess.run(self.command(release, *args), cwd=REPO, capture_output=True,
                              text=True, timeout=600)
        self.times[" ".join((release, *args))] = time.monotonic() - started
        done.log = done.stdout + done.stderr  # type: ignore[attr-defined]
        return done

    def link(self) -> str:
        return self.sh(f"readlink {VENV}")

    def stacks(self) -> set[str]:
        return set(self.sh(f"ls {VENV}{switch_rules.SUFFIX}").split())

    def pid(self) -> str:
        return self.sh(f"systemctl show -p MainPID --value {UNIT}")

    def starts(self) -> int:
        """How many times the server's process started (its first line in the journal)."""
        return int(self.sh(f"journalctl -u {UNIT} --no-pager -o cat | grep -c '^stand-in of "
                           "sglang' || true"))

    def record(self) -> dict:
        return json.loads(self.sh(f"cat {switch_rules.state_path('sglang')} 2>/dev/null || echo '{{}}'"))

    def health(self) -> str:
        return self.sh(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer "
                       f"{API_KEY}' http://127.0.0.1:{PORT}/health", check=False)

    def serves(self) -> str:
        """The release whose stand-in answers /health now (its first journal line), or ''."""
        if self.health() != "200":
            return ""
        line = self.sh(f"journalctl -u {UNIT} --no-pager -o cat | grep '^stand-in of sglang' "
                       "| tail -1")
        return line.split()[3].rstrip(":")


def make_site(lxc_env, root: Path, sglang_wheels: list[Path], uv_wheel: Path,
              pause_scale: float = 0.1) -> Site:
    """A container of LXC_ENV with the wheels mounted read-only, the stand-in and the unit's
    drop-in (PAUSE_SCALE: the stand-in's start, 0.1: about 3 s)."""
    return _site(lxc_env, root, _wheel_mounts(root, sglang_wheels, uv_wheel), pause_scale)


def _wheel_mounts(root: Path, sglang_wheels: list[Path], uv_wheel: Path) -> list[str]:
    """The wheels in folders of ROOT, and the LXC mount lines that show them to a container."""
    wheelhouse, pip_wheels = root / "wheelhouse", root / "pip-wheels"
    wheelhouse.mkdir()
    pip_wheels.mkdir()
    for wheel in sglang_wheels:
        shutil.copy(wheel, wheelhouse)
    shutil.copy(uv_wheel, pip_wheels)
    pip_conf = root / "pip.conf"
    pip_conf.write_text(f"[global]\nno-index = true\nfind-links = {PIP_WHEELS}\n")
    for folder in (root, *root.parents):
        if folder.stat().st_mode & 0o001 == 0:
            folder.chmod(folder.stat().st_mode | 0o011)
    return [
        f"lxc.mount.entry = {wheelhouse} {WHEELHOUSE.lstrip('/')} none bind,ro,create=dir 0 0",
        f"lxc.mount.entry = {pip_wheels} {PIP_WHEELS.lstrip('/')} none bind,ro,create=dir 0 0",
        f"lxc.mount.entry = {pip_conf} etc/pip.conf none bind,ro,create=file 0 0",
    ]


def _site(lxc_env, root: Path, mounts: list[str], pause_scale: float, prefix: str = "upg") -> Site:
    box = lxc_env.create(lxc_env.new_name(prefix), extra_config=mounts)
    site = Site(box, root)
    site.put(f"{STANDIN}/standin_sglang.py", (REPO / "tests" / "standin_sglang.py").read_text())
    for log in LOGS.glob("*.log"):
        site.put(f"{STANDIN}/logs/{log.name}", log.read_text())
    site.sh("mkdir -p /models/standin")
    # The deploy's unit, its server replaced by the stand-in run by the venv_path link's Python.
    site.put(f"/etc/systemd/system/{UNIT}.d/standin.conf",
             "[Service]\nExecStartPre=\nExecStart=\nExecStart=/opt/sglang/venv/bin/python "
             f"{STANDIN}/standin_sglang.py --logs {STANDIN}/logs --port {PORT} --pause-scale "
             f"{pause_scale} --case-by-release {CASES} --event-file /run/standin-event\n")
    site.cases()
    return site


class Group:
    """The nodes of one model (``nodes``: SITES, each a container of its own, in rank order)
    deployed together by one run of the test deploy; ROOT: a folder here. SOLO: containers of
    a model of their own (no ``nodes``), deployed in the same run."""

    def __init__(self, sites: list[Site], root: Path, solo: list[Site] | None = None):
        self.sites, self.root, self.solo = sites, root, solo or []
        self.times: dict[str, float] = {}

    @property
    def nodes(self) -> list[str]:
        return [site.box.inventory_name for site in self.sites]

    def command(self, release: str, *args: str) -> list[str]:
        inventory = self.root / "inventory.py"
        settings = {**SETTINGS, "sglang_version": release, "nodes": self.nodes}
        alone = {**SETTINGS, "sglang_version": release}
        hosts = [(site.box.inventory_name, {**site.box.host_data(), "settings": settings})
                 for site in self.sites]
        hosts += [(site.box.inventory_name, {**site.box.host_data(), "settings": alone})
                  for site in self.solo]
        inventory.write_text(f"hosts = {hosts!r}\n")
        return [str(PYINFRA), str(inventory), "tests/deploys/upgrade.py", "-y", *args]

    def deploy(self, release: str, *args: str) -> subprocess.CompletedProcess:
        """The test deploy of RELEASE on every node at once (ARGS: more of pyinfra's,
        ``--limit NAME``); its output in ``.log``, its wall time in ``times``."""
        started = time.monotonic()
        done = subprocess.run(self.command(release, *args), cwd=REPO, capture_output=True,
                              text=True, timeout=600)
        self.times[f"{len(self.times) + 1}: {' '.join((release, *args))}"] = \
            time.monotonic() - started
        done.log = done.stdout + done.stderr  # type: ignore[attr-defined]
        return done

    def destroy(self) -> None:
        for site in (*self.sites, *self.solo):
            site.box.destroy()


def make_group(lxc_env, root: Path, sglang_wheels: list[Path], uv_wheel: Path, count: int = 2,
               pause_scale: float = 0.1, solo: int = 0) -> Group:
    """COUNT containers of LXC_ENV as the nodes of one model, and SOLO containers serving a
    model alone in the same runs, each as ``make_site``'s, the wheels shared (mounted
    read-only in each)."""
    mounts = _wheel_mounts(root, sglang_wheels, uv_wheel)
    return Group([_site(lxc_env, root, mounts, pause_scale, prefix="node")
                  for _ in range(count)], root,
                 [_site(lxc_env, root, mounts, pause_scale, prefix="solo") for _ in range(solo)])
