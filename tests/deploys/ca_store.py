"""Test deploy: the container phase's extra CA certificates step
(``tasks.container.trust_ca_certificates``), with the settings of ``group_data/all.py`` and the
host's ``settings`` overrides (``ca_certificates``)."""

import sys
from pathlib import Path

from pyinfra import host

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.project import load_defaults  # noqa: E402
from pve_sglang.config.settings import ContainerSettings  # noqa: E402
from tasks.container import trust_ca_certificates  # noqa: E402

defaults = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
cs = ContainerSettings.model_validate({**defaults, **host.data.get("settings", {})})
trust_ca_certificates(cs)
