"""
Container settings as raw LXC config lines, for plain LXC hosts (what Proxmox does with ``pct``
options, in LXC's own keys), and the lines of a container config those settings own.

+ ``unprivileged``: ``lxc.include`` of LXC's ``userns.conf`` and ``lxc.idmap`` for ids 0..65535
  into root's first subordinate range of at least 65536 ids (``/etc/subuid``, ``/etc/subgid``);
+ ``cores``, ``memory_mib``, ``swap_mib``: cgroup keys of the host's cgroup version. ``cores``
  is a cpuset (``nproc`` in the container shows it, as on Proxmox); on cgroup v2
  ``memory.max`` and ``memory.swap.max``, on a v1 or hybrid host ``memory.limit_in_bytes`` and,
  with swap accounting, ``memory.memsw.limit_in_bytes`` (memory plus swap). These apply to a
  running container through ``lxc-cgroup``, without a restart;
+ ``mounts``: ``lxc.mount.entry`` bind mounts marked with the option ``x-pve-sglang`` (mount(2)
  ignores options of a bind mount, so the mark costs nothing and proves a line is the deploy's);
+ ``onboot``: ``lxc.start.auto``; ``hostname``: ``lxc.uts.name``; ``nesting``: ``lxc.include``
  of LXC's ``nesting.conf``;
+ ``net0``: a veth on the bridge it names (``lxc.net.0.*``), unless ``lxc_config`` has
  ``lxc.net.0.*`` lines: those win.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from pve_sglang.config.settings import LxcView, SettingsError

USERNS_INCLUDE = "lxc.include = /usr/share/lxc/config/userns.conf"
NESTING_INCLUDE = "lxc.include = /usr/share/lxc/config/nesting.conf"
MOUNT_MARK = "x-pve-sglang"
#: Ids a container maps: 0..65535, as Proxmox maps them.
IDMAP_SIZE = 65536
#: root's range when /etc/subuid has none, as Proxmox ships it.
DEFAULT_SUBID = (100000, IDMAP_SIZE)
#: Keys the settings set by key (one value each); the lxc_config lines may not set them.
SETTING_KEYS = ("lxc.uts.name", "lxc.start.auto", "lxc.idmap")
#: cgroup limit keys (without ``lxc.cgroup2.``/``lxc.cgroup.``), by cgroup version.
LIMIT_KEYS = {
    "v2": ("cpuset.cpus", "memory.max", "memory.swap.max"),
    "v1": ("cpuset.cpus", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
}
#: net0 keys with a meaning on plain LXC (Proxmox's others: firewall, rate, trunks, ...).
LXC_NET_KEYS = ("name", "bridge", "hwaddr", "mtu", "ip", "gw", "ip6", "gw6", "tag", "type")
#: systemd units that manage network interfaces; in a container sharing the host's network
#: they would manage the host's (stopping the container ran ``ifdown`` on the host's eth0).
NETWORK_MANAGERS = (
    "networking.service",
    "ifup@.service",
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
    "NetworkManager.service",
    "dhcpcd.service",
    "connman.service",
)
SHARED_NETWORK_DROPIN = "pve-sglang-shared-network.conf"
SHARED_NETWORK_TEXT = (
    "# pve-sglang: this container shares the host's network namespace; the host manages its\n"
    "# interfaces, so this unit must not run here.\n"
    "[Unit]\nConditionVirtualization=!container\n"
)


@dataclass(frozen=True)
class HostLimits:
    """What the host can limit (facts.lxc_host.CgroupLimits)."""

    version: str  # "v2", or "v1" for a v1 or hybrid host (LXC applies the v1 controllers)
    cpus: int
    swap_accounting: bool

    @classmethod
    def of(cls, info: Mapping) -> HostLimits:
        version = "v2" if info.get("version") in (None, "v2") else "v1"
        return cls(version, int(info.get("cpus") or 1), bool(info.get("swap_accounting")))

    @property
    def prefix(self) -> str:
        return "lxc.cgroup2." if self.version == "v2" else "lxc.cgroup."


def subid_base(ranges: Mapping[str, list[tuple[int, int]]]) -> int | None:
    """The first start that both root's uid and gid ranges give IDMAP_SIZE ids from."""
    for start, count in ranges.get("uid", []):
        if count >= IDMAP_SIZE and any(
            g_start <= start and start + IDMAP_SIZE <= g_start + g_count
            for g_start, g_count in ranges.get("gid", [])
        ):
            return start
    return None


def idmap_lines(base: int) -> list[str]:
    return [f"lxc.idmap = {kind} 0 {base} {IDMAP_SIZE}" for kind in ("u", "g")]


def cpuset(cores: int, host_cpus: int) -> str:
    """CPUs 0..N-1 of the host for CORES cores (all of them when it has fewer)."""
    last = min(cores, host_cpus) - 1
    return "0" if last == 0 else f"0-{last}"


