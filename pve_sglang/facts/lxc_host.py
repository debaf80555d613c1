"""
Facts of a plain LXC host that decide how container settings become LXC config: the cgroup
limits it can apply, root's subordinate id ranges (unprivileged containers), its network
bridges, and the cgroup values a running container has now; ``LxcHostState`` reads several of
them, for every container of the host, in one command.
"""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.facts.files import FileContents
from typing_extensions import override

from pve_sglang.facts.one_read import ContainerState, ReadPart
from pve_sglang.facts.pve import LxcContainerStatus
from pve_sglang.facts.system import CgroupVersion, parse_cgroup_version


class CgroupLimitsInfo(TypedDict):
    version: str | None  # "v2", "hybrid", "v1" (CgroupVersion)
    cpus: int  # CPUs this host offers (nproc)
    swap_accounting: bool  # cgroup v1 memory.memsw.* exists (v2: memory.swap.max always)


def parse_cgroup_limits(lines: list[str]) -> CgroupLimitsInfo:
    """``stat -fc %T`` lines of the cgroup mounts, then ``cpus: N`` and ``memsw: yes|no``."""
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    stats = [line for line in lines if ": " not in line]
    cpus = fields.get("cpus", "").strip()
    return {
        "version": parse_cgroup_version(stats),
        "cpus": int(cpus) if cpus.isdigit() else 1,
        "swap_accounting": fields.get("memsw", "").strip() == "yes",
    }


class CgroupLimits(FactBase[CgroupLimitsInfo]):
    """
    Returns what a plain LXC host can limit: ``version`` of the cgroup hierarchy (on a
    ``"hybrid"`` host the v1 controllers apply and LXC ignores ``lxc.cgroup2.*`` keys),
    ``cpus`` (``nproc``), and ``swap_accounting`` (cgroup v1 without ``swapaccount=1`` has no
    ``memory.memsw.*``, and an ``lxc.cgroup.memory.memsw.*`` line would stop the container).
    """

    @override
    def command(self) -> str:
        return (
            f"{CgroupVersion().command()}; "
            'echo "cpus: $(nproc)"; '
            "if [ -e /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes ]; then echo 'memsw: yes'; "
            "else echo 'memsw: no'; fi"
        )

    @override
    def process(self, output: list[str]) -> CgroupLimitsInfo:
        return parse_cgroup_limits(output)


def parse_subids(lines: list[str]) -> dict[str, list[tuple[int, int]]]:
    """``uid NAME:START:COUNT`` / ``gid ...`` lines -> root's ranges, by ``uid``/``gid``."""
    ranges: dict[str, list[tuple[int, int]]] = {"uid": [], "gid": []}
    for line in lines:
        kind, _, entry = line.strip().partition(" ")
        parts = entry.split(":")
        if kind in ranges and len(parts) == 3 and parts[0] in ("root", "0"):
            if parts[1].isdigit() and parts[2].isdigit():
                ranges[kind].append((int(parts[1]), int(parts[2])))
    return ranges


class RootSubIds(FactBase[dict[str, list[tuple[int, int]]]]):
    """
    Returns root's subordinate id ranges from ``/etc/subuid`` and ``/etc/subgid``:
    ``{"uid": [(start, count), ...], "gid": [...]}`` (empty lists when the files or entries
    are missing). An unprivileged container maps its ids 0..65535 into one of them.
    """

    @override
    def command(self) -> str:
        return (
            "for kind in uid gid; do [ -r /etc/sub$kind ] && "
            "sed -n \"s/^/$kind /p\" /etc/sub$kind; done; true"
        )

    @override
    def process(self, output: list[str]) -> dict:
        return parse_subids(output)


class NetworkBridges(FactBase[list]):
    """Returns the names of the host's network bridges (``/sys/class/net/*/bridge``)."""

    @override
    def command(self) -> str:
        return (
            "for dev in /sys/class/net/*; do [ -d \"$dev/bridge\" ] && basename \"$dev\"; "
            "done; true"
        )

    @override
    def process(self, output: list[str]) -> list:
        return sorted(line.strip() for line in output if line.strip())


