"""Test deploy: ``make tune``'s own steps (``tasks.tune.tune_steps``: the scripts uploaded, then
the measured search against the deployed server) for containers without a GPU, whose server the
test replaced by the stand-in; each host's settings those of ``group_data/all.py`` and its
``settings`` overrides, its tuned file at its ``tuned_file``. Where the inventory holds a
gateway (group ``gateways``: its ``settings``, ``gateway_worker_list`` and ``check_timeout_s``
as ``tests/deploys/gateway.py`` takes them), its workers are replicas tuned as one, behind it
(``tasks.tune.Replicas``); the gateway's own host runs nothing."""

import sys
from pathlib import Path

from pyinfra import host
from pyinfra.context import state

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.config.gateway import validate_gateway  # noqa: E402
from pve_sglang.config.settings import ContainerSettings  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from tasks.tune import Replicas, tune_steps  # noqa: E402


def view() -> tuple[ContainerSettings, list[dict]]:
    """A node's settings, as this host's data gives them; no GPU."""
    defaults = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**defaults, **host.data.get("settings", {})}), []


def replicas() -> Replicas | None:
    """The inventory's gateway's workers, as ``tasks.tune.replicas_behind`` finds them."""
    gateways = state.inventory.get_group("gateways", [])
    if not gateways:
        return None
    gw = gateways[0]
    gs = validate_gateway(gw.name, gw.data.get("settings", {}), load_defaults())
    names = [str(w["name"]) for w in gw.data.get("gateway_worker_list")]
    return Replicas.of(gw.name, gs, names, int(gw.data.get("check_timeout_s") or 60))


if "gateways" not in host.groups:
    settings, _ = view()
    tune_steps(settings.server, settings.benchmark, frozenset(), view, replicas())
