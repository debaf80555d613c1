"""The platform a container's stack is locked and installed for: its Debian release's python3
and glibc, so a wheel tagged up to that glibc (sglang ships manylinux_2_34 from 0.5.11) locks.

A container's release is known by its python3 (``stack_python``): each Debian release has one.
``stack_python`` null follows the release the host creates the container from: the Proxmox
template (``debian-13-standard...``) or plain LXC's ``lxc_release`` (``trixie``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The newest manylinux tag uv's --python-platform names (uv 0.13: x86_64-manylinux_2_40).
UV_NEWEST_GLIBC = (2, 40)


class PlatformError(ValueError):
    """A Python no Debian release of the table has."""


@dataclass(frozen=True)
class ContainerPlatform:
    """A Debian release as the stack sees it: its python3 and its glibc."""

    debian: str
    codename: str
    python: str
    glibc: tuple[int, int]

    @property
    def nvidia_repo(self) -> str:
        """The folder of NVIDIA's CUDA apt repository for this release (``debian12``)."""
        return f"debian{self.debian}"

    @property
    def uv_platform(self) -> str:
        """uv pip compile's --python-platform: the release's glibc, or uv's newest below it
        (a wheel tagged for a newer glibc than uv names is not yet on the index)."""
        major, minor = min(self.glibc, UV_NEWEST_GLIBC)
        return f"x86_64-manylinux_{major}_{minor}"

    @property
    def manylinux_tags(self) -> list[str]:
        """pip download's --platform tags, newest first: pip takes each tag literally."""
        major, minor = self.glibc
        return [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)] + [
            "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


#: Debian's releases (python3 and libc6 of each; Proxmox VE 8 templates are Debian 12, 9 are 13).
DEBIAN_RELEASES = (
    ContainerPlatform("12", "bookworm", "3.11", (2, 36)),
    ContainerPlatform("13", "trixie", "3.13", (2, 41)),
)


def platform_for(python: str) -> ContainerPlatform:
    """The Debian release whose python3 is PYTHON."""
    for release in DEBIAN_RELEASES:
        if release.python == python:
            return release
    allowed = ", ".join(f"{r.python} (Debian {r.debian})" for r in DEBIAN_RELEASES)
    raise PlatformError(f"Python {python} is no Debian release's python3; allowed: {allowed}")


#: The release a container gets when its host's settings name none the table knows.
DEFAULT_RELEASE = DEBIAN_RELEASES[0]


def release_of(platform: str, template: str | None, lxc_release: str | None) -> ContainerPlatform:
    """The Debian release a host creates its containers from: on Proxmox (PLATFORM ``pve``) the
    template's name (``debian-13-standard_13.1-2_amd64.tar.zst``, or a prefix of it), on plain
    LXC the ``lxc_release`` codename. DEFAULT_RELEASE when neither names one of the table (a
    template of another distribution: its python3 is then the user's to give in stack_python)."""
    for release in DEBIAN_RELEASES:
        if platform == "lxc" and lxc_release == release.codename:
            return release
        if platform == "pve" and (template or "").startswith(f"debian-{release.debian}-"):
            return release
    return DEFAULT_RELEASE
