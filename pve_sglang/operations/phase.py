"""Phase boundaries across hosts."""

from pyinfra import host
from pyinfra.api import operation


@operation()
def done(phase: str):
    """
    Mark the end of PHASE on every host. pyinfra orders each host's operations, but across hosts
    only shared operations order anything: this one, called on all hosts, makes every container
    operation wait until every Proxmox host has created and started its containers.

    + phase: the phase that ends here, as the plan names it (``host``, ``container``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import phase

        phase.done(name="Proxmox hosts done", phase="host")
    """
    host.noop(f"{phase} phase done")
    yield from ()
