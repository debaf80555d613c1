"""Plain LXC container operations (``lxc-*`` tools), for LXC hosts without Proxmox."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

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
    where = ["-P", QuoteString(lxc_path), "-n", QuoteString(name)]
    # The deploy reaches the container through lxc-attach; an sshd in a container that shares
    # the host's network (the default lxc_config) would listen on the host's port 22.
    service, socket = (
        StringCommand("ln -sf /dev/null", QuoteString(f"{base}/rootfs/etc/systemd/system/{unit}"))
        for unit in ("ssh.service", "ssh.socket")
    )
    mask_ssh = StringCommand(service, "&&", socket)
    if rootfs_tarball is None:
        yield StringCommand("lxc-create", *where, "-t debian -- -r", QuoteString(release),
                            "&&", mask_ssh)
        return
    # The config the debian template would write; the deploy's own lines are added after.
    config = [
        "lxc.include = /usr/share/lxc/config/debian.common.conf",
        "lxc.arch = linux64",
        f"lxc.uts.name = {name}",
        f"lxc.rootfs.path = dir:{base}/rootfs",
    ]
    yield StringCommand(
        "mkdir -p", QuoteString(f"{base}/rootfs"),
        "&& tar -xpf", QuoteString(rootfs_tarball), "-C", QuoteString(f"{base}/rootfs"),
        "&&", mask_ssh,
        "&& printf '%s\\n'", *(QuoteString(line) for line in config),
        ">", QuoteString(f"{base}/config"),
    )


@operation()
def power(container: str, lxc_path: str, restart: Callable[[], bool]):
    """Start container CONTAINER when it is not running; restart it once when RESTART says so."""
    name = container
    status = host.get_fact(LxcContainerStatus, container=name, lxc_path=lxc_path)
    where = ["-P", QuoteString(lxc_path), "-n", QuoteString(name)]
    start = StringCommand("lxc-start", *where, "&& lxc-wait", *where, "-s RUNNING -t 60")
    if status != "RUNNING":
        yield start
    elif restart():
        yield StringCommand("lxc-stop", *where, "-t 120 &&", start)
    else:
        host.noop(f"container {name} is running")
