"""The end-to-end proof of a release set, without a GPU: the whole deploy (``pyinfra
inventory.py deploy.py``, through the CLI) of one sglang release's locked set into a real
unprivileged LXC container on this machine (the plain LXC host), from the host's wheel store
with the shared layer, up to the deploy's own flag check and the unit; then the release's real
argument parser (``ServerArgs.add_cli_args``, imported from the installed set) parses the
unit's server flags.

Used by tests/lxc/test_release_stack_lxc.py and devtools/release.py (``make release VERSION=X``).
Nothing is downloaded in the container: its pip finds only uv's wheel (a read-only
``/etc/pip.conf``), and the set comes from the store, offline. The machine running pyinfra
fetches the store's wheels once into ``machine_cache`` (``PVE_SGLANG_CACHE``), where a second
proof of the same lock finds them.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from devtools import lxc_env
from pve_sglang.project import ROOT

PYINFRA = Path(sys.executable).parent / "pyinfra"
#: Free disk a proof of a 0.5.23-sized set needs at its peak, in bytes. Measured (``DiskPeak``,
#: docs/releases.md): 12.1 GB of the filesystem's free space at the end of the layer's copy:
#: the layer (10.7 GB: uv's scratch cache is hardlinked to its staging, which the host renames
#: into the store: ``layer.copy_command``), the container (0.5 GB), the store's wheels linked
#: from this machine's cache (``operations.wheels.local_copy``: 4.3 GB copied before); with a
#: margin for the rest of the machine meanwhile.
PEAK_BYTES = 15 * 10**9


#: A second set proven in a proof's container and store (an upgrade there): its shared layer
#: and venv beside the first set's, its wheels linked (0.5.17's whole proof took 14.3 GB with
#: its 4.1 GB of wheels copied).
UPGRADE_BYTES = 12 * 10**9


def disk_shortfall(folder: Path, need: int = PEAK_BYTES) -> str | None:
    """Why FOLDER's filesystem cannot hold a proof (NEED bytes at its peak) now, or None."""
    free = shutil.disk_usage(folder).free
    if free >= need:
        return None
    return (f"a proof needs about {need / 1e9:.0f} GB free under {folder} at its peak "
            f"(the store and the shared layer); {free / 1e9:.1f} GB are")


class DiskPeak:
    """The most disk a stretch of work took, sampled in a thread while the ``with`` block runs:
    ``peak``, FOLDER's filesystem's free space at the start less the least seen (every
    INTERVAL seconds; the rest of the machine's writes count too), and ``own``, the most
    FOLDER itself held (``du``, every OWN_INTERVAL seconds: what the proof wrote there, the
    container's rootfs included). Measures to report, not to assert on."""

    def __init__(self, folder: Path, interval: float = 2.0, own_interval: float = 10.0):
        self.folder, self.interval, self.own_interval = folder, interval, own_interval
        self.start = self.least = shutil.disk_usage(folder).free
        self.at = 0.0  # seconds into the block of the least free space
        self.own = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _du(self) -> int:
        done = subprocess.run(["du", "-sx", "--block-size=1", str(self.folder)],
                              capture_output=True, text=True)
        return int(done.stdout.split()[0]) if done.stdout else 0

    def _sample(self) -> None:
        began = last_du = time.monotonic()
        while True:
            free = shutil.disk_usage(self.folder).free
            if free < self.least:
                self.least, self.at = free, time.monotonic() - began
            if time.monotonic() - last_du >= self.own_interval:
                self.own, last_du = max(self.own, self._du()), time.monotonic()
            if self._stop.wait(self.interval):
                return

    @property
    def peak(self) -> int:
        return self.start - self.least

    def __enter__(self) -> "DiskPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.own = max(self.own, self._du())

    def words(self) -> str:
        return (f"disk peak {self.peak / 1e9:.1f} GB at {self.at:.0f} s ({self.start / 1e9:.1f} "
                f"GB free before), {self.own / 1e9:.1f} GB at most in {self.folder.name}")


