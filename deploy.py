"""pve-sglang: a Proxmox host with NVIDIA GPUs to a tuned SGLang server in an LXC container.

Run as ``pyinfra inventory.py deploy.py``. The phases follow the data: the host's driver and
GPUs decide the container's passthrough, its driver version and the server's flags.
"""

from pve_sglang.runtime import pyinfra_per_op
from pve_sglang.operations import phase
from tasks.container import container_phase
from tasks.gateway import gateway_bench_phase, gateway_phase
from tasks.host import host_phase, store_retention_phase
from tasks.monitoring import monitoring_phase
from tasks.verify import verify_phase

pyinfra_per_op.install()  # before the first operation: pyinfra's work per operation costs less
host_phase()
phase.done(name="Proxmox hosts done", phase="host")
container_phase()
phase.done(name="GPU containers done", phase="container")
verify_phase()
phase.done(name="Verify done", phase="verify")
gateway_phase()
phase.done(name="Gateways done", phase="gateway")
gateway_bench_phase()
monitoring_phase()
phase.done(name="Monitoring done", phase="monitoring")
store_retention_phase()
