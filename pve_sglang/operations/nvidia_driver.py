"""NVIDIA's user-space driver inside a GPU container, at the host's exact version."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pve_sglang.facts.container import NvidiaUserspaceVersion

RUNFILE_URL = "https://us.download.nvidia.com/XFree86/Linux-x86_64/{v}/NVIDIA-Linux-x86_64-{v}.run"


@operation()
def userspace_driver(version: str, runfile: str):
    """
    Install NVIDIA's user-space driver VERSION from RUNFILE without kernel modules: the
    container shares the host's module, and any other version fails with
    ``Driver/library version mismatch``. Done again whenever the host's version moves.

    + version: the host's NVIDIA driver version (``nvidia-smi``), e.g. ``580.95.05``
    + runfile: the path in the container of NVIDIA's ``.run`` installer of that version

    **Example:**

    .. code:: python

        from pve_sglang.operations import nvidia_driver

        nvidia_driver.userspace_driver(
            name="NVIDIA user-space driver 580.95.05 (the host's version)",
            version="580.95.05",
            runfile="/var/cache/pve-sglang/NVIDIA-Linux-x86_64-580.95.05.run",
        )
    """
    installed = host.get_fact(NvidiaUserspaceVersion)
    if installed == version:
        host.noop(f"user-space NVIDIA driver {version} is installed")
        return
    yield StringCommand("sh", QuoteString(runfile), "--no-kernel-modules --silent")
