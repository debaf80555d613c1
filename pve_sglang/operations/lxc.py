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

    + container: the container's name (``lxc-create -n``)
    + lxc_path: where the host's containers live (``lxc-create -P``), e.g. ``/var/lib/lxc``
    + release: the Debian release the ``debian`` template installs, e.g. ``bookworm``
    + rootfs_tarball: a rootfs tarball on the host, unpacked instead of running the template
      (the config the template would write is written too); ``None`` runs the template

    The new container's ``ssh.service`` and ``ssh.socket`` are masked: the deploy reaches it
    through ``lxc-attach``, and an sshd sharing the host's network would listen on its port 22.

    **Example:**

    .. code:: python

        from pve_sglang.operations import lxc

        lxc.create(
            name="Create container sglang-1",
            container="sglang-1",
            lxc_path="/var/lib/lxc",
            release="bookworm",
        )
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
    """
    Start container CONTAINER when it is not running (``lxc-start``, then ``lxc-wait`` for
    RUNNING); restart it once when RESTART says so.

    + container: the container's name (``-n``)
    + lxc_path: where the host's containers live (``-P``), e.g. ``/var/lib/lxc``
    + restart: asked only when the container runs; true stops it (``lxc-stop -t 120``) and starts
      it again. Usually ``any_changed`` of the operations that changed its config

    **Example:**

    .. code:: python

        from pve_sglang.operations import lxc
        from pve_sglang.operations.changes import any_changed

        # config: the owned.lines operation that keeps the container's config
        lxc.power(
            name="Container sglang-1 running",
            container="sglang-1",
            lxc_path="/var/lib/lxc",
            restart=any_changed(config, restarts="container sglang-1 (lxc-stop, lxc-start)"),
        )
    """
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
