"""Test deploy: restart the server unit, then the verify phase's own server checks
(``tasks.verify.server_checks``: the startup watch and the chat completion), with the settings
of ``group_data/all.py`` and the host's ``settings`` overrides."""

import sys
from pathlib import Path

from pyinfra import host
from pyinfra.operations import server

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.server.unit_text import unit_name  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from pve_sglang.config.settings import ContainerSettings  # noqa: E402
from tasks.verify import server_checks  # noqa: E402

defaults = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
cs = ContainerSettings.model_validate({**defaults, **host.data.get("settings", {})})
# As the container phase does right before the verify phase, after a change.
server.shell(name=f"Restart {unit_name(cs)}",
             commands=[f"systemctl reset-failed {unit_name(cs)}; systemctl restart {unit_name(cs)}"])
for _, check in server_checks(cs, "127.0.0.1"):
    check()
