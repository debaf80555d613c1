"""
Facts about the machine itself that decide how GPUs can be shared: virtualisation, the IOMMU and
PCIe ACS (which decide whether GPU peer-to-peer works), and the cgroup hierarchy (which decides
whether ``lxc.cgroup2.*`` device rules apply).
"""

from __future__ import annotations

import re
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


def parse_detect_virt(lines: list[str]) -> str | None:
    value = "".join(lines).strip()
    return value or None


class VirtualMachineType(FactBase[str | None]):
    """
    Returns ``systemd-detect-virt --vm``: the hypervisor this machine runs under (``"kvm"``,
    ``"qemu"``, ...), ignoring containers, or ``"none"`` on bare metal. A GPU host that is itself
    a VM gets its GPUs through VFIO and loses the real PCIe topology, and with it P2P. Without
    systemd-detect-virt (minimal images) it falls back to the x86 CPU flag: ``"hypervisor"``
    when ``/proc/cpuinfo`` has it, else ``"none"``.
    """

    @override
    def command(self) -> str:
        return (
            "if command -v systemd-detect-virt >/dev/null 2>&1; then "
            "systemd-detect-virt --vm 2>/dev/null || true; "
            "elif grep -qw hypervisor /proc/cpuinfo 2>/dev/null; then echo hypervisor; "
            "else echo none; fi"
        )

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_detect_virt(output)


class AcsDevice(TypedDict):
    bus_id: str | None
    flags: dict[str, bool]


class IommuAcsInfo(TypedDict):
    lspci: bool
    acs_devices: list[AcsDevice]
    src_valid: list[str]
    p2p_redirect: list[str]
    cmdline: dict[str, str]
    iommu_passthrough: bool


_BUS_LINE = re.compile(r"^([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]|[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_FLAG = re.compile(r"([A-Za-z]+)([+-])")
_IOMMU_ARGS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "pcie_acs_override")


def parse_iommu_acs(lines: list[str]) -> IommuAcsInfo:
    """Bus lines and ``ACSCtl:`` lines of ``lspci -D -vvv``, then ``lspci:`` and ``cmdline:``."""
    info = IommuAcsInfo(
        lspci=False,
        acs_devices=[],
        src_valid=[],
        p2p_redirect=[],
        cmdline={},
        iommu_passthrough=False,
    )
    bus_id: str | None = None
    for line in lines:
        if line.startswith("lspci: "):
            info["lspci"] = line.split(":", 1)[1].strip() == "yes"
            continue
        if line.startswith("cmdline: "):
            for arg in line.split(":", 1)[1].split():
                key, _, value = arg.partition("=")
                if key in _IOMMU_ARGS:
                    info["cmdline"][key] = value
            continue
        match = _BUS_LINE.match(line)
        if match:
            bus_id = match.group(1)
            continue
        stripped = line.strip()
        if stripped.startswith("ACSCtl:"):
            # Without a bus line before it (`lspci -vvv | grep ACSCtl`), the device is unknown.
            flags = {name: sign == "+" for name, sign in _FLAG.findall(stripped[len("ACSCtl:"):])}
            info["acs_devices"].append(AcsDevice(bus_id=bus_id, flags=flags))
            label = bus_id or "?"
            if flags.get("SrcValid"):
                info["src_valid"].append(label)
            if flags.get("ReqRedir") or flags.get("CmpltRedir"):
                info["p2p_redirect"].append(label)
            bus_id = None  # one ACS capability per function
    cmdline = info["cmdline"]
    info["iommu_passthrough"] = cmdline.get("iommu") == "pt" or cmdline.get("iommu.passthrough") == "1"
    return info


class IommuAcs(FactBase[IommuAcsInfo]):
    """
    Returns the PCIe Access Control Services state and the kernel's IOMMU arguments: for each
    PCI device whose ACS control ``lspci -vvv`` shows, its bus id and flags; the bus ids with
    ``SrcValid+`` (``src_valid``) and with ``ReqRedir+``/``CmpltRedir+`` (``p2p_redirect``: such
    bridges send GPU peer-to-peer traffic up to the root complex, where the IOMMU may slow or
    block it); the ``iommu=``, ``intel_iommu=``, ``amd_iommu=``, ``iommu.passthrough=`` and
    ``pcie_acs_override=`` arguments of ``/proc/cmdline``; and whether the IOMMU is in passthrough
    mode (``iommu=pt``). A bus id is ``"?"`` for an ACSCtl line with no device line before it. ``lspci`` is ``False`` when lspci is not installed; it needs root to show
    the ACS capability.
    """

    @override
    def command(self) -> str:
        return (
            "if command -v lspci >/dev/null 2>&1; then echo 'lspci: yes'; "
            "lspci -D -vvv 2>/dev/null | grep -E '^[0-9a-fA-F]{4}:|ACSCtl:'; "
            "else echo 'lspci: no'; fi; "
            'echo "cmdline: $(cat /proc/cmdline)"'
        )

    @override
    def process(self, output: list[str]) -> IommuAcsInfo:
        return parse_iommu_acs(output)


def parse_cgroup_version(lines: list[str]) -> str | None:
    """Lines of ``stat -fc %T /sys/fs/cgroup`` then, if it exists, of ``.../unified``."""
    values = [line.strip() for line in lines if line.strip()]
    if not values:
        return None
    if values[0] == "cgroup2fs":
        return "v2"
    if values[0] == "tmpfs":
        return "hybrid" if "cgroup2fs" in values[1:] else "v1"
    return None


class CgroupVersion(FactBase[str | None]):
    """
    Returns the cgroup hierarchy: ``"v2"`` (pure cgroup2, as Proxmox VE 7+ runs: the
    ``lxc.cgroup2.devices.allow`` rules apply), ``"hybrid"`` (a tmpfs of v1 controllers plus
    ``/sys/fs/cgroup/unified``: the devices controller is v1, so LXC ignores cgroup2 device
    rules), ``"v1"``, or ``None`` when ``/sys/fs/cgroup`` is something else.
    """

    @override
    def command(self) -> str:
        return (
            "stat -fc %T /sys/fs/cgroup; "
            "[ -d /sys/fs/cgroup/unified ] && stat -fc %T /sys/fs/cgroup/unified; true"
        )

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_cgroup_version(output)


class InitramfsOlderThan(FactBase[list[str]]):
    """
    Returns the initramfs images (``initrd.img-*`` in BOOT) not newer than PATH: images an
    ``update-initramfs`` has not rebuilt since PATH (a modprobe option) was written. Empty when
    every image is newer, or PATH does not exist.
    """

    @override
    def command(self, path: str, boot: str = "/boot") -> StringCommand:
        return StringCommand("find", QuoteString(boot), "-maxdepth 1 -name 'initrd.img-*' ! -newer",
                             QuoteString(path), "2>/dev/null || true")

    @staticmethod
    @override
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if "/initrd.img-" in line)


class DebianArchitecture(FactBase[str | None]):
    """
    Returns the host's Debian architecture (``dpkg --print-architecture``: ``"amd64"``,
    ``"arm64"``), the names Proxmox's container templates carry; ``None`` without dpkg.
    """

    @override
    def command(self) -> str:
        return "dpkg --print-architecture 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> str | None:
        values = [line.strip() for line in output if line.strip()]
        return values[0] if values else None
