"""pve-sglang's tuning search: ``pyinfra inventory.py tune.py`` (``make tune``), ``--limit`` to
one container (or one multi-node group).

Per GPU container it shows the search's plan (``pve_sglang.tuning.plan``): the space, the
budget, the objective and its bound, the first candidates; ``--dry`` stops there. The measured
loop (each try applied as the deploy applies flags, one restart through the startup watch, the
benchmark record and the server's metrics, the best kept in the tuned file) is not built yet:
a run without ``--dry`` stops at its first step, before any change.
"""

from pyinfra import host
from pyinfra.operations import python

from pve_sglang.config.settings import ContainerSettings, host_settings
from pve_sglang.tuning.plan import plan_lines


def not_yet() -> None:
    raise RuntimeError(
        "make tune: the measured search (a restart and a benchmark per try) is not built yet; "
        "`make tune ARGS=--dry` shows its plan; nothing was changed")


if "gpu_containers" in host.groups:
    settings = host_settings(ContainerSettings)
    pinned = frozenset(host.data.get("tune_pinned") or ())
    print("\n".join(plan_lines(host.name, settings, None, pinned)))
    python.call(name="Tuning search (measured)", function=not_yet)
