"""Proxmox VE container operations, through ``pveam`` and ``pct`` on the host."""

from __future__ import annotations

import re
from collections.abc import Callable

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.files import File

from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.runtime.errors import PreflightError
from pve_sglang.runtime.pyinfra_private import joined
from pve_sglang.facts.pve import PctConfig, PctPending, PctStatus, PveamTemplates
from pve_sglang.facts.system import DebianArchitecture
from pve_sglang.pve_releases import ARCHES, DeviceChange, template_arch

TEMPLATE_SUFFIXES = (".tar.zst", ".tar.gz", ".tar.xz")


def config_path(vmid: int) -> str:
    """Where Proxmox keeps container VMID's config (``pct config`` reads it)."""
    return f"/etc/pve/lxc/{int(vmid)}.conf"


#: The host's markers of changes that wait for a container's restart (raw lxc lines, for
#: which Proxmox keeps no pending state), one file per VMID.
RESTART_MARKERS = "/var/lib/pve-sglang/restart-pending"


def restart_marker(vmid: int) -> str:
    """Container VMID's marker: written before its raw lines change (``owned.lines``), removed
    once it restarted (``power``)."""
    return f"{RESTART_MARKERS}/{int(vmid)}"


def restart_left(marker: str) -> bool:
    """MARKER is there: a run changed what it marks and ended before the restart."""
    return host.get_fact(File, path=marker) is not None


def current_config(vmid: int) -> dict | None:
    """Container VMID's config (the ``PctConfig`` fact; None when it does not exist), read once
    per run stage: an operation that changes it (``pct create``/``set``/``resize``, a write of
    ``config_path``) forgets it, ``cache.changed(config_path(vmid))``."""
    known = cache.memo(Kind.PCT_CONFIG)
    path = config_path(vmid)
    if path not in known:
        known[path] = host.get_fact(PctConfig, vmid=vmid)
    return known[path]


def _version_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def find_template(volids: list[str], storage: str, template: str,
                  arch: str | None = None) -> str | None:
    """The template volume for TEMPLATE: the exact file, or the newest whose name starts with
    it and, ARCH given, whose architecture (``template_arch``) is ARCH."""
    prefix = f"{storage}:vztmpl/"
    names = [volid[len(prefix):] for volid in volids if volid.startswith(prefix)]
    if template.endswith(TEMPLATE_SUFFIXES):
        return prefix + template if template in names else None
    matches = sorted((n for n in names if n.startswith(template)
                      and (arch is None or template_arch(n) == arch)), key=_version_key)
    return prefix + matches[-1] if matches else None


def arch_problem(template: str, arch: str | None) -> str | None:
    """Why TEMPLATE cannot be chosen on a host whose ``dpkg --print-architecture`` answered
    ARCH (None: nothing), or None: a prefix takes the newest template of the host's
    architecture, and with no architecture it would take one of any."""
    if arch or template.endswith(TEMPLATE_SUFFIXES):
        return None
    return ("`dpkg --print-architecture` answered nothing, so the newest template of any "
            f"architecture would match field 'template' = {template!r}: check dpkg on the host "
            "(`dpkg --print-architecture` prints amd64 on a PC), or give the template's file "
            "name (e.g. 'debian-12-standard_12.7-1_amd64.tar.zst')")


def host_arch(template: str, error: type[Exception] = PreflightError) -> str | None:
    """The host's architecture (``DebianArchitecture``) that TEMPLATE is chosen by; ERROR
    where ``arch_problem`` says it cannot be. The deploy asks before any change (a
    PreflightError); ``template`` and ``create`` ask again (an OperationError)."""
    arch = host.get_fact(DebianArchitecture)
    problem = arch_problem(template, arch)
    if problem:
        raise error(f"host {host.name}: {problem}; nothing was changed")
    return arch


#: The lines of ``pveam available`` whose template (column 2) starts with $P and, $A not
#: empty, whose architecture is $A: column 3 where pveam prints it (pve-manager 9.2.7+), else
#: the name's ``_ARCH.tar.*`` ending; ``pve_releases.template_arch`` in awk.
PICK_AWK = (
    'index($2, ENVIRON["P"]) == 1 { a = $3; if (a == "" || a == "unknown") { a = ""; '
    'if (match($2, /_[a-z0-9]+\\.tar\\.[a-z0-9]+$/)) { a = substr($2, RSTART + 1); '
    'sub(/\\.tar\\..*$/, "", a) } '
    f'if (index(" {" ".join(ARCHES)} ", " " a " ") == 0) a = "" }} '
    'if (ENVIRON["A"] == "" || a == ENVIRON["A"]) print $2 }'
)


