"""
Facts about Proxmox VE and its containers (``pct``, ``pveam``, the ``pve-container`` package),
and about plain LXC containers (``lxc-info``) for hosts without Proxmox.

A container that does not exist is an answer (``None``), not an error: the deploy creates it.
"""

from __future__ import annotations

import re

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang.pve_releases import VERSION_COMMAND, parse_dpkg_version
from pve_sglang.runtime.pyinfra_private import joined

# `pct` for a VMID without a config on this node: "Configuration file 'nodes/pve/lxc/105.conf'
# does not exist" (stderr, exit 255 or 2). The commands below let only this error through.
MISSING_CT_MARKER = "does not exist"


def _vmid(vmid: int | str) -> int:
    value = int(vmid)
    if not 100 <= value <= 999_999_999:
        raise ValueError(f"not a Proxmox VMID: {vmid!r}")
    return value


def _missing_ok(command: str) -> str:
    """
    Run pct COMMAND with stderr merged; exit 0 when it failed only because the CT is missing,
    and print nothing when pct itself is missing (not a Proxmox VE host).
    """
    return (
        "command -v pct >/dev/null 2>&1 || exit 0; "
        f"out=$({command} 2>&1); rc=$?; printf '%s\\n' \"$out\"; "
        f'case "$out" in *"{MISSING_CT_MARKER}"*) exit 0;; esac; exit $rc'
    )


def _is_missing(lines: list[str]) -> bool:
    return any(
        MISSING_CT_MARKER in line and line.startswith("Configuration file") for line in lines
    )


class PveContainerVersion(FactBase[str | None]):
    """
    Returns the installed version of the ``pve-container`` package (``"5.2.3"``), on which
    every rule of ``pve_sglang.pve_releases`` is keyed (``devN`` passthrough, ``pct exec
    --keep-env``, device hot-plug ...), or ``None`` when it is not installed (not a Proxmox VE
    host). An answer of several lines comes back whole, for ``pve_releases.answer_problem`` to
    refuse.
    """

    @override
    def command(self) -> str:
        return VERSION_COMMAND

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_dpkg_version(output)


def parse_pct_status(lines: list[str]) -> str | None:
    """``status: running`` -> ``"running"``; the missing-config error -> None."""
    if _is_missing(lines):
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "status" and value.strip():
            return value.strip()
    return None


class PctStatus(FactBase[str | None]):
    """
    Returns the state of Proxmox container VMID as ``pct status`` prints it (``"running"``,
    ``"stopped"``), or ``None`` when no container VMID exists on this node (or pct is missing).
    Other pct errors fail the fact.
    """

    @override
    def command(self, vmid: int | str) -> str:
        return _missing_ok(f"pct status {_vmid(vmid)}")

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_pct_status(output)


PctConfigValue = str | list[tuple[str, str]]

_PCT_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_.\-]*):(?: (.*))?$")


def parse_pct_config(lines: list[str]) -> dict[str, PctConfigValue] | None:
    """
    ``key: value`` lines of ``pct config`` (keys sorted, raw ``lxc.*`` lines last). Values stay
    strings (``dev0``, ``mp0``, ``net0`` too: their own format is ``k=v,...``); the raw ``lxc.*``
    lines, which repeat, become ``config["lxc"]``: a list of (key, value) pairs in order.
    ``description`` comes URL-encoded (``%0A`` for newlines) and is left so.
    """
    if _is_missing(lines):
        return None
    config: dict[str, PctConfigValue] = {}
    raw: list[tuple[str, str]] = []
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        match = _PCT_KEY.match(line)
        if not match:
            continue
        key, value = match.group(1), (match.group(2) or "").strip()
        if key.startswith("lxc."):
            raw.append((key, value))
        else:
            config[key] = value
    if raw:
        config["lxc"] = raw
    return config


class PctConfig(FactBase["dict[str, PctConfigValue] | None"]):
    """
    Returns the configuration of Proxmox container VMID from ``pct config``: a dict of its keys
    (``arch``, ``cores``, ``dev0``, ``mp0``, ``net0``, ``rootfs``, ``unprivileged``, ...) with
    string values, the raw ``lxc.*`` lines as an ordered list of (key, value) pairs under
    ``"lxc"``, or ``None`` when no container VMID exists on this node.

    .. code:: python

        {"arch": "amd64", "dev0": "/dev/nvidia0,mode=0666", "unprivileged": "1",
         "lxc": [("lxc.cgroup2.devices.allow", "c 195:* rwm")]}
    """

    @override
    def command(self, vmid: int | str) -> str:
        return _missing_ok(f"pct config {_vmid(vmid)}")

    @override
    def process(self, output: list[str]) -> dict[str, PctConfigValue] | None:
        return parse_pct_config(output)


