"""Phase 2, in each GPU container: driver, CUDA, venv, autotune patch, server unit."""

from pyinfra import host
from pyinfra.api import deploy

from pve_sglang.settings import ContainerSettings, settings_for


@deploy("GPU container")
def container_phase() -> None:
    """Install the pinned stack and the SGLang unit in a GPU container."""
    if "gpu_containers" not in host.groups:
        return
    settings_for(host.data, ContainerSettings)