def limits(lxc: LxcView, host: HostLimits) -> dict[str, str]:
    """The cgroup limits of the settings, ``{key: value}`` as ``lxc-cgroup`` takes them."""
    values = {"cpuset.cpus": cpuset(lxc.cores, host.cpus)}
    if host.version == "v2":
        values["memory.max"] = f"{lxc.memory_mib}M"
        values["memory.swap.max"] = f"{lxc.swap_mib}M"
    else:
        values["memory.limit_in_bytes"] = f"{lxc.memory_mib}M"
        if host.swap_accounting:
            values["memory.memsw.limit_in_bytes"] = f"{lxc.memory_mib + lxc.swap_mib}M"
    return values


def limit_lines(lxc: LxcView, host: HostLimits) -> list[str]:
    return [f"{host.prefix}{key} = {value}" for key, value in limits(lxc, host).items()]


def net0_items(net0: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in net0.split(","))


def hwaddr(container: str) -> str:
    """A stable MAC for CONTAINER (LXC's own 00:16:3e prefix), so DHCP keeps its lease."""
    digest = hashlib.sha256(container.encode()).hexdigest()
    return "00:16:3e:" + ":".join(digest[i:i + 2] for i in (0, 2, 4))


def network_lines(net0: str, container: str) -> list[str]:
    """``net0`` (Proxmox's syntax) as a veth on its bridge: ``lxc.net.0.*`` lines.
    ``ip=dhcp``/``ip6=auto|dhcp`` leave addressing to the container's own DHCP client."""
    items = net0_items(net0)
    lines = [
        "lxc.net.0.type = veth",
        f"lxc.net.0.link = {items['bridge']}",
        f"lxc.net.0.name = {items['name']}",
        "lxc.net.0.flags = up",
        f"lxc.net.0.hwaddr = {items.get('hwaddr', hwaddr(container))}",
    ]
    if "mtu" in items:
        lines.append(f"lxc.net.0.mtu = {items['mtu']}")
    if "tag" in items:
        lines.append(f"lxc.net.0.veth.vlan.id = {items['tag']}")
    for family, ip_key, gw_key in (("ipv4", "ip", "gw"), ("ipv6", "ip6", "gw6")):
        if items.get(ip_key, "dhcp") not in ("dhcp", "auto", "manual"):
            lines.append(f"lxc.net.0.{family}.address = {items[ip_key]}")
        if gw_key in items:
            lines.append(f"lxc.net.0.{family}.gateway = {items[gw_key]}")
    return lines


def sets_network(lxc_config: Iterable[str]) -> bool:
    """Whether the ``lxc_config`` lines describe interface 0 (then they win over net0)."""
    return any(line.split("=", 1)[0].strip().startswith("lxc.net.0.") for line in lxc_config)


def shares_host_network(lines: Iterable[str]) -> bool:
    """Whether config LINES put interface 0 in the host's network namespace (type none)."""
    return any(re.fullmatch(r"lxc\.net\.0\.type\s*=\s*none", line.strip()) for line in lines)


def mount_lines(lxc: LxcView) -> list[str]:
    return [
        f"lxc.mount.entry = {m.host_path} {m.path.lstrip('/')} none "
        f"bind{',ro' if m.read_only else ''},create=dir,{MOUNT_MARK} 0 0"
        for m in lxc.all_mounts
    ]


def config_lines(lxc: LxcView, hostname: str, container: str, idmap_base: int | None,
                 lxc_config: list[str]) -> list[str]:
    """The lines the settings give the container config, but the cgroup limits (restart
    needed for a change): user namespace first (its include resets the device rules that
    passthrough adds later), then name, autostart, nesting, network, mounts."""
    lines = []
    if idmap_base is not None:
        lines += [USERNS_INCLUDE, *idmap_lines(idmap_base)]
    lines += [f"lxc.uts.name = {hostname}", f"lxc.start.auto = {int(lxc.onboot)}"]
    if lxc.nesting:
        lines.append(NESTING_INCLUDE)
    if not sets_network(lxc_config):
        lines += network_lines(lxc.net0, container)
    return lines + mount_lines(lxc)


def _key(line: str) -> str:
    return line.split("=", 1)[0].strip()


def owned_by_container_settings(idmap_base: int | None, lxc_config: list[str]) -> Callable[[str], bool]:
    """A predicate for the lines ``config_lines`` owns, whatever their values: the keys it
    sets, its own id map (the mapping of id 0 into root's range; a user's finer map is not
    recognised), the two includes, mounts carrying MOUNT_MARK, and interface 0 unless
    ``lxc_config`` describes it (``owned_by_settings`` owns it then)."""
    network = not sets_network(lxc_config)
    ours = set(idmap_lines(idmap_base)) if idmap_base is not None else set()

    def owned(line: str) -> bool:
        text = line.strip()
        if not text or text.startswith("#") or "=" not in text:
            return False
        key = _key(text)
        normal = f"{key} = {' '.join(text.split('=', 1)[1].split())}"
        if key == "lxc.idmap":
            return normal in ours
        if key in SETTING_KEYS or normal in (USERNS_INCLUDE, NESTING_INCLUDE):
            return True
        if key == "lxc.mount.entry":
            options = text.split("=", 1)[1].split()
            return len(options) >= 4 and MOUNT_MARK in options[3].split(",")
        return network and key.startswith("lxc.net.0.")

    return owned