_PENDING_LINE = re.compile(r"^(cur|new|del) ([A-Za-z][A-Za-z0-9_.\-]*): ?(.*)$")


def parse_pct_pending(lines: list[str]) -> dict[str, tuple[str, str]] | None:
    """The keys of ``pct pending`` with a change waiting for a restart: ``{key: (action,
    value)}``, action ``new`` (the value to come) or ``del`` (the value going). pct prints
    every key with pve-guest-common's ``format_pending``: ``cur KEY: VALUE`` for one in force,
    ``new KEY: VALUE`` for a pending value, ``del KEY: VALUE`` for a pending deletion. The
    missing-config error -> None."""
    if _is_missing(lines):
        return None
    pending: dict[str, tuple[str, str]] = {}
    for line in lines:
        match = _PENDING_LINE.match(line.rstrip("\n"))
        if match and match.group(1) != "cur":
            pending[match.group(2)] = (match.group(1), match.group(3).strip())
    return pending


class PctPending(FactBase["dict[str, tuple[str, str]] | None"]):
    """
    Returns the changes of Proxmox container VMID's config still waiting for a restart, from
    ``pct pending``: ``{"dev0": ("del", "/dev/nvidia1,mode=0666")}`` (``pct config`` shows
    them as done), ``{}`` when none, or ``None`` when no container VMID exists on this node.
    """

    @override
    def command(self, vmid: int | str) -> str:
        return _missing_ok(f"pct pending {_vmid(vmid)}")

    @override
    def process(self, output: list[str]) -> dict[str, tuple[str, str]] | None:
        return parse_pct_pending(output)


def parse_pveam_list(lines: list[str]) -> list[str]:
    """``pveam list STORAGE``: a ``NAME SIZE`` header, then ``local:vztmpl/FILE  SIZE`` rows."""
    volids = []
    for line in lines:
        fields = line.split()
        if fields and ":" in fields[0] and fields[0] != "NAME":
            volids.append(fields[0])
    return volids


_STORAGE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9\-_.]*$")


class PveamTemplates(FactBase[list[str]]):
    """
    Returns the volume ids of the container templates on STORAGE, from ``pveam list STORAGE``
    (e.g. ``["local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"]``); ``[]`` when there are
    none or pveam is missing.
    """

    @override
    def command(self, storage: str = "local") -> StringCommand:
        if not _STORAGE_ID.match(storage):
            raise ValueError(f"not a storage id: {storage!r}")
        listing = StringCommand("pveam list", QuoteString(storage))
        return joined("if command -v pveam >/dev/null 2>&1; then ", listing, "; fi")

    @staticmethod
    @override
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        return parse_pveam_list(output)


def _lxc_path_args(lxc_path: str | None) -> list:
    return ["-P", QuoteString(lxc_path)] if lxc_path else []


def parse_lxc_info_state(lines: list[str]) -> str | None:
    """``State:          RUNNING`` -> ``"RUNNING"``; a missing container -> None."""
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "State" and value.strip():
            return value.strip()
    return None


class LxcContainerStatus(FactBase[str | None]):
    """
    Returns the state of plain LXC container CONTAINER (``"RUNNING"``, ``"STOPPED"``, ``"FROZEN"``...)
    from ``lxc-info -s``, or ``None`` when there is no such container (or no lxc-info). LXC_PATH
    is the container folder (``lxc-info -P``; default ``/var/lib/lxc``). (The argument is not
    called ``name``: pyinfra reserves that for operations' global arguments.)
    """

    @override
    def command(self, container: str, lxc_path: str | None = None) -> StringCommand:
        # lxc-info prints "NAME doesn't exist" on stderr and exits 1 for a missing container.
        return StringCommand(
            "if command -v lxc-info >/dev/null 2>&1; then lxc-info", *_lxc_path_args(lxc_path),
            "-s -n", QuoteString(container), "2>/dev/null || true; fi",
        )

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_lxc_info_state(output)
