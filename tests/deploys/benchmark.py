"""Test deploy: the verify phase's own benchmark step (``tasks.verify.benchmark_check``: the GPU
sampler, the record wrapper, the benchmark at each level, the history) against the server the
test started, with the settings of ``group_data/all.py`` and the host's ``settings`` overrides."""

import sys
from pathlib import Path

from pyinfra import host

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.project import load_defaults  # noqa: E402
from pve_sglang.config.settings import ContainerSettings  # noqa: E402
from tasks.verify import benchmark_check  # noqa: E402

defaults = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
cs = ContainerSettings.model_validate({**defaults, **host.data.get("settings", {})})
benchmark_check(cs.benchmark, cs.server, "127.0.0.1")