def owned_by_limits(line: str) -> bool:
    """Lines of the cgroup limit keys, of either cgroup version (a host moved to v2 gets its
    limits rewritten in v2 keys)."""
    key = _key(line.strip())
    return any(
        key == f"{prefix}{name}"
        for prefix in ("lxc.cgroup2.", "lxc.cgroup.")
        for names in LIMIT_KEYS.values()
        for name in names
    )


def idmap_of(config: Iterable[str]) -> list[str]:
    """The ``lxc.idmap`` lines of an existing config: none means a privileged container."""
    return [line.strip() for line in config if _key(line.strip()) == "lxc.idmap"]


def rootfs_dir(config: Iterable[str], default: str) -> str:
    """Where the container's files are, from ``lxc.rootfs.path`` (``dir:`` or a plain path;
    an overlay's upper layer); DEFAULT when the config does not say."""
    for line in config:
        if _key(line.strip()) == "lxc.rootfs.path":
            value = line.split("=", 1)[1].strip()
            if value.startswith("overlay:") or value.startswith("overlayfs:"):
                return value.split(":")[-1]
            return value.removeprefix("dir:")
    return default


def bytes_of(value: str) -> int | None:
    """A cgroup memory value (``4096M``, ``4294967296``) in bytes; None for ``max``."""
    match = re.fullmatch(r"(\d+)([KMG]?)", value.strip())
    if not match:
        return None
    return int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2)]


def cpu_list(value: str) -> set[int]:
    cpus: set[int] = set()
    for part in value.strip().split(","):
        if "-" in part:
            low, high = part.split("-")
            cpus.update(range(int(low), int(high) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def same_limit(key: str, current: str | None, wanted: str) -> bool:
    """Whether a container's current cgroup value is the wanted one (units normalised)."""
    if current is None:
        return False
    if key == "cpuset.cpus":
        return cpu_list(current) == cpu_list(wanted)
    return bytes_of(current) == bytes_of(wanted)


def check_settings(where: str, lxc: LxcView, user_set: Iterable[str],
                   lxc_config: list[str]) -> None:
    """Refuse, before any change, container settings a plain LXC host cannot honour: a
    setting with no meaning there (set by the user: the defaults are Proxmox's), a net0 key
    LXC has no form for, an unprivileged container sharing the host's network, and
    lxc_config lines for keys the settings set (mount paths never hold whitespace, which an
    LXC mount entry would split on: the field rule refuses it everywhere)."""
    for field in ("rootfs_storage", "rootfs_size_gib"):
        if field in user_set:
            raise SettingsError(
                f"{where}: field '{field}' has no meaning on plain LXC (platform lxc): the "
                "rootfs is a folder under lxc_path, with no storage and no size; remove the field"
            )
    network_by_config = sets_network(lxc_config)
    items = net0_items(lxc.net0)
    if not network_by_config:
        unknown = [key for key in items if key not in LXC_NET_KEYS]
        if unknown:
            raise SettingsError(
                f"{where}: field 'net0' = {lxc.net0!r}: key {unknown[0]!r} has no meaning on plain "
                f"LXC; allowed keys there: {', '.join(LXC_NET_KEYS)}"
            )
        if "bridge" not in items or items.get("type", "veth") != "veth":
            raise SettingsError(
                f"{where}: field 'net0' = {lxc.net0!r}: plain LXC needs a veth on a bridge; "
                "allowed: name=...,bridge=... (e.g. 'name=eth0,bridge=lxcbr0,ip=dhcp'), or "
                "lxc.net.0.* lines in lxc_config"
            )
    if lxc.unprivileged and shares_host_network(lxc_config):
        raise SettingsError(
            f"{where}: field 'lxc_config' has 'lxc.net.0.type = none' (the host's network "
            "namespace), which an unprivileged container cannot use (its user namespace cannot "
            "mount sysfs there); allowed: its own network (net0, the default), or "
            "unprivileged: false"
        )
    limit_keys = {prefix + key for prefix in ("lxc.cgroup2.", "lxc.cgroup.")
                  for keys in LIMIT_KEYS.values() for key in keys}
    by_setting = {"lxc.uts.name": "hostname", "lxc.start.auto": "onboot",
                  "lxc.idmap": "unprivileged"}
    for line in lxc_config:
        key = _key(line)
        setting = by_setting.get(key) or ("cores, memory_mib, swap_mib" if key in limit_keys else None)
        if setting:
            raise SettingsError(
                f"{where}: field 'lxc_config' line {line!r}: {key} is set from {setting} on "
                f"plain LXC; allowed: set {setting} instead"
            )
