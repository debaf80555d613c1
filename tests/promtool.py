"""Debian's ``promtool`` (its prometheus package) for the rule tests, without installing it:
on PATH where the machine has it, else taken from Debian's package that the monitoring LXC
test's container downloaded into the test cache (``monitoring/apt-archives``, its apt archive),
unpacked once with ``dpkg-deb``."""

from __future__ import annotations

import shutil
import subprocess

from cache_dir import TEST_CACHE, building

ARCHIVES = TEST_CACHE / "monitoring" / "apt-archives"
UNPACKED = TEST_CACHE / "monitoring" / "prometheus-deb"


def promtool() -> tuple[str | None, str]:
    """promtool's path, or None and why there is none."""
    found = shutil.which("promtool")
    if found:
        return found, ""
    debs = sorted(ARCHIVES.glob("prometheus_*_amd64.deb"))
    if not debs or not shutil.which("dpkg-deb"):
        return None, (f"needs promtool: Debian's prometheus package on PATH, or its .deb in "
                      f"{ARCHIVES} (tests/lxc/test_monitoring_lxc.py's container caches it)")
    tool = UNPACKED / debs[-1].stem / "usr/bin/promtool"
    with building(UNPACKED / debs[-1].stem):
        if not tool.exists():
            subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(UNPACKED / debs[-1].stem)],
                           check=True)
    return str(tool), ""