#: Where lxc-net keeps its state: ``network_up`` while it runs, and its dnsmasq's pid.
LXC_NET_RUN = "/run/lxc"
#: True (exit 0) when the pid in lxc-net's pid file is a live dnsmasq: a pid kept over a
#: restart names another process, and a killed daemon no init reaps stays a zombie.
LXC_NET_DNSMASQ_ALIVE = (
    f"pid=$(cat {LXC_NET_RUN}/dnsmasq.pid 2>/dev/null); [ -n \"$pid\" ] && "
    "awk '/^Name:/ {name = $2} /^State:/ {state = $2} "
    "END {exit !(name == \"dnsmasq\" && state != \"Z\")}' /proc/$pid/status 2>/dev/null"
)


class LxcNetState(FactBase[str]):
    """
    Returns the state of the ``lxc`` package's ``lxc-net``: ``serving`` (it is up and its
    dnsmasq, DHCP and DNS of ``lxcbr0``, runs), ``stale`` (it says it is up but its dnsmasq is
    gone: a crash, or ``/run`` kept over a restart of the machine) or ``down``.
    """

    @override
    def command(self) -> str:
        return (
            f"if [ -f {LXC_NET_RUN}/network_up ]; then "
            f"if {LXC_NET_DNSMASQ_ALIVE}; then echo serving; else echo stale; fi; "
            "else echo down; fi"
        )

    @override
    def process(self, output: list[str]) -> str:
        return output[0].strip() if output else "down"


class LxcCgroupValues(FactBase[dict]):
    """
    Returns the current values of cgroup KEYS (``memory.max``, ``cpuset.cpus``, ...) of
    running plain LXC container CONTAINER (``lxc-cgroup``), ``{key: value}``; a key LXC
    cannot read is left out.
    """

    @override
    def command(self, container: str, lxc_path: str, keys: list[str]) -> StringCommand:
        parts: list = []
        for key in keys:
            parts += [
                "printf '%s: %s\\n'", QuoteString(key),
                StringCommand('"$(lxc-cgroup -P', QuoteString(lxc_path), "-n", QuoteString(container),
                              QuoteString(key), '2>/dev/null)";'),
            ]
        return StringCommand(*parts, "true")

    @override
    def process(self, output: list[str]) -> dict:
        values = {}
        for line in output:
            key, sep, value = line.partition(": ")
            if sep and value.strip():
                values[key.strip()] = value.strip()
        return values


class ExistingFiles(FactBase[list]):
    """Returns which of PATHS exist as regular files (a symlink is not one)."""

    @override
    def command(self, paths: list[str]) -> StringCommand:
        return StringCommand("for p in", *(QuoteString(p) for p in paths),
                             '; do [ -f "$p" ] && [ ! -L "$p" ] && printf "%s\\n" "$p"; done; true')

    @override
    def process(self, output: list[str]) -> list:
        return [line for line in output if line]


class HostPart(ReadPart):
    """What one read of a plain LXC host can hold: each the value of one fact (``HOST_PARTS``)."""

    STATUS = "status"
    CONFIG = "config"
    FILES = "files"
    CGROUP = "cgroup"
    LIMITS = "limits"


#: The parts one read of a plain LXC host can hold: kind -> (fact, its arguments' names).
HOST_PARTS: dict[HostPart, tuple[type[FactBase], tuple[str, ...]]] = {
    HostPart.STATUS: (LxcContainerStatus, ("container", "lxc_path")),
    HostPart.CONFIG: (FileContents, ("path",)),
    HostPart.FILES: (ExistingFiles, ("paths",)),
    HostPart.CGROUP: (LxcCgroupValues, ("container", "lxc_path", "keys")),
    HostPart.LIMITS: (CgroupLimits, ()),
}


class LxcHostState(ContainerState):
    """
    Returns each part's section of output, ``{index: (lines, exit status)}``, for PARTS
    (``((kind, args), ...)``, kinds of ``HOST_PARTS``: every container's status, config, the
    network guard's files and cgroup values, the host's cgroup limits) read in one command on
    the host; ``part_values(parts, raw, HOST_PARTS)`` turns them into each fact's own value.
    """

    PARTS = HOST_PARTS
