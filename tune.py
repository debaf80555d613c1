"""pve-sglang's tuning search: ``pyinfra inventory.py tune.py`` (``make tune``), ``--limit`` to
one container or one multi-node group.

Per GPU container it shows the search's plan (``pve_sglang.tuning.plan``): the space, the
budget, the objective and its bound, the first candidates; ``--dry`` stops there. A run
measures (``tasks/tune.py``): each try applied as the deploy applies flags (the unit rendered
by the deploy's own code, one restart through the startup watch, the generation check),
benchmarked with the verify phase's record and samplers, written to the record as it ends; the
server left on the best measured (else the flags it was found with) and the best kept in the
container's tuned file, which the deploy reads under the container's own entry. A multi-node
group is tuned as one, by its first node.
"""

from pyinfra import host

from pve_sglang.config.settings import ContainerSettings, host_settings
from pve_sglang.runtime import pyinfra_per_op
from tasks.common import host_gpus
from tasks.tune import tune_container

pyinfra_per_op.install()
if "gpu_containers" in host.groups:
    tune_container(host_settings(ContainerSettings), frozenset(host.data.get("tune_pinned") or ()),
                   host_gpus())