UNIT = "/etc/systemd/system/sglang.service"
VENV_PYTHON = "/opt/sglang/venv/bin/python"
#: Where the container's pip finds its wheels (the deploy's tools venv: uv), and nothing else.
PIP_WHEELS = "/opt/pvs-pip-wheels"
PIP_CONF = f"[global]\nno-index = true\nfind-links = {PIP_WHEELS}\n"

#: Run by the container's venv Python, the server flags as JSON on stdin: the release's own
#: parser, as ``sglang.launch_server`` builds it (``prepare_server_args``), parses them; its
#: words (errors, deprecation warnings) come back as JSON.
REAL_PARSER = r'''
import argparse, contextlib, io, json, sys
args = json.load(sys.stdin)
out = io.StringIO()
verdict = {"error": None}
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    from sglang.srt.server_args import ServerArgs
    import sglang
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        parser.parse_args(args)
    except SystemExit as stop:
        verdict["error"] = f"argparse exit {stop.code}"
verdict["version"] = getattr(sglang, "__version__", "unknown")
verdict["output"] = out.getvalue()
print(json.dumps(verdict))
'''


@dataclass(frozen=True)
class ParserVerdict:
    """What the release's real parser said of the unit's server flags."""

    version: str
    error: str | None  # argparse refused them: its message
    deprecated: list[str]  # lines of its output that call a flag deprecated

    @property
    def problems(self) -> list[str]:
        return ([f"sglang {self.version}'s parser refuses the server flags: {self.error}"]
                if self.error else []) + [
            f"sglang {self.version} warns: {line}" for line in self.deprecated]


def parse_verdict(text: str) -> ParserVerdict:
    """The REAL_PARSER script's JSON line."""
    data = json.loads(text.strip().splitlines()[-1])
    output = data["output"]
    error = None
    if data["error"]:
        error = " ".join(line.strip() for line in output.splitlines()
                         if "error:" in line) or data["error"]
    deprecated = [line.strip() for line in output.splitlines() if "deprecat" in line.lower()]
    return ParserVerdict(data["version"], error, deprecated)


def unit_server_args(unit_text: str) -> list[str]:
    """The server's own arguments in the unit's ExecStart: what follows ``-m MODULE`` (the
    launcher's options before it are not the server's)."""
    lines = unit_text.splitlines()
    [start] = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    command = []
    for line in lines[start:]:  # systemd's continuation lines: a trailing backslash
        command.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            break
    words = shlex.split(" ".join(command).split("=", 1)[1])
    index = words.index("-m")
    return words[index + 2:]


