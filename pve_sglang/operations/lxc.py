"""Plain LXC container operations (``lxc-*`` tools), for LXC hosts without Proxmox."""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pyinfra import host
from pyinfra.api import operation

from ..facts.pve import LxcContainerStatus


def config_path(name: str, lxc_path: str) -> str:
    """Where LXC keeps container NAME's config."""
    return f"{lxc_path.rstrip('/')}/{name}/config"


@operation()
def create(container: str, lxc_path: str, release: str, rootfs_tarball: str | None = None):
    """
    Create plain LXC container CONTAINER when it does not exist: Debian RELEASE through the
    ``debian`` template (debootstrap), or unpacked from ROOTFS_TARBALL when given.
    """
    name = container
    if host.get_fact(LxcContainerStatus, container=name, lxc_path=lxc_path) is not None:
        host.noop(f"container {name} exists")
        return
    base = f"{lxc_path.rstrip('/')}/{name}"
    p, n = shlex.quote(lxc_path), shlex.quote(name)
    # The deploy reaches the container through lxc-attach; an sshd in a container that shares
    # the host's network (the default lxc_config) would listen on the host's port 22.
    mask_ssh = " && ".join(
        f"ln -sf /dev/null {shlex.quote(base)}/rootfs/etc/systemd/system/{unit}"
        for unit in ("ssh.service", "ssh.socket")
    )
    if rootfs_tarball is None:
        yield f"lxc-create -P {p} -n {n} -t debian -- -r {shlex.quote(release)} && {mask_ssh}"
        return
    # The config the debian template would write; the deploy's own lines are added after.
    config = [
        "lxc.include = /usr/share/lxc/config/debian.common.conf",
        "lxc.arch = linux64",
        f"lxc.uts.name = {name}",
        f"lxc.rootfs.path = dir:{base}/rootfs",
    ]
    yield (
        f"mkdir -p {shlex.quote(base)}/rootfs && "
        f"tar -xpf {shlex.quote(rootfs_tarball)} -C {shlex.quote(base)}/rootfs && {mask_ssh} && "
        f"printf '%s\\n' {' '.join(shlex.quote(line) for line in config)} > {shlex.quote(base)}/config"
    )


@operation()
def power(container: str, lxc_path: str, restart: Callable[[], bool]):
    """Start container CONTAINER when it is not running; restart it once when RESTART says so."""
    name = container
    status = host.get_fact(LxcContainerStatus, container=name, lxc_path=lxc_path)
    p, n = shlex.quote(lxc_path), shlex.quote(name)
    start = f"lxc-start -P {p} -n {n} && lxc-wait -P {p} -n {n} -s RUNNING -t 60"
    if status != "RUNNING":
        yield start
    elif restart():
        yield f"lxc-stop -P {p} -n {n} -t 120 && {start}"
    else:
        host.noop(f"container {name} is running")
