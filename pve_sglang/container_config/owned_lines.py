"""Container config lines the deploy owns, reconciled inside a file the user also edits.

Proxmox moves ``#`` lines of a container config into its description, so a block between
marker comments would not stay put; owned lines are recognised by their content instead, and
every other line is left as it was, byte for byte. Two owners:

+ GPU passthrough (``owned_by_gpu_passthrough``): cgroup rules for NVIDIA's majors only (the
  frontend, ``nvidia-uvm``, ``nvidia-caps``, by name from ``/proc/devices``) and mounts of
  ``/dev/nvidia*`` nodes. A rule for any other major (``c 10:200`` for /dev/net/tun, ``c 226:*``
  for /dev/dri) is the user's. A rule for the majors ``nvidia-uvm``/``nvidia-caps`` had under
  an older kernel is not recognised any more (the number is free or another device's now) and
  stays: nothing tells it from a user's rule.
+ Settings (``owned_by_settings``, plain LXC's ``lxc_config``): see there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from pve_sglang.gpu.passthrough import CAPS_MAJOR_NAME, FRONTEND_MAJOR_NAMES, UVM_MAJOR_NAME

_RULE = re.compile(r"^lxc\.cgroup2?\.devices\.allow\s*[:=]\s*c\s+(?P<major>\d+):")
# Fields of a mount entry: source, then the target (relative to the rootfs, or absolute).
_MOUNT = re.compile(r"^lxc\.mount\.entry\s*[:=]\s*(?P<source>\S+)\s+(?P<target>\S+)")
_NVIDIA_SOURCE = re.compile(r"^/dev/nvidia[^/\s]*(/|$)")
_NVIDIA_TARGET = re.compile(r"^/?dev/nvidia[^/\s]*(/|$)")


def nvidia_majors(majors: Mapping[str, int]) -> set[int]:
    """The NVIDIA majors passthrough writes rules for, from ``/proc/devices`` (name: major)."""
    names = (*FRONTEND_MAJOR_NAMES, UVM_MAJOR_NAME, CAPS_MAJOR_NAME)
    return {int(majors[name]) for name in names if name in majors}


def owned_by_gpu_passthrough(majors: Mapping[str, int]) -> Callable[[str], bool]:
    """A predicate for the lines GPU passthrough owns: rules for NVIDIA's majors (picked by
    name from MAJORS, the host's ``/proc/devices``), mounts of ``/dev/nvidia*`` nodes."""
    if not isinstance(majors, Mapping):
        raise TypeError("majors: the /proc/devices mapping {name: major}, not a list of numbers")
    owned_majors = nvidia_majors(majors)

    def owned(line: str) -> bool:
        text = line.strip()
        rule = _RULE.match(text)
        if rule:
            return int(rule.group("major")) in owned_majors
        mount = _MOUNT.match(text)
        return mount is not None and bool(
            _NVIDIA_SOURCE.match(mount.group("source")) or _NVIDIA_TARGET.match(mount.group("target"))
        )

    return owned


# LXC keys that may repeat, each line adding one value (lxc.container.conf(5)); a settings
# line with one of them owns only itself, so the user's own mounts, rules and id maps stay.
_REPEATABLE = re.compile(
    r"^lxc\.(mount\.entry|mount\.auto|cgroup2?\.devices\.(allow|deny)|idmap|cap\.(drop|keep)"
    r"|include|environment|group|hook\.[\w.]+|apparmor\.raw|net\.\d+\.ipv[46]\.address)$"
)
_INTERFACE = re.compile(r"^(lxc\.net\.\d+)\.type$")


def _key(line: str) -> str:
    return line.split("=", 1)[0].strip()


def _normal(line: str) -> str:
    key, _, value = line.partition("=")
    return f"{key.strip()} = {' '.join(value.split())}"  # LXC splits values on whitespace


def owned_by_settings(lines: Iterable[str]) -> Callable[[str], bool]:
    """
    A predicate for the raw LXC config lines that settings LINES own (``key = value``):

    + a key that takes one value (``lxc.apparmor.profile``): the line with that key, whatever
      its value, since the settings' value replaces it;
    + a key that repeats (``lxc.mount.entry``, ``lxc.cgroup2.devices.allow``, ``lxc.idmap``,
      ...): only that exact line; every other line with the key is the user's. Changing such
      a line in ``lxc_config`` leaves the old one in the file, as nothing tells it from the
      user's own: remove it by hand;
    + ``lxc.net.N.type``: the whole interface N (every ``lxc.net.N.*`` line). An interface is
      described by all its lines together: the ``veth`` template's ``link``, ``flags`` and
      ``hwaddr`` left under ``type = none`` would describe an interface nobody asked for.
      Other interfaces (``lxc.net.1.*``) stay the user's.

    Comments and blank lines are never owned.
    """
    exact, keys, interfaces = set(), set(), set()
    for line in lines:
        key = _key(line)
        interface = _INTERFACE.match(key)
        if interface:
            interfaces.add(interface.group(1) + ".")
        if _REPEATABLE.match(key):
            exact.add(_normal(line))
        else:
            keys.add(key)

    def owned(line: str) -> bool:
        text = line.strip()
        if not text or text.startswith("#") or "=" not in text:
            return False
        key = _key(text)
        if any(key.startswith(interface) for interface in interfaces):
            return True
        if _REPEATABLE.match(key):
            return _normal(text) in exact
        return key in keys

    return owned


def reconcile_lines(content: str, desired: list[str], owned: Callable[[str], bool]) -> str:
    """CONTENT with its owned lines replaced by DESIRED; unchanged when they already match.

    Only the main section counts: in a Proxmox config, ``[snapshot]`` sections follow it and
    keep their own copies. DESIRED goes where the first owned line was, else at the end of
    the main section (before its trailing blank lines). Every other line stays byte for byte.
    """
    # Split on "\n" only: a "\r" or any other character of a user's line stays as it is.
    lines = content.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    end = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    main, rest = lines[:end], lines[end:]
    current = [line for line in main if owned(line)]
    if current == desired:
        return content
    first = next((i for i, line in enumerate(main) if owned(line)), None)
    kept = [line for line in main if not owned(line)]
    if first is None:
        insert_at = len(kept)
        while insert_at and not kept[insert_at - 1].strip():
            insert_at -= 1
    else:
        insert_at = sum(1 for line in main[:first] if not owned(line))
    return "\n".join(kept[:insert_at] + desired + kept[insert_at:] + rest) + "\n"
