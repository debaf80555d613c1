"""Plain LXC container operations (``lxc-*`` tools), for LXC hosts without Proxmox."""

from __future__ import annotations

from collections.abc import Callable

import posixpath
import shlex

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.facts.lxc_host import (
    LXC_NET_DNSMASQ_ALIVE,
    LXC_NET_RUN,
    HostPart,
    LxcNetState,
    NetworkBridges,
)
from pve_sglang.container_config.lxc_keys import (
    IDMAP_SIZE,
    NETWORK_MANAGERS,
    SHARED_NETWORK_DROPIN,
    SHARED_NETWORK_TEXT,
    bytes_of,
    same_limit,
)
from pve_sglang.operations import host_reads

#: Where new containers are built before they move into place (see ``create``).
STAGING = ".pve-sglang-staging"
#: LXC's own NAT bridge (the lxc package's lxc-net service).
LXC_BRIDGE = "lxcbr0"


def config_path(name: str, lxc_path: str) -> str:
    """Where LXC keeps container NAME's config."""
    return f"{lxc_path.rstrip('/')}/{name}/config"


def status(container: str, lxc_path: str) -> str | None:
    """Container CONTAINER's state (``LxcContainerStatus``), read once per run stage (with the
    host's other reads: ``host_reads``) until ``create`` or ``power`` changes it."""
    return host_reads.read(HostPart.STATUS, container, lxc_path)


def guard_paths(rootfs: str) -> list[str]:
    """The drop-ins ``network_guard`` keeps in a container whose root folder is ROOTFS."""
    return [f"{rootfs}/etc/systemd/system/{unit}.d/{SHARED_NETWORK_DROPIN}"
            for unit in NETWORK_MANAGERS]


def _sh_lines(lines: list[str], dest: str) -> StringCommand:
    """Write LINES (each quoted) to DEST."""
    return StringCommand("printf '%s\\n'", *(QuoteString(line) for line in lines), ">",
                         QuoteString(dest))


@operation()
def create(
    container: str,
    lxc_path: str,
    release: str,
    rootfs_tarball: str | None = None,
    hostname: str | None = None,
    idmap_base: int | None = None,
    shared_network: bool = False,
):
    """
    Create plain LXC container CONTAINER when it does not exist: Debian RELEASE through the
    ``debian`` template (debootstrap), or unpacked from ROOTFS_TARBALL when given. The
    container is built in a staging folder (``LXC_PATH/.pve-sglang-staging/CONTAINER``) and
    moved into place whole, so a run that stops halfway leaves no half container behind: the
    next run builds it again.

    + container: the container's name (``lxc-create -n``)
    + lxc_path: where the host's containers live (``lxc-create -P``), e.g. ``/var/lib/lxc``
    + release: the Debian release the ``debian`` template installs, e.g. ``bookworm``
    + rootfs_tarball: a rootfs tarball on the host, unpacked instead of running the template
      (the config the template would write is written too); ``None`` runs the template
    + hostname: written to the rootfs' ``/etc/hostname`` (systemd sets it at boot from there)
    + idmap_base: an unprivileged container: its files are owned by ids IDMAP_BASE + 0..65535
      (copied through ``lxc-usernsexec`` as the container's root, the way Proxmox unpacks an
      unprivileged container); ``None``: privileged
    + shared_network: the container will share the host's network namespace: every network
      manager in it gets a drop-in that keeps it from running (see ``network_guard``)

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
            hostname="sglang-1",
            idmap_base=100000,
        )
    """
    name = container
    if status(name, lxc_path) is not None:
        host.noop(f"container {name} exists")
        return
    base = f"{lxc_path.rstrip('/')}/{name}"
    stage_parent = f"{lxc_path.rstrip('/')}/{STAGING}"
    stage = f"{stage_parent}/{name}"
    rootfs = f"{stage}/rootfs"
    q = QuoteString
    # A folder without a config is not a container LXC knows: refuse rather than delete it.
    yield StringCommand(
        "if [ -e", q(base), "]; then echo", q(f"{base} exists but is no LXC container (no "
        "config): move it away, or name another container"), ">&2; exit 1; fi",
        "&& rm -rf", q(stage), "&& mkdir -p", q(stage_parent),
    )
    if idmap_base is not None:
        # The container's root is host uid IDMAP_BASE: it must be able to walk down to its rootfs.
        ids = f"b:0:{idmap_base}:{IDMAP_SIZE}"
        yield StringCommand(
            "lxc-usernsexec -m", q(ids), "-- sh -c", q(f"cd {shlex.quote(stage_parent)}"),
            "2>/dev/null || { echo", q(f"an unprivileged container's root (host uid {idmap_base}) "
            f"cannot reach {lxc_path}: every folder above it needs o+x (e.g. chmod o+x), or "
            "choose another lxc_path"), ">&2; exit 1; }",
        )
    if rootfs_tarball is None:
        yield StringCommand("lxc-create -P", q(stage_parent), "-n", q(name),
                            "-t debian -- -r", q(release))
    else:
        # The config the debian template would write; the deploy's own lines are added after.
        config = [
            "lxc.include = /usr/share/lxc/config/debian.common.conf",
            "lxc.arch = linux64",
            f"lxc.rootfs.path = dir:{rootfs}",
        ]
        yield StringCommand(
            "mkdir -p", q(rootfs), "&& tar -xpf", q(rootfs_tarball), "-C", q(rootfs),
            "&&", _sh_lines(config, f"{stage}/config"),
        )
    # The deploy reaches the container through lxc-attach; an sshd in a container that shares
    # the host's network would listen on the host's port 22.
    systemd_dir = f"{rootfs}/etc/systemd/system"
    for unit in ("ssh.service", "ssh.socket"):
        yield StringCommand("ln -sf /dev/null", q(f"{systemd_dir}/{unit}"))
    if shared_network:
        for unit in NETWORK_MANAGERS:
            yield StringCommand("mkdir -p", q(f"{systemd_dir}/{unit}.d"), "&&", _sh_lines(
                SHARED_NETWORK_TEXT.splitlines(), f"{systemd_dir}/{unit}.d/{SHARED_NETWORK_DROPIN}"))
    if hostname is not None:
        yield _sh_lines([hostname], f"{rootfs}/etc/hostname")
    final = f"{base}/rootfs"
    yield StringCommand("mkdir -m 0755", q(base))
    if idmap_base is None:
        yield StringCommand("mv", q(rootfs), q(final))
    else:
        # Copy the tree as the container's root: every owner shifts into its range, and a
        # device node (not allowed there) is left out: LXC gives /dev its own tmpfs.
        yield StringCommand("mkdir", q(final), "&& chown", q(f"{idmap_base}:{idmap_base}"),
                            q(final))
        yield StringCommand("tar -C", q(rootfs), "--numeric-owner --exclude=./dev/* -cpf",
                            q(f"{stage}/rootfs.tar"), ".")
        yield StringCommand("lxc-usernsexec -m", q(ids), "-- tar -C", q(final),
                            "--numeric-owner -xpf - <", q(f"{stage}/rootfs.tar"))
    # The rootfs path the template wrote points into the staging folder; the config moves last.
    # Not sed: a path may hold '&' or '|', which a sed replacement would read as its own.
    yield StringCommand(
        "{ grep -v '^lxc.rootfs.path'", q(f"{stage}/config"), "; printf '%s\\n'",
        q(f"lxc.rootfs.path = dir:{final}"), "; } >", q(f"{stage}/config.final"),
        "&& mv", q(f"{stage}/config.final"), q(f"{base}/config"), "&& rm -rf", q(stage),
    )
    # Read again: its config (Kind.FILE_CONTENTS), status (LXC_STATUS), cgroup values
    # (LXC_CGROUP) and, in a new rootfs, the network guard's files (LXC_FILES).
    cache.changed(config_path(name, lxc_path))
    host_reads.forget_container(name, lxc_path, created=True)


