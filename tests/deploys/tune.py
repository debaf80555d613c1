"""Test deploy: ``make tune``'s own steps (``tasks.tune.tune_steps``: the scripts uploaded, then
the measured search against the deployed server) for containers without a GPU, whose server the
test replaced by the stand-in; each host's settings those of ``group_data/all.py`` and its
``settings`` overrides, its tuned file at its ``tuned_file``."""

import sys
from pathlib import Path

from pyinfra import host

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.project import load_defaults  # noqa: E402
from pve_sglang.config.settings import ContainerSettings  # noqa: E402
from tasks.tune import tune_steps  # noqa: E402


def view() -> tuple[ContainerSettings, list[dict]]:
    """A node's settings, as this host's data gives them; no GPU."""
    defaults = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**defaults, **host.data.get("settings", {})}), []


tune_steps(view()[0], frozenset(), view)
