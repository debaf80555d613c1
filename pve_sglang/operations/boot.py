"""What a host loads at boot from files the deploy writes: the initramfs."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host
from pyinfra.api import operation

from pve_sglang.facts.system import InitramfsOlderThan


@operation()
def initramfs_current(option_file: str, changed: Callable[[], bool]):
    """
    Rebuild every initramfs (``update-initramfs -u -k all``) when OPTION_FILE changed in this
    run, or when an image is not newer than it: decided from the images, so an update that
    failed (a full /boot) or never ran (a run killed after the write) is made by the next run.

    + option_file: a file the initramfs carries, e.g. a modprobe option
    + changed: true when this run wrote OPTION_FILE; usually ``any_changed`` of its operation

    **Example:**

    .. code:: python

        from pve_sglang.operations import boot
        from pve_sglang.operations.changes import any_changed

        # conf: the operation writing /etc/modprobe.d/nvidia-uvm.conf
        boot.initramfs_current(name="Initramfs with the nvidia_uvm option",
                               option_file="/etc/modprobe.d/nvidia-uvm.conf",
                               changed=any_changed(conf))
    """
    if changed():
        yield "update-initramfs -u -k all"
        return
    older = host.get_fact(InitramfsOlderThan, path=option_file)
    if older:
        yield "update-initramfs -u -k all"
        return
    host.noop(f"every initramfs is newer than {option_file}")