@operation()
def template(storage: str, template: str):
    """
    Make sure a container template is on STORAGE (``pveam download``): an exact file name, or
    a name prefix that takes the newest matching template of the host's architecture
    (``dpkg --print-architecture``) that ``pveam available`` lists.

    + storage: the Proxmox storage that holds container templates, e.g. ``local``
    + template: a template file name (``debian-12-standard_12.7-1_amd64.tar.zst``) or a prefix
      (``debian-12-standard``); a prefix already matched by a template of the host's
      architecture on STORAGE downloads nothing

    **Example:**

    .. code:: python

        from pve_sglang.operations import pct

        pct.template(
            name="Container template debian-12-standard",
            storage="local",
            template="debian-12-standard",
        )
    """
    arch = host_arch(template, OperationError)
    present = find_template(host.get_fact(PveamTemplates, storage=storage), storage, template, arch)
    if present:
        host.noop(f"template {present} is present")
        return
    if template.endswith(TEMPLATE_SUFFIXES):
        yield StringCommand("pveam update && pveam download", QuoteString(storage),
                            QuoteString(template))
        return
    # The newest system template with this prefix and the host's architecture, as pveam
    # lists them today. The prefix is compared as text (awk's index, from the environment: no
    # regex, no escapes).
    of_arch = f" for architecture {arch}" if arch else ""
    yield StringCommand(
        "pveam update >/dev/null && T=$(pveam available --section system |",
        joined("P=", QuoteString(template)), joined("A=", QuoteString(arch or "")),
        "awk", QuoteString(PICK_AWK), "| sort -V | tail -n 1) && [ -n \"$T\" ] ||",
        "{ printf '%s\\n'",
        QuoteString(f"no template matching {template}{of_arch} in pveam available"),
        ">&2; exit 1; }; pveam download", QuoteString(storage), '"$T"',
    )


def _options(value: str) -> dict[str, str]:
    """``a,b=c,d=e`` as ``{"": "a", "b": "c", "d": "e"}`` (the bare first item under "")."""
    result = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        result[key if sep else ""] = val if sep else key
    return result


def option_subset(desired: str, current: str | None) -> bool:
    """DESIRED's options all hold in CURRENT (Proxmox adds its own, e.g. hwaddr to net0)."""
    if current is None:
        return False
    have = _options(current)
    return all(have.get(key) == value for key, value in _options(desired).items())


@operation()
def create(
    vmid: int,
    storage: str,
    template: str,
    options: dict[str, str],
    unprivileged: bool,
):
    """
    Create container VMID from the newest matching template when it does not exist yet, with
    every size and network option given and ``--unprivileged`` always explicit (newer
    pve-container releases default it to 1). It is created stopped; ``power`` starts it.

    + vmid: the container's Proxmox ID
    + storage: the storage holding the template (see ``template``)
    + template: the template file name or prefix, as given to ``template``
    + options: ``pct create`` options without the dashes (``{"cores": "32", "rootfs":
      "local-lvm:200"}``); ignored once the container exists (``config`` reconciles them)
    + unprivileged: create an unprivileged container (Proxmox cannot change this later)

    **Example:**

    .. code:: python

        from pve_sglang.operations import pct

        pct.create(
            name="Create container 105",
            vmid=105,
            storage="local",
            template="debian-12-standard",
            options={
                "hostname": "sglang-105",
                "cores": "32",
                "memory": "262144",
                "swap": "0",
                "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
                "onboot": "1",
                "rootfs": "local-lvm:200",
                "features": "nesting=1",
            },
            unprivileged=True,
        )
    """
    if host.get_fact(PctStatus, vmid=vmid) is not None:
        host.noop(f"container {vmid} exists")
        return
    volid = find_template(host.get_fact(PveamTemplates, storage=storage), storage, template,
                          host_arch(template, OperationError))
    volid = volid or f"{storage}:vztmpl/{template}"
    args = [bit for key, value in options.items() for bit in (f"--{key}", QuoteString(str(value)))]
    yield StringCommand("pct create", str(int(vmid)), QuoteString(volid), *args,
                        f"--unprivileged {int(unprivileged)}", "--start 0")
    cache.changed(config_path(vmid))  # read again: Kind.PCT_CONFIG


