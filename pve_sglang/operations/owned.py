"""The lines of a config file that the deploy owns, kept equal to what settings say."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation
from pyinfra.api.command import QuoteString, StringCommand
from pve_sglang.runtime import cache
from pve_sglang.container_config.owned_lines import reconcile_lines
from pve_sglang.facts.lxc_host import HostPart
from pve_sglang.operations import host_reads
from pve_sglang.operations.paths import diff_wanted, show_diff


def contents(path: str) -> list[str] | None:
    """PATH's lines (``FileContents``; None when missing), read once per run stage until an
    operation writes it (``cache.changed``): the config operations of one container share it.
    A plain LXC host reads its containers' configs with its other reads (``host_reads``)."""
    return host_reads.read(HostPart.CONFIG, path)


@operation()
def lines(path: str, lines: list[str], owned: Callable[[str], bool], marker: str | None = None):
    """
    Keep the lines of PATH that OWNED recognises equal to LINES, leaving every other line
    where it is (container configs the user edits too: ``/etc/pve/lxc/VMID.conf``, raw LXC).
    The file is replaced whole (pmxcfs takes a write, not an edit); ``--diff`` shows the
    change from the content already read, at no extra command.

    + path: the config file; created, with its directory, when missing
    + lines: the lines the deploy wants there, in order
    + owned: true for a line the deploy owns: owned lines not in LINES are removed, and LINES
      take the place of the first one; every line it does not own stays as it is
    + marker: a file written (with its directory) before the change, for whatever applies the
      change (a restart) to remove once it did: a run killed in between leaves it, and the
      next run sees that the change still waits (``pct.power``'s ``marker``)

    **Example:**

    .. code:: python

        from pve_sglang.container_config.owned_lines import owned_by_gpu_passthrough
        from pve_sglang.operations import owned

        owned.lines(
            name="Container 105 GPU passthrough (raw lxc lines)",
            path="/etc/pve/lxc/105.conf",
            lines=[
                "lxc.cgroup2.devices.allow: c 195:* rwm",
                "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
            ],
            owned=owned_by_gpu_passthrough({"nvidia": 195, "nvidia-uvm": 508}),
        )
    """
    content = contents(path)
    text = "\n".join(content or []) + ("\n" if content else "")
    new = reconcile_lines(text, lines, owned)
    if new == text:
        host.noop(f"{path}: owned lines are up to date")
        return
    if diff_wanted():
        current = None if content is None else [line + "\n" for line in content]
        show_diff(path, current, new.splitlines(keepends=True))
    if marker is not None:
        yield StringCommand("mkdir -p", QuoteString(posixpath.dirname(marker) or "/"),
                            "&& printf '%s\\n'", QuoteString(f"{path}: owned lines changed"),
                            ">", QuoteString(marker))
    if content is None:
        yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(path) or "/"))
    yield FileUploadCommand(StringIO(new), path, remote_temp_filename=host.get_temp_filename(path))
    # What this run read from PATH is stale: its lines (Kind.FILE_CONTENTS), a Proxmox
    # container's config (Kind.PCT_CONFIG: pct.current_config).
    cache.changed(path)