@operation()
def network_guard(rootfs: str, shared: bool):
    """
    Keep the network managers of a container (``networking``, ``systemd-networkd``,
    NetworkManager, ...) from running while it shares the host's network namespace: each gets
    a drop-in ``pve-sglang-shared-network.conf`` (``ConditionVirtualization=!container``) in
    the container's ``/etc/systemd/system``. Without it, starting the container ran a DHCP
    client on the host's interface and stopping it ran ``ifdown`` there. When the container
    has its own network, the deploy's drop-ins (and only those, known by their name) go.

    + rootfs: the container's root folder on the host (a privileged container: only those
      can share the host's network namespace)
    + shared: the container shares the host's network namespace (``lxc.net.0.type = none``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import lxc

        lxc.network_guard(
            name="Container sglang-1 leaves the host's interfaces alone",
            rootfs="/var/lib/lxc/sglang-1/rootfs",
            shared=True,
        )
    """
    paths = guard_paths(rootfs)
    present = host_reads.read(HostPart.FILES, paths) or []
    if shared:
        missing = [path for path in paths if path not in present]
        for path in missing:
            yield StringCommand("mkdir -p", QuoteString(posixpath.dirname(path)), "&&",
                                _sh_lines(SHARED_NETWORK_TEXT.splitlines(), path))
        if not missing:
            host.noop("the network managers in the container are kept from running")
            return
    elif present:
        yield StringCommand("rm -f", *(QuoteString(path) for path in present))
    else:
        host.noop("the container has its own network: no drop-in of the deploy")
        return
    cache.forget(Kind.LXC_FILES, tuple(paths))


