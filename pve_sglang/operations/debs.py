"""Debian packages in a GPU container: a package file (a repository keyring) and packages
from the lists, each decided from the container's one read of what dpkg lists."""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pve_sglang.facts.one_read import Part
from pve_sglang.operations import container_reads
from pve_sglang.runtime.cache import Kind

@operation()
def deb_file(path: str, package: str, version: str):
    """
    Install the Debian package file at PATH (e.g. a downloaded repository keyring) unless
    PACKAGE is installed at VERSION. Decided from what dpkg lists, not from whether the file
    changed in this run: a ``dpkg -i`` that failed (the dpkg lock held at a container's first
    boot, a full disk) or never ran (a run killed after the download) is made by the next run.

    + path: the ``.deb`` in the container
    + package: its package name, as ``dpkg -l`` lists it
    + version: its version, as ``dpkg -l`` lists it

    **Example:**

    .. code:: python

        from pve_sglang.operations import debs

        debs.deb_file(name="Install the CUDA repository keyring",
                     path="/var/cache/pve-sglang/cuda-keyring.deb",
                     package="cuda-keyring", version="1.1-1")
    """
    installed = container_reads.read(Part.DEBS).get(package) or ()
    if version in installed:
        host.noop(f"{package} {version} installed")
        return
    yield StringCommand("dpkg -i", QuoteString(path))
    container_reads.forget(Kind.DEBS)


@operation()
def deb_packages(packages: list[str]):
    """
    Install the Debian PACKAGES that are missing, refreshing the package lists first; one read
    when all are there (``apt.packages`` with ``cache_time`` reads three facts to decide).

    + packages: Debian package names, installed without recommends

    **Example:**

    .. code:: python

        from pve_sglang.operations import debs

        debs.deb_packages(name="Base packages",
                         packages=["ca-certificates", "curl", "python3", "python3-venv"])
    """
    installed = container_reads.read(Part.DEBS)
    missing = [name for name in packages if name not in installed]
    if not missing:
        host.noop("Debian packages installed: " + ", ".join(packages))
        return
    yield StringCommand(
        "DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -q --no-install-recommends", *(QuoteString(m) for m in missing)
    )
    container_reads.forget(Kind.DEBS)


def deb_file_name(path: str) -> tuple[str, str]:
    """The package and version of a Debian package file, from its name as Debian names them
    (``NAME_VERSION_ARCH.deb``): ``.../cuda-keyring_1.1-1_all.deb`` -> ``("cuda-keyring",
    "1.1-1")``. The version's epoch, if any, is not in a file name."""
    name = posixpath.basename(path)
    parts = name[:-len(".deb")].split("_") if name.endswith(".deb") else []
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{name!r} is not a Debian package file name (NAME_VERSION_ARCH.deb)")
    return parts[0], parts[1]
