"""The stack's CUDA against the host's NVIDIA driver, from NVIDIA's tables.

A CUDA runtime needs a driver at least as new as its major's minimum ("CUDA Compatibility",
Minor Version Compatibility, Table 1: CUDA 13.x >= 580, 12.x >= 525, 11.x >= 450): below it
the runtime cannot initialise, so preflight refuses the set. Between that minimum and the
driver the toolkit shipped with (CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding
Driver Versions", Linux x86_64) the runtime runs with a limited feature set (PTX newer than the
driver cannot be JIT-compiled): a warning.

https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ (Table 3)
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

#: CUDA major -> the oldest driver that runs it (minor version compatibility), Linux.
MINIMUM_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580"}
#: CUDA (major, minor) -> the driver of its GA toolkit (full features), Linux x86_64.
TOOLKIT_DRIVER = {
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
    (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03", (13, 0): "580.65.06",
}


def _version(driver: str) -> Version | None:
    try:
        return Version(driver)
    except InvalidVersion:
        return None


def driver_problem(cuda: tuple[int, int], driver: str, stack: str) -> str | None:
    """Why DRIVER cannot run STACK (a set of CUDA major.minor CUDA), with the way out; None
    when it can. A driver version that is not one (an unknown format) is not judged."""
    have = _version(driver)
    needed = MINIMUM_DRIVER.get(cuda[0])
    if have is None or needed is None or have >= Version(needed):
        return None
    runs = sorted(major for major, oldest in MINIMUM_DRIVER.items() if have >= Version(oldest))
    older = f", or a sglang_version whose CUDA major is {runs[-1]}" if runs else ""
    return (f"the NVIDIA driver {driver} cannot run {stack}: CUDA {cuda[0]}.x needs driver "
            f">= {needed} (R{needed.split('.')[0]} or newer; NVIDIA's CUDA Compatibility table); "
            f"install driver {needed.split('.')[0]} or newer on the host{older}")


def limited_features(cuda: tuple[int, int], driver: str) -> str | None:
    """A note when DRIVER runs CUDA's major but is older than the driver of its toolkit."""
    have = _version(driver)
    full = TOOLKIT_DRIVER.get(cuda)
    if have is None or full is None or have >= Version(full) or driver_problem(cuda, driver, ""):
        return None
    return (f"the NVIDIA driver {driver} runs CUDA {cuda[0]}.{cuda[1]} through minor version "
            f"compatibility only (its toolkit's driver is {full}): PTX of a newer toolkit "
            "cannot be JIT-compiled")