@operation()
def cgroup_limits(container: str, lxc_path: str, limits: dict[str, str]):
    """
    Apply cgroup LIMITS to running container CONTAINER now (``lxc-cgroup``), where its current
    values differ, so that a changed limit needs no restart; a stopped container gets them
    from its config at the next start.

    + container: the container's name (``-n``)
    + lxc_path: where the host's containers live (``-P``)
    + limits: ``{key: value}`` without the ``lxc.cgroup2.`` prefix, e.g.
      ``{"memory.max": "4096M", "cpuset.cpus": "0-1"}``

    On cgroup v1, ``memory.limit_in_bytes`` may not exceed ``memory.memsw.limit_in_bytes``:
    the two are set in the order that keeps that true.

    **Example:**

    .. code:: python

        from pve_sglang.operations import lxc

        lxc.cgroup_limits(
            name="Container sglang-1 limits (live)",
            container="sglang-1",
            lxc_path="/var/lib/lxc",
            limits={"cpuset.cpus": "0-1", "memory.max": "4096M", "memory.swap.max": "0M"},
        )
    """
    if status(container, lxc_path) != "RUNNING":
        host.noop(f"container {container} is not running: its config applies at start")
        return
    current = host_reads.read(HostPart.CGROUP, container, lxc_path, list(limits)) or {}
    changed = [key for key, value in limits.items() if not same_limit(key, current.get(key), value)]
    if not changed:
        host.noop(f"container {container} runs with its limits")
        return
    memsw = "memory.memsw.limit_in_bytes"
    if memsw in changed and "memory.limit_in_bytes" in limits:
        growing = (bytes_of(limits[memsw]) or 0) >= (bytes_of(current.get(memsw, "0")) or 0)
        changed.sort(key=lambda key: (key == memsw) != growing)
    for key in changed:
        yield StringCommand("lxc-cgroup -P", QuoteString(lxc_path), "-n", QuoteString(container),
                            QuoteString(key), QuoteString(limits[key]))
    cache.forget(Kind.LXC_CGROUP, (lxc_path, container, tuple(limits)))


@operation()
def bridge(bridge: str):
    """
    Network bridge BRIDGE exists on the host. LXC's NAT bridge ``lxcbr0`` is brought up by
    starting ``lxc-net`` (the ``lxc`` package's service: a bridge with dnsmasq for DHCP and DNS
    and NAT to the host's network, touching none of the host's interfaces), and restarted when
    it is stale (up by its state file, its dnsmasq gone: containers would get no DHCP and no
    DNS); any other missing bridge stops the deploy, naming it.

    + bridge: the bridge a container's veth joins (``net0``'s ``bridge=``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import lxc

        lxc.bridge(name="Bridge lxcbr0 up", bridge="lxcbr0")
    """
    exists = bridge in (host.get_fact(NetworkBridges) or [])
    if bridge != LXC_BRIDGE:
        if exists:
            host.noop(f"bridge {bridge} exists")
            return
        raise OperationError(
            f"network bridge {bridge} does not exist on this host: create it, or set net0's "
            f"bridge= to an existing bridge (plain LXC hosts have {LXC_BRIDGE} from lxc-net)"
        )
    state = host.get_fact(LxcNetState)
    # A bridge lxc-net did not bring up (no network_up) is the user's own: left as it is.
    if exists and state != "stale":
        host.noop(f"bridge {bridge} exists")
        return
    # Where systemd is not the init (a build sandbox), lxc-net's script runs directly.
    # A stale lxc-net (its dnsmasq gone: no DHCP, no DNS for the containers) is restarted;
    # its pid file goes first, as its stop would kill whatever process now has that pid.
    stale = (
        f"{LXC_NET_DNSMASQ_ALIVE} || rm -f {LXC_NET_RUN}/dnsmasq.pid; "
        "if [ -d /run/systemd/system ]; then systemctl restart lxc-net; "
        "else /usr/libexec/lxc/lxc-net stop; /usr/libexec/lxc/lxc-net start; fi; "
    )
    start = (
        "if [ -d /run/systemd/system ]; then systemctl enable --now lxc-net; "
        "else /usr/libexec/lxc/lxc-net start; fi; "
    )
    yield StringCommand(
        (stale if state == "stale" else start)
        + "[ -d /sys/class/net/lxcbr0/bridge ] || "
        "{ echo 'lxc-net did not create lxcbr0: set USE_LXC_BRIDGE=\"true\" in "
        "/etc/default/lxc-net, and install dnsmasq-base' >&2; exit 1; }"
    )


@operation()
def power(container: str, lxc_path: str, restart: Callable[[], bool]):
    """
    Start container CONTAINER when it is not running (``lxc-start``, ``lxc-wait`` for RUNNING,
    then systemd's boot at most 120 s); restart it once when RESTART says so.

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
    state = status(name, lxc_path)
    where = ["-P", QuoteString(lxc_path), "-n", QuoteString(name)]
    # RUNNING is init started, not booted: the container's boot cleans /tmp (tmpfiles' D /tmp)
    # under the next commands' feet (python3 -m venv's ensurepip failed so, now and then). Wait
    # for systemd to finish booting (degraded counts; no systemd: no wait), at most 120 s.
    start = StringCommand("lxc-start", *where, "&& lxc-wait", *where, "-s RUNNING -t 60 && "
                          "{ timeout 120 lxc-attach", *where, "-- systemctl is-system-running "
                          "--wait >/dev/null 2>&1 || true; }")
    if state != "RUNNING":
        yield start
    elif restart():
        yield StringCommand("lxc-stop", *where, "-t 120 &&", start)
    else:
        host.noop(f"container {name} is running")
        return
    # Read again: its status (Kind.LXC_STATUS) and cgroup values (LXC_CGROUP).
    host_reads.forget_container(name, lxc_path)