def _differs(desired: str, current: str | None) -> bool:
    if desired == current:
        return False
    return not ("=" in desired and option_subset(desired, current))


def _first(value: str) -> str:
    return value.split(",", 1)[0]


def _mount_point(value: str) -> str | None:
    return _options(value).get("mp")


@operation()
def config(
    vmid: int,
    options: dict[str, str],
    mounts: list[str] | None = None,
    devices: list[str] | None = None,
):
    """
    Reconcile container VMID's config through ``pct set``: OPTIONS that differ are set;
    MOUNTS (``mpN`` values) keep the key of the current mount at the same path; DEVICES
    (``devN`` values) keep their keys too, and ``/dev/nvidia*`` entries no longer wanted are
    deleted. The user's other keys always stay.

    + vmid: the container's Proxmox ID
    + options: config keys and values (``{"cores": "32"}``); a value of ``a=b,...`` options holds
      when Proxmox's value has them all (it adds its own, ``hwaddr`` to ``net0``)
    + mounts: the ``mpN`` values wanted (``/tank/models,mp=/models,ro=1``); ``None`` leaves the
      container's mounts alone
    + devices: the ``devN`` values wanted (``/dev/nvidia0,mode=0666``); ``None`` leaves its
      devices alone, ``[]`` removes its ``/dev/nvidia*`` entries

    **Example:**

    .. code:: python

        from pve_sglang.operations import pct

        pct.config(
            name="Container 105 features, mounts and GPUs (devN)",
            vmid=105,
            options={"features": "nesting=1"},
            mounts=["/tank/models,mp=/models,ro=1"],
            devices=["/dev/nvidia0,mode=0666", "/dev/nvidiactl,mode=0666",
                     "/dev/nvidia-uvm,mode=0666"],
        )
    """
    current = current_config(vmid) or {}
    changes = {k: v for k, v in options.items() if _differs(v, current.get(k))}
    deletes: list[str] = []
    if mounts is not None:
        keyed = keyed_entries("mp", mounts, current, lambda a, b: _mount_point(a) == _mount_point(b))
        changes.update({k: v for k, v in keyed.items() if _differs(v, current.get(k))})
    if devices is not None:
        device_sets, deletes = device_plan(current, devices)
        changes.update(device_sets)
    if not changes and not deletes:
        host.noop(f"container {vmid} config is up to date")
        return
    args = [bit for key, value in changes.items() for bit in (f"--{key}", QuoteString(value))]
    if deletes:
        args.append(f"--delete {','.join(deletes)}")
    yield StringCommand("pct set", str(int(vmid)), *args)
    cache.changed(config_path(vmid))  # read again: Kind.PCT_CONFIG


def device_plan(current: dict, devices: list[str]) -> tuple[dict[str, str], list[str]]:
    """The ``devN`` keys to set (each wanted value keeps the key of its current twin, the same
    node) and the ``/dev/nvidia*`` keys to delete, for DEVICES against config CURRENT."""
    keyed = keyed_entries("dev", devices, current, lambda a, b: _first(a) == _first(b))
    sets = {k: v for k, v in keyed.items() if _differs(v, current.get(k))}
    deletes = sorted(
        (key for key, value in current.items()
         if re.fullmatch(r"dev\d+", key) and key not in keyed
         and isinstance(value, str) and _first(value).startswith("/dev/nvidia")),
        key=_version_key,
    )
    return sets, deletes


def device_change(vmid: int, devices: list[str]) -> DeviceChange:
    """What ``config(devices=DEVICES)`` would do to container VMID's ``devN`` keys: added
    (a key not in its config), edited, removed."""
    current = current_config(vmid) or {}
    sets, deletes = device_plan(current, devices)
    return DeviceChange(
        added=tuple(sorted((k for k in sets if k not in current), key=_version_key)),
        edited=tuple(sorted((k for k in sets if k in current), key=_version_key)),
        removed=tuple(deletes),
    )


