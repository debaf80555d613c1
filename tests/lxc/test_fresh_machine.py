"""`make deploy` on a fresh Debian 12 machine: a real container with nothing but Debian's
minimal system, python3 (without python3-venv: no ensurepip) and make.

The project is copied in as a clean checkout (the working tree without .git, .venv, .cache,
hosts.yml), and ``make deploy ARGS=--dry`` runs there as root: it must install lxc and
debootstrap (the embedded default deploys a local LXC container) and python3-venv, bootstrap
.venv from pyproject.toml and reach pyinfra's plan for the embedded default. ``--dry`` is as
far as it goes: creating a container inside this test container is not tried.

It downloads Debian packages and the Python packages (a few minutes); without a network it is
skipped, saying so. The container trusts this machine's CA certificates (devtools/lxc_env.py),
and ``PIP_CERT`` points pip at them, as on this machine: a machine without an intercepting
proxy needs neither.

The container has a network of its own (LXC's NAT bridge), never this machine's: in this
machine's network namespace the LXC tools inside it would reach this machine's containers of
the same name (LXC's command sockets are abstract sockets of a network namespace), and the
deploy would read a running ``pve-sglang-demo`` of this machine as its own. So it runs beside
running namesakes of the deploy's containers (``deploy_namesakes``). Its downloads retry: apt's
and pip's own retries (the test rootfs's settings), the setup's apt steps tried again, and pip's
cache and apt's archives kept on this machine between runs (``.cache/fresh-machine``,
``PVE_SGLANG_TEST_CACHE`` moves it).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from cache_dir import TEST_CACHE

from devtools import lxc_env

REPO = Path(__file__).resolve().parents[2]
CACHE = TEST_CACHE / "fresh-machine"
#: Host folder -> the container's: kept between runs, so that a run downloads only what changed.
CACHES = {"pip": "root/.cache/pip", "apt-archives": "var/cache/apt/archives"}
EXCLUDE = (".git", ".venv", ".cache", "hosts.yml", "__pycache__", "*.egg-info", ".pytest_cache")
#: Debian's venv support: removed so that `python3 -m venv` cannot work, as on a fresh machine.
VENV_PACKAGES = ("python3-venv", "python3.11-venv", "python3-pip-whl", "python3-setuptools-whl")
REGISTRIES = (("deb.debian.org", 80), ("pypi.org", 443), ("files.pythonhosted.org", 443))


def unreachable() -> list[str]:
    """The package registries this test needs that do not answer from here."""
    down = []
    for name, port in REGISTRIES:
        try:
            socket.create_connection((name, port), timeout=5).close()
        except OSError as error:
            down.append(f"{name}:{port} ({error})")
    return down


def attach(container, command: str, timeout: float = 120, input: bytes | None = None):
    """Run COMMAND in the container as root with a login-like environment (and pip's CA)."""
    return subprocess.run(
        ["lxc-attach", "-P", str(container.lxc_path), "-n", container.name, "--clear-env",
         "-v", f"PATH={lxc_env.CONTAINER_PATH}", "-v", "HOME=/root", "-v", "LANG=C.UTF-8",
         "-v", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt", "--", "sh", "-c", command],
        input=input, capture_output=True, timeout=timeout,
    )


def ok(container, command: str, timeout: float = 120) -> str:
    done = attach(container, command, timeout)
    out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"{command}: {out[-3000:]}"
    return out


def clean_checkout() -> bytes:
    """The working tree as a tarball, without what a fresh clone does not have."""
    excludes = [f"--exclude={pattern}" for pattern in EXCLUDE]
    return subprocess.run(["tar", "-C", str(REPO), *excludes, "-cf", "-", "."],
                          capture_output=True, check=True).stdout


def cache_mounts() -> list[str]:
    lines = []
    for folder, inside in CACHES.items():
        (CACHE / folder / ("partial" if folder == "apt-archives" else "")).mkdir(parents=True,
                                                                                exist_ok=True)
        lines.append(f"lxc.mount.entry = {CACHE / folder} {inside} none bind,create=dir 0 0")
    return lines


@pytest.fixture
def fresh_debian(lxc_container_factory, deploy_namesakes, package_index):
    down = unreachable()
    if down:
        pytest.skip(f"needs the package registries (apt, pip): unreachable: {', '.join(down)}")
    [container] = lxc_container_factory(network="bridge", extra_config=cache_mounts())
    # The setup's downloads, tried again on a failure (apt retries each file itself too).
    package_index(lambda: ok(container, "apt-get update -qq", timeout=300), "apt-get update")
    package_index(lambda: ok(container, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "
                             f"{' '.join(VENV_PACKAGES)} && DEBIAN_FRONTEND=noninteractive "
                             "apt-get install -y -qq make", timeout=300), "apt-get install make")
    return container


def test_make_deploy_dry_on_a_fresh_debian_machine(fresh_debian, deploy_namesakes):
    container = fresh_debian
    print(f"[fresh] beside running namesakes of the deploy's containers: {deploy_namesakes}")
    # Fresh as promised: python3 and make, no venv support, no LXC tools.
    for tool in ("lxc-start", "debootstrap", "dnsmasq"):
        assert attach(container, f"command -v {tool}").returncode != 0, tool
    assert attach(container, "python3 -m venv /tmp/probe").returncode != 0
    ok(container, "python3 --version && make --version")

    ok(container, "mkdir /root/pve-sglang")
    done = attach(container, "tar -C /root/pve-sglang -xf -", input=clean_checkout())
    assert done.returncode == 0, done.stderr

    started = time.monotonic()
    done = attach(container, "cd /root/pve-sglang && make deploy ARGS=--dry", timeout=1500)
    seconds = time.monotonic() - started
    log = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    print(f"[fresh] make deploy ARGS=--dry: exit {done.returncode} after {seconds:.0f}s\n"
          f"{log[-2500:]}", flush=True)

    # The tools, said and installed; then the venv; then pyinfra's plan of the embedded default.
    assert "no hosts file: the embedded default deploys a local LXC container on lxc-net's " \
           "bridge: installing lxc debootstrap dnsmasq-base" in log, log[-3000:]
    assert "-m venv cannot work here (no ensurepip): installing python3-venv" in log, log[-3000:]
    for tool in ("lxc-start", "debootstrap", "dnsmasq"):
        assert attach(container, f"command -v {tool}").returncode == 0, tool
    assert attach(container, "/root/pve-sglang/.venv/bin/pyinfra --version").returncode == 0
    assert "pve-sglang-demo" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert done.returncode == 0, log[-3000:]