class ReleaseDeploy:
    """A hosts file for one local LXC container of Debian SUITE with sglang SGLANG_VERSION's
    locked set from a wheel store (STORE, a host folder), and the pyinfra CLI run against it.
    ROOT holds the container, the store (unless given) and the hosts file; UV_WHEEL is uv's
    wheel for the container's tools venv; MACHINE_CACHE is PVE_SGLANG_CACHE of the run.
    ``log``: the run's stderr lines, each with its second into the run."""

    def __init__(self, root: Path, sglang_version: str, uv_wheel: Path, machine_cache: Path,
                 suite: str = lxc_env.SUITE, name: str = "pvs-release",
                 stack_lock: str | None = None, lxc_config: list[str] | None = None,
                 store: Path | None = None):
        self.root, self.name, self.suite = root, name, suite
        self.machine_cache = machine_cache
        self.lxc_path = root / "lxc"
        self.store = store or root / "store"  # another proof's: a second container of the host
        self.pip_wheels = root / "pip-wheels"
        self.pip_conf = root / "pip.conf"
        for folder in (self.lxc_path, self.store, self.pip_wheels):
            folder.mkdir(parents=True, exist_ok=True)
        lxc_env.reachable_by_container_root(self.lxc_path)
        lxc_env.reachable_by_container_root(self.store)
        (self.pip_wheels / uv_wheel.name).write_bytes(uv_wheel.read_bytes())
        self.pip_conf.write_text(PIP_CONF)
        bridge = lxc_env.bridge_interface()
        self.address, self._address_lock = lxc_env.reserve_address(bridge)
        self.gateway = str(bridge.ip)
        self.container: dict = {
            "name": name, "sglang_version": sglang_version, "stack_install": "pinned",
            "wheel_store": str(self.store), "shared_layer": True,
            **({"stack_lock": stack_lock} if stack_lock else {}),
        }
        self.lxc_config = list(lxc_config or [])
        self.hosts_file = root / "hosts.yml"
        self.seconds = 0.0
        self.log: list[tuple[float, str]] = []

    def write_hosts(self) -> None:
        hosts = {"local": {
            "platform": "lxc", "require_gpu": False, "lxc_path": str(self.lxc_path),
            "lxc_release": self.suite,
            "lxc_rootfs_tarball": str(lxc_env.ensure_rootfs_tarball(self.suite)),
            # Unprivileged (the default) on LXC's NAT bridge, a static address (the test
            # rootfs has no DHCP client).
            "net0": f"name=eth0,bridge={lxc_env.BRIDGE},ip={self.address},gw={self.gateway}",
            "lxc_config": [
                f"lxc.mount.entry = {self.pip_wheels} {PIP_WHEELS.lstrip('/')} none "
                "bind,ro,create=dir 0 0",
                f"lxc.mount.entry = {self.pip_conf} etc/pip.conf none bind,ro,create=file 0 0",
                *self.lxc_config,
            ],
            "containers": [self.container],
        }}
        self.hosts_file.write_text(yaml.safe_dump(hosts))

    def run_cli(self, *args: str) -> subprocess.CompletedProcess:
        """The deploy through pyinfra's CLI; its wall time in ``seconds``."""
        self.write_hosts()
        lxc_env.reachable_by_container_root(self.store)
        env = {**os.environ, "PVE_SGLANG_HOSTS": str(self.hosts_file),
               "PVE_SGLANG_CACHE": str(self.machine_cache),
               # This machine's pip configuration (a site's constraints file capping torch, say)
               # is not the lock's: the locked fetch reads none.
               "PIP_CONFIG_FILE": os.devnull}
        argv = [str(PYINFRA), "inventory.py", "deploy.py", "-y", "--json", *args]
        started = time.monotonic()
        self.log = []
        with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as run:
            # stderr read line by line as it comes (timed), stdout (the JSON) beside it.
            out: list[str] = []
            reader = threading.Thread(target=lambda: out.append(run.stdout.read()), daemon=True)
            reader.start()
            for line in run.stderr:
                self.log.append((time.monotonic() - started, line.rstrip("\n")))
            reader.join(timeout=3600)
            code = run.wait(timeout=3600)
        self.seconds = time.monotonic() - started
        return subprocess.CompletedProcess(argv, code, "".join(out),
                                           "\n".join(line for _, line in self.log))

    def when(self, words: str) -> float | None:
        """The second into the last run of its first stderr line holding WORDS."""
        return next((at for at, line in self.log if words in line), None)

    def attach(self, command: str, input: str | None = None, timeout: float = 300,
               check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["lxc-attach", "-P", str(self.lxc_path), "-n", self.name, "--clear-env",
             "-v", f"PATH={lxc_env.CONTAINER_PATH}", "--", "sh", "-c", command],
            input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done

    def unit_args(self) -> list[str]:
        return unit_server_args(self.attach(f"cat {UNIT}").stdout)

    def real_parser(self, args: list[str] | None = None) -> ParserVerdict:
        """The installed release's real parser on ARGS (the unit's server flags when None)."""
        args = self.unit_args() if args is None else args
        done = self.attach(f"{VENV_PYTHON} -c {shlex.quote(REAL_PARSER)}", input=json.dumps(args))
        return parse_verdict(done.stdout)

    def destroy(self) -> None:
        subprocess.run(["lxc-stop", "-P", str(self.lxc_path), "-n", self.name, "-k"],
                       capture_output=True)
        subprocess.run(["lxc-destroy", "-P", str(self.lxc_path), "-n", self.name],
                       capture_output=True)
        self._address_lock.close()


def changed(results: dict) -> list[str]:
    """Names of the operations that changed something in a run (pyinfra's JSON results)."""
    return [op["name"] for op in results["results"]["operations"] if op["success"]]


def failed(results: dict) -> list[str]:
    return [op["name"] for op in results["results"]["operations"] if op["error"]]