def pending_restart_keys(pending: dict[str, tuple[str, str]]) -> list[str]:
    """The keys of PENDING (``PctPending``) that the deploy restarts the container for and
    that still wait for it: its features, mount points and ``/dev/nvidia*`` devices. A run
    killed between ``pct set`` and ``pct reboot`` leaves them so, while ``pct config`` shows
    them as done; the user's other pending keys are theirs."""
    ours = [key for key, (_, value) in pending.items()
            if key == "features" or re.fullmatch(r"mp\d+", key)
            or (re.fullmatch(r"dev\d+", key) and _first(value).startswith("/dev/nvidia"))]
    return sorted(ours, key=_version_key)


def pending_restart(vmid: int) -> list[str]:
    """``pending_restart_keys`` of container VMID (none when it does not exist)."""
    pending = host.get_fact(PctPending, vmid=vmid)
    return pending_restart_keys(pending or {})


@operation()
def rootfs_size(vmid: int, size_gib: int):
    """
    Grow container VMID's root disk to SIZE_GIB (``pct resize``); Proxmox cannot shrink it, so a
    larger disk stays, with a warning. Before the container exists its size is unknown: nothing
    is done.

    + vmid: the container's Proxmox ID
    + size_gib: the root disk size wanted, in GiB

    **Example:**

    .. code:: python

        from pve_sglang.operations import pct

        pct.rootfs_size(name="Container 105 disk size", vmid=105, size_gib=200)
    """
    current = current_config(vmid) or {}
    match = re.search(r"size=(\d+(?:\.\d+)?)([KMGT])", str(current.get("rootfs", "")))
    if not match:
        host.noop(f"container {vmid}: rootfs size unknown until it exists")
        return
    scale = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1, "T": 1024}[match.group(2)]
    have = float(match.group(1)) * scale
    if have < size_gib:
        yield StringCommand("pct resize", str(int(vmid)), "rootfs", f"{int(size_gib)}G")
        cache.changed(config_path(vmid))  # read again: Kind.PCT_CONFIG
    elif have > size_gib:
        logger.warning(f"container {vmid}: rootfs is {have:g} GiB, larger than rootfs_size_gib "
                       f"{size_gib}; Proxmox cannot shrink it, leaving it")
        host.noop(f"container {vmid} rootfs is larger than asked")
    else:
        host.noop(f"container {vmid} rootfs is {size_gib} GiB")


def keyed_entries(
    prefix: str, wanted: list[str], current: dict, same: Callable[[str, str], bool]
) -> dict[str, str]:
    """Give each wanted ``devN``/``mpN`` value a key: the key of its current twin, else a free one."""
    taken = {key for key in current if re.fullmatch(rf"{prefix}\d+", key)}
    result: dict[str, str] = {}
    for value in wanted:
        twin = next(
            (key for key in sorted(taken) if isinstance(current.get(key), str)
             and same(value, current[key]) and key not in result),
            None,
        )
        if twin is None:
            index = 0
            while f"{prefix}{index}" in taken or f"{prefix}{index}" in result:
                index += 1
            twin = f"{prefix}{index}"
        result[twin] = value
    return result


@operation()
def power(vmid: int, restart: Callable[[], bool], marker: str | None = None):
    """
    Start container VMID when it is not running; reboot it once (``pct reboot``) when RESTART
    says so.

    + vmid: the container's Proxmox ID
    + restart: asked only when the container runs; true reboots it. Usually ``any_changed`` of
      the operations that changed its config (features, mounts, GPU passthrough)
    + marker: the container's ``restart_marker``, removed once it started or rebooted: what
      the marker stood for is then applied

    **Example:**

    .. code:: python

        from pve_sglang.operations import pct
        from pve_sglang.operations.changes import any_changed

        # features, passthrough: the pct.config and owned.lines operations of container 105
        pct.power(
            name="Container 105 running",
            vmid=105,
            restart=any_changed(features, passthrough, restarts="container 105 (pct reboot)"),
        )
    """
    status = host.get_fact(PctStatus, vmid=vmid)
    if status != "running":
        yield StringCommand("pct start", str(int(vmid)))
    elif restart():
        yield StringCommand("pct reboot", str(int(vmid)))
    else:
        host.noop(f"container {vmid} is running")
        return
    if marker is not None:
        yield StringCommand("rm -f", QuoteString(marker))
