"""The host preflight and the verify phase's GPU checks, on a real GPU machine through @local.

    pyinfra @local tests/device/verify_gpu_local.py -y --data python=/path/to/python-with-torch

Not part of the CPU test suite: run on a machine with an NVIDIA GPU (the device machine). It
reads the facts the host phase uses, prints what the preflight makes of them, and runs the
verify operations (GPUs visible, CUDA initialises on every GPU) against this machine.
"""

import json
from pathlib import Path

from pyinfra import host, logger

from pve_sglang.operations import verify
from pve_sglang.preflight import gpu_host
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import HostSettings, settings_for

REPO = Path(__file__).resolve().parents[2]
settings = settings_for({**load_defaults(), "platform": "lxc"}, HostSettings)
gpu = gpu_host(host, settings)
logger.info("preflight: " + json.dumps(gpu.__dict__, default=str))
python = host.data.get("python") or "python3"
verify.gpus_visible(name="GPUs visible", expected=len(gpu.gpus))
verify.cuda_initialises(name="CUDA initialises on every GPU", python=python,
                        script=str(REPO / "pve_sglang" / "remote" / "gpu_checks.py"), expected=len(gpu.gpus))
