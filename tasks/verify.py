"""Phase 3: GPUs visible, CUDA initialises, the server answers, optional benchmark."""

from pyinfra import host
from pyinfra.api import deploy


@deploy("Verify")
def verify_phase() -> None:
    """Check the container end to end."""
    if "gpu_containers" not in host.groups:
        return
