"""
The Proxmox VE releases the deploy supports and every rule that depends on the version of
their ``pve-container`` package: pure, no I/O (the one home of each rule; the connector, the
facts, preflight and the operations ask here).

Each rule is keyed on the ``pve-container`` version, not on the Proxmox release: a host of one
release moves through several pve-container versions as it is updated (an 8.1 host updated
after March 2024 has 5.0.9, and with it ``pct exec --keep-env``). ``RELEASES`` maps each
release to the pve-container version it shipped with, for the docs and the tests.

Sources: proxmox/pve-container ``debian/changelog`` and ``src/PVE/CLI/pct.pm``,
``src/PVE/LXC/Config.pm``; proxmox/pve-manager ``debian/changelog`` and ``PVE/CLI/pveam.pm``
(the commits are named at each rule and in docs/proxmox-releases.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

#: How the installed pve-container version is read on a host (``installed 5.0.8``), by the
#: ``PveContainerVersion`` fact and by the ``@pct`` connector alike.
VERSION_COMMAND = (
    "dpkg-query -W -f '${db:Status-Status} ${Version}\\n' pve-container 2>/dev/null || true"
)


#: Between the lines of an answer of several (``parse_dpkg_version``).
ANSWER_LINES_JOINED = " | "


def parse_dpkg_version(lines: list[str]) -> str | None:
    """``VERSION_COMMAND``'s output (``installed 5.0.8``): the version if installed. An answer
    of more than one line (two instances of the package, or anything else) comes back whole,
    its lines joined by ``ANSWER_LINES_JOINED``, for ``answer_problem`` to refuse: which line
    is the pct that runs cannot be told, and taking the first would decide devN, hot-plug and
    restarts on a guess."""
    answered = [line.strip() for line in lines if line.strip()]
    if len(answered) > 1:
        return ANSWER_LINES_JOINED.join(answered)
    for line in answered:
        status, _, version = line.partition(" ")
        if status == "installed" and version:
            return version
    return None


#: ``devN`` entries for host device nodes: "allow passing raw device nodes through to
#: containers" (changelog 5.0.7, Proxmox VE 8.1). Before it, raw ``lxc.*`` lines.
DEVN_FROM = "5.0.7"
#: ``pct exec --keep-env``: commit 069553d "pct: add keep-env option to the 'enter' and
#: 'exec' command" (changelog 5.0.9). Older ``pct exec`` refuses the option ("Unknown option")
#: and runs ``lxc-attach`` without ``--clear-env``: the host's environment goes in.
KEEP_ENV_FROM = "5.0.9"
#: A ``devN`` added to a running container is hot-plugged: commit c702167 "implement device
#: hotplug" (changelog 6.0.4: "hot-unplug or editing a existing device is not yet supported").
DEVN_HOTPLUG_FROM = "6.0.4"
#: ``pct create`` defaults to unprivileged (changelog 6.0.6); the deploy always passes it.
UNPRIVILEGED_DEFAULT_FROM = "6.0.6"
#: Mount points took the owner and mode of the directory already in the container (changelog
#: 6.0.19: "Make mount points inherit the uid, gid, and access mode ..."); the rootfs was
#: fixed in 6.1.0 (#7267), bind mounts in 6.1.1 (#7271: "exclude non-volume mount points,
#: like e.g. bind mounts, from attribute preservation"); 6.1.2 made it opt-in.
MOUNT_ATTRIBUTES_BROKEN = ("6.0.19", "6.1.1")  # [from, fixed)
#: Raw ``lxc.cgroup.*`` (v1) keys are warned about as deprecated (changelog 6.1.6, "they are
#: not supported and will be warned about and ignored by lxc >= 7.0"); Proxmox VE 9
#: (pve-container 6.x) has no cgroup v1 at all.
CGROUP_V1_WARNED_FROM = "6.1.6"
CGROUP_V1_GONE_FROM = "6.0.0"
#: ``pveam available`` prints the architecture as a third column: pve-manager commit f6cfb6b
#: (changelog 9.2.7), ``%-15s %-60s %s``; before, ``%-15s %s``.
PVEAM_ARCH_COLUMN_FROM_MANAGER = "9.2.7"

#: ``arch`` values of a container (``src/PVE/LXC/Config.pm``): what a template's name ends with.
ARCHES = ("amd64", "i386", "arm64", "armhf", "riscv32", "riscv64")


@dataclass(frozen=True)
class Release:
    """A Proxmox VE release and the pve-container version it shipped with."""

    name: str
    pve_container: str
    debian: str
    released: str  # pve-manager's "bump version to X.Y.0" (7.4: "7.4-1") date


#: The releases the deploy supports, oldest first; pve-container as of the release day (from
#: both repositories' debian/changelog dates).
RELEASES = (
    Release("7.4", "4.4-3", "11 bullseye", "2023-03-20"),
    Release("8.0", "5.0.3", "12 bookworm", "2023-06-21"),
    Release("8.1", "5.0.8", "12 bookworm", "2023-11-22"),
    Release("8.2", "5.0.10", "12 bookworm", "2024-04-21"),
    Release("8.3", "5.2.2", "12 bookworm", "2024-11-20"),
    Release("8.4", "5.2.6", "12 bookworm", "2025-04-09"),
    Release("9.0", "6.0.9", "13 trixie", "2025-08-04"),
    Release("9.1", "6.0.18", "13 trixie", "2025-11-18"),
    Release("9.2", "6.1.10", "13 trixie", "2026-05-20"),
)


def release(name: str) -> Release:
    """The release called NAME (``"8.1"``)."""
    for item in RELEASES:
        if item.name == name:
            return item
    raise KeyError(f"not a supported Proxmox VE release: {name!r}; "
                   f"known: {', '.join(r.name for r in RELEASES)}")


def upstream(version: str) -> Version:
    """The upstream part of a Debian version (``1:5.2.3-1`` -> 5.2.3, ``4.4-3`` -> 4.4.3:
    pve-container 4.x numbered its builds ``MAJOR.MINOR-N``, which order as a third part)."""
    text = version.split(":")[-1].split("~")[0].split("+")[0]
    if text.count("-") == 1 and text.count(".") == 1:  # 4.4-3: the build is the patch level
        text = text.replace("-", ".")
    else:
        text = text.split("-")[0]
    try:
        return Version(text)
    except InvalidVersion:
        raise ValueError(f"not a pve-container version: {version!r}") from None


_DEBIAN_VERSION = re.compile(r"[0-9][A-Za-z0-9.+~:-]*")
#: What the rules can compare, for the errors that refuse anything else.
VERSION_ALLOWED = ("a version as dpkg prints it: MAJOR.MINOR.PATCH (e.g. '5.0.8', '6.1.10') or "
                   "4.x's MAJOR.MINOR-BUILD ('4.4-3')")


def version_problem(version: str) -> str | None:
    """Why VERSION cannot be compared by the rules (a typo, ``6.1.x``), or None."""
    # Only the characters of a Debian version: packaging's Version would strip a '\r'.
    if not _DEBIAN_VERSION.fullmatch(version):
        return f"not a pve-container version; allowed: {VERSION_ALLOWED}"
    try:
        upstream(version)
    except ValueError:
        return f"not a pve-container version; allowed: {VERSION_ALLOWED}"
    return None


def answer_problem(version: str) -> str | None:
    """Why VERSION, as ``parse_dpkg_version`` read it from a host, cannot decide the rules (an
    answer of several lines, or one no rule can compare), or None."""
    if ANSWER_LINES_JOINED in version:
        count = len(version.split(ANSWER_LINES_JOINED))
        return (f"{count} lines where one is expected: ambiguous (the first would decide devN, "
                "hot-plug and restarts on a guess); `dpkg -l 'pve-container*'` on the host "
                "shows what is installed; allowed: one line, 'installed VERSION'")
    return version_problem(version)


def _at_least(version: str | None, minimum: str) -> bool:
    return version is not None and upstream(version) >= upstream(minimum)


def has_devn(version: str | None, minimum: str = DEVN_FROM) -> bool:
    """GPUs pass as ``devN`` entries (else raw ``lxc.*`` lines). MINIMUM: the host's
    ``pve_container_native_dev_min`` setting, whose default is ``DEVN_FROM``."""
    return _at_least(version, minimum)


def has_keep_env(version: str | None) -> bool:
    """``pct exec`` takes ``--keep-env 0``; None (unknown) is False: the form without the
    option works on every release."""
    return _at_least(version, KEEP_ENV_FROM)


def hotplugs_added_devn(version: str | None) -> bool:
    """A ``devN`` key added to a running container is applied at once (no restart)."""
    return _at_least(version, DEVN_HOTPLUG_FROM)


def unprivileged_by_default(version: str | None) -> bool:
    """``pct create`` without ``--unprivileged`` makes an unprivileged container."""
    return _at_least(version, UNPRIVILEGED_DEFAULT_FROM)


def mount_attributes_broken(version: str | None) -> bool:
    """Bind mount points take the owner and mode of the directory in the container (and may
    fail to start): 6.0.19 and 6.1.0."""
    low, fixed = MOUNT_ATTRIBUTES_BROKEN
    return version is not None and upstream(low) <= upstream(version) < upstream(fixed)


def cgroup_v1_gone(version: str | None) -> bool:
    """Proxmox VE 9: no cgroup v1 (``lxc.cgroup.*`` keys are ignored, warned about from 6.1.6)."""
    return _at_least(version, CGROUP_V1_GONE_FROM)


def pct_exec_words(vmid: int | str, version: str | None, path: str) -> list[str]:
    """The words that run a command in container VMID with a clean environment and PATH:
    ``pct exec VMID --keep-env 0 --`` where the option exists (``lxc-attach --clear-env``);
    before, ``pct exec VMID -- env -i PATH=... container=lxc`` (that pct runs ``lxc-attach``
    keeping the host's environment, which ``env -i`` drops inside the container, leaving what
    ``lxc-attach --clear-env`` leaves: PATH and ``container=lxc``)."""
    if has_keep_env(version):
        return ["pct", "exec", str(vmid), "--keep-env", "0", "--"]
    return ["pct", "exec", str(vmid), "--", "env", "-i", f"PATH={path}", "container=lxc"]


@dataclass(frozen=True)
class DeviceChange:
    """What a ``pct set`` of ``devN`` keys does to a container: keys ADDED (not in its
    config), EDITED (in it, another value) and REMOVED (``--delete``)."""

    added: tuple[str, ...] = ()
    edited: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.edited or self.removed)


@dataclass(frozen=True)
class RestartDecision:
    """Whether a change needs the container restarted, and why (for the plan)."""

    restart: bool
    why: str


def devn_restart(change: DeviceChange, version: str | None, running: bool) -> RestartDecision:
    """Whether CHANGE (devN keys) needs a running container restarted on pve-container
    VERSION: from 6.0.4 an added key is hot-plugged; an edit or a removal stays pending until
    a restart on every release (``vmconfig_hotplug_pending`` skips them)."""
    if not change:
        return RestartDecision(False, "unchanged")
    if not running:
        return RestartDecision(False, "applied when the container starts")
    if change.edited or change.removed:
        # A swapped GPU is a key added and one removed: the plan names both.
        done = [f"{', '.join(keys)} {verb}" for keys, verb in
                ((change.added, "added"), (change.edited, "edited"), (change.removed, "removed"))
                if keys]
        return RestartDecision(True, f"{', '.join(done)}: applied at a restart")
    added = ", ".join(change.added)
    if hotplugs_added_devn(version):
        return RestartDecision(False, f"{added} added: hot-plugged, no restart (pve-container "
                                      f"{version} >= {DEVN_HOTPLUG_FROM})")
    return RestartDecision(True, f"{added} added: applied at a restart (pve-container "
                                 f"{version or 'unknown'} < {DEVN_HOTPLUG_FROM} hot-plugs no "
                                 "device)")


_TEMPLATE_ARCH = re.compile(r"_([a-z0-9]+)\.tar\.[a-z0-9]+$")


def template_arch(name: str, column: str | None = None) -> str | None:
    """The architecture of template NAME: ``pveam available``'s third column where it prints
    one (pve-manager 9.2.7+, ``unknown`` when the index has none), else the name's
    ``_ARCH.tar.*`` ending (``debian-12-standard_12.7-1_amd64.tar.zst``); None when neither
    tells. ``pct.template``'s shell pipeline applies the same rule in awk."""
    if column and column != "unknown":
        return column
    match = _TEMPLATE_ARCH.search(name)
    return match.group(1) if match and match.group(1) in ARCHES else None
