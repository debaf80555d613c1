"""Phase 1, on each Proxmox host: driver, nvidia_uvm HMM option, GPU container."""

from pyinfra import host
from pyinfra.api import deploy

from pve_sglang.settings import HostSettings, settings_for


@deploy("Proxmox host")
def host_phase() -> None:
    """Bring a Proxmox (or plain LXC) host to a running GPU container."""
    if "pve_hosts" not in host.groups:
        return
    settings_for(host.data, HostSettings)
