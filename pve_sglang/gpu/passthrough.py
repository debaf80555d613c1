"""
NVIDIA GPU passthrough into an LXC container: pure functions, no I/O.

Inputs are read from the host by the caller:

+ the device minors of the GPUs to pass (``[2, 0]`` means ``/dev/nvidia2`` and ``/dev/nvidia0``):
  not nvidia-smi's indices, which follow the PCI bus order while a node's number is the order
  the driver probed the GPUs in (``device_minors`` maps one to the other, through the bus id);
+ the character-device majors from the host's ``/proc/devices`` (the ``CharDeviceMajors`` fact): the
  driver's frontend major is 195 and is called ``nvidia-frontend`` (some drivers print
  ``nvidia``); ``nvidia-uvm`` and ``nvidia-caps`` are dynamic and move between kernels;
+ the NVIDIA device nodes present on the host (``/dev/nvidia0``, ``/dev/nvidiactl``,
  ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``, ``/dev/nvidia-modeset``,
  ``/dev/nvidia-caps/nvidia-cap1`` ...), as absolute ``/dev`` paths or relative to ``/dev``.

Outputs:

+ ``select_gpus``: the host's GPUs a container gets (``gpus: all`` or a list of indices): the
  one home of the selection, which the passthrough, the server's flags and the verify phase's
  expected count all use;
+ ``device_minors``: the device minors of those GPUs (their ``/dev/nvidiaN`` nodes);
+ ``pve_dev_entries``: Proxmox ``devN`` entries (pve-container >= 5.0.7), which stat the host
  node at every start and write the cgroup rule themselves;
+ ``raw_lxc_lines``: ``lxc.cgroup2.devices.allow`` (or ``lxc.cgroup.devices.allow`` for a legacy
  cgroup v1 host) and ``lxc.mount.entry`` lines, in Proxmox's ``key: value`` style or raw LXC's
  ``key = value`` style, for older Proxmox and for plain LXC hosts.

Only the selected GPUs' ``/dev/nvidiaN`` nodes are passed, plus the shared ones (``nvidiactl``,
``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset`` and the ``nvidia-caps`` directory).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pve_sglang.runtime.errors import PreflightError


def select_gpus(wanted: str | list[int], gpus: list[dict], where: str) -> list[dict]:
    """The host's GPUs a container gets (``gpus: all`` or a list of indices, in that order).

    The one home of the GPU selection: the passthrough, the server's flags and verify's expected
    count all come from it. An index the host lacks is an error.
    """
    by_index = {gpu["index"]: gpu for gpu in gpus}
    if wanted == "all":
        return list(gpus)
    missing = [index for index in wanted if index not in by_index]
    if missing:
        raise PreflightError(
            f"{where}: field 'gpus' = {wanted}: GPU {missing} not on the host; "
            f"allowed: 'all' or a subset of {list(by_index)}"
        )
    return [by_index[index] for index in wanted]


#: Where the driver describes each GPU it probed, one folder per PCI bus id, its ``information``
#: file naming the ``Device Minor``.
PROC_GPUS = "/proc/driver/nvidia/gpus"

#: Names of the frontend major (195) in /proc/devices, preferred first.
FRONTEND_MAJOR_NAMES = ("nvidia-frontend", "nvidia")
UVM_MAJOR_NAME = "nvidia-uvm"
CAPS_MAJOR_NAME = "nvidia-caps"

#: Fixed minors of the frontend major.
CTL_MINOR = 255
MODESET_MINOR = 254

#: Shared nodes, in the order they are passed, and whether the container needs them.
SHARED_NODES: tuple[tuple[str, bool], ...] = (
    ("nvidiactl", True),
    ("nvidia-uvm", True),
    ("nvidia-uvm-tools", False),
    ("nvidia-modeset", False),
)
CAPS_DIR = "nvidia-caps"

#: devN indices Proxmox accepts.
PVE_DEV_MAX = 255

@dataclass(frozen=True)
class Node:
    """One host device node to pass: ``name`` is relative to ``/dev``."""

    name: str
    major_name: str | None  # key in /proc/devices; None: the frontend major
    minor: int | None  # None: any minor of that major (``MAJOR:*``)
    is_dir: bool = False


def frontend_major(majors: Mapping[str, int]) -> int:
    """The NVIDIA frontend major (195) from ``/proc/devices`` data; ValueError if absent."""
    for name in FRONTEND_MAJOR_NAMES:
        if name in majors:
            return majors[name]
    raise ValueError(
        "NVIDIA frontend major not found in /proc/devices (looked for "
        + " or ".join(repr(n) for n in FRONTEND_MAJOR_NAMES)
        + "): is the nvidia kernel module loaded?",
    )


def _normalise_node(path: str) -> str:
    path = path.strip()
    if path.startswith("/dev/"):
        path = path[len("/dev/") :]
    return path.strip("/")


def device_minors(indices: Sequence[int], minors: Iterable[Mapping]) -> list[int]:
    """The device minors (``/dev/nvidiaN``'s N) of nvidia-smi's GPUs INDICES, from the
    ``NvidiaGpuMinors`` fact's rows (``index``, ``bus_id``, ``minor``). ValueError names a GPU
    whose minor the driver's information files do not give (the deploy does not guess: on such
    a host ``/dev/nvidia{index}`` may be another GPU, one another container uses), or two GPUs
    said to have one minor."""
    by_index = {row["index"]: row for row in minors}
    found: list[int] = []
    for index in indices:
        row = by_index.get(index)
        if row is None or row.get("minor") is None:
            bus = f" (PCI bus {row['bus_id']})" if row is not None else ""
            raise ValueError(
                f"GPU {index}{bus}: no {PROC_GPUS}/BUS/information names its device minor, so "
                f"which /dev/nvidiaN it is cannot be told (nvidia-smi's index follows the PCI "
                "bus order, the node's number the order the driver probed the GPUs in; "
                "`nvidia-smi -q` shows each GPU's Bus Id and Minor Number)")
        twin = next((other for other, minor in zip(indices, found) if minor == row["minor"]), None)
        if twin is not None:
            raise ValueError(f"GPUs {twin} and {index} are both given device minor "
                             f"{row['minor']} by {PROC_GPUS}: the deploy cannot tell their nodes apart")
        found.append(int(row["minor"]))
    return found


def select_nodes(minors: Sequence[int], nodes: Iterable[str]) -> list[Node]:
    """
    The nodes to pass for the GPUs of device minors MINORS, in order: the GPUs, then the
    shared nodes present. ValueError names a selected GPU node, ``nvidiactl`` or
    ``nvidia-uvm`` missing on the host. ``/dev/nvidia-caps`` is passed as one directory if it
    or any node in it is present.
    """
    present = {_normalise_node(n) for n in nodes}

    if len(set(minors)) != len(minors):
        raise ValueError(f"GPU device minors repeat: {list(minors)}")
    selected: list[Node] = []
    for minor in minors:
        if minor < 0:
            raise ValueError(f"Invalid GPU device minor {minor}")
        name = f"nvidia{minor}"
        if name not in present:
            raise ValueError(f"host device node /dev/{name} (device minor {minor}) is missing "
                             f"(`nvidia-modprobe -c {minor}` creates it)")
        selected.append(Node(name, None, minor))

    for name, required in SHARED_NODES:
        if name in present:
            if name == "nvidiactl":
                selected.append(Node(name, None, CTL_MINOR))
            elif name == "nvidia-modeset":
                selected.append(Node(name, None, MODESET_MINOR))
            else:
                selected.append(Node(name, UVM_MAJOR_NAME, None))
        elif required:
            hint = " (run `nvidia-modprobe -u -c0` on the host)" if "uvm" in name else ""
            raise ValueError(f"Host device node /dev/{name} is missing{hint}")

    if any(n == CAPS_DIR or n.startswith(CAPS_DIR + "/") for n in present):
        selected.append(Node(CAPS_DIR, CAPS_MAJOR_NAME, None, is_dir=True))

    return selected


def pve_dev_entries(
    minors: Sequence[int],
    nodes: Iterable[str],
    *,
    mode: str | None = None,
    uid: int | None = None,
    gid: int | None = None,
    start: int = 0,
) -> dict[str, str]:
    """
    Proxmox ``devN`` entries for the GPUs of device minors MINORS (pve-container >= 5.0.7):
    ``{"dev0": "/dev/nvidia0",
    ...}``, numbered from ``start``, each with ``,mode=...``, ``,uid=...``, ``,gid=...`` when
    given (e.g. ``mode="0666"``). ``devN`` takes device nodes only, so each node of
    ``/dev/nvidia-caps`` gets its own entry.
    """
    if mode is not None and not re.fullmatch(r"0?[0-7]{3,4}", mode):
        raise ValueError(f"Invalid device mode {mode!r}: use octal like 0666")

    options = ""
    if mode is not None:
        options += f",mode={mode}"
    if uid is not None:
        options += f",uid={int(uid)}"
    if gid is not None:
        options += f",gid={int(gid)}"

    present = sorted({_normalise_node(n) for n in nodes})
    paths: list[str] = []
    for node in select_nodes(minors, present):
        if node.is_dir:
            caps = [n for n in present if n.startswith(CAPS_DIR + "/")]
            paths.extend(f"/dev/{n}" for n in caps)
        else:
            paths.append(f"/dev/{node.name}")

    last = start + len(paths) - 1
    if start < 0 or last > PVE_DEV_MAX:
        raise ValueError(f"devN index range {start}-{last} is outside 0-{PVE_DEV_MAX}")

    return {f"dev{start + i}": f"{path}{options}" for i, path in enumerate(paths)}


def _cgroup_key(cgroup: str) -> str:
    if cgroup == "v2":
        return "lxc.cgroup2.devices.allow"
    if cgroup == "v1":
        return "lxc.cgroup.devices.allow"
    raise ValueError(f"Invalid cgroup version {cgroup!r}: use 'v2' or 'v1'")


def _separator(style: str) -> str:
    if style == "pve":
        return ": "
    if style == "lxc":
        return " = "
    raise ValueError(f"Invalid style {style!r}: use 'pve' (key: value) or 'lxc' (key = value)")


def raw_lxc_entries(
    minors: Sequence[int],
    majors: Mapping[str, int],
    nodes: Iterable[str],
    *,
    cgroup: str = "v2",
    dev_root: str = "/dev",
) -> list[tuple[str, str]]:
    """
    ``(key, value)`` pairs of the raw LXC passthrough config of the GPUs of device minors
    MINORS: the cgroup device rules first
    (``c MAJOR:MINOR rwm``; ``MAJOR:*`` for nvidia-uvm and nvidia-caps), then one bind mount per
    node, its source under ``dev_root`` (where the host's nodes live; default ``/dev``).
    ValueError names a needed major missing from ``majors``.
    """
    cgroup_key = _cgroup_key(cgroup)
    selected = select_nodes(minors, nodes)
    root = dev_root.rstrip("/")

    rules: list[str] = []
    for node in selected:
        if node.major_name is None:
            major = frontend_major(majors)
        elif node.major_name in majors:
            major = majors[node.major_name]
        else:
            raise ValueError(
                f"Major {node.major_name!r} for /dev/{node.name} not found in /proc/devices",
            )
        minor = "*" if node.minor is None else str(node.minor)
        rule = f"c {major}:{minor} rwm"
        if rule not in rules:
            rules.append(rule)

    entries = [(cgroup_key, rule) for rule in rules]
    for node in selected:
        create = "dir" if node.is_dir else "file"
        source = f"{root}/{node.name}"
        entries.append(
            ("lxc.mount.entry", f"{source} dev/{node.name} none bind,optional,create={create}"),
        )
    return entries


def raw_lxc_lines(
    minors: Sequence[int],
    majors: Mapping[str, int],
    nodes: Iterable[str],
    *,
    style: str = "pve",
    cgroup: str = "v2",
    dev_root: str = "/dev",
) -> list[str]:
    """
    The raw LXC passthrough lines (see ``raw_lxc_entries``) rendered as ``key: value``
    (``style="pve"``, for ``/etc/pve/lxc/VMID.conf``) or ``key = value`` (``style="lxc"``,
    for a plain LXC config).
    """
    sep = _separator(style)
    return [
        f"{key}{sep}{value}"
        for key, value in raw_lxc_entries(minors, majors, nodes, cgroup=cgroup, dev_root=dev_root)
    ]
