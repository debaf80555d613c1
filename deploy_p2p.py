"""
GPU peer-to-peer preflight, as its own deploy: reads the GPU topology and the driver's P2P
status (``nvidia-smi topo -m`` / ``-p2p r`` / ``-p2p w``), the virtualisation and the PCIe ACS
state, and, when host data ``p2p_python`` names a python that holds torch, uploads
``pve_sglang/remote/gpu_checks.py`` and measures peer access and copy bandwidth for every GPU pair.
Prints one report per host: links, bandwidth matrix, warnings and advice. Changes nothing on
the host except the uploaded script.

    pyinfra inventory.py deploy_p2p.py --limit pve_hosts
    pyinfra @local deploy_p2p.py
    pyinfra @local deploy_p2p.py --data p2p_python=/opt/sglang/venv/bin/python

Host data (all optional):
+ ``p2p_python``: python with torch on the host; without it the bandwidth part is skipped.
+ ``p2p_size_mib`` (256), ``p2p_iters`` (5), ``p2p_timeout`` (600 s): the copy test.
+ ``p2p_script_path``: where the script goes (default ``/tmp/pve_sglang_gpu_checks.py``).
+ ``p2p_strict``: fail the host when the report has warnings.

Runs on the hosts of group ``pve_hosts`` and on ``@local``; other hosts are skipped.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.operations import files

from pve_sglang import remote
from pve_sglang.operations import verify

GROUP = "pve_hosts"
SCRIPT = remote.source(remote.GPU_CHECKS)


def _applies() -> bool:
    return host.name == "@local" or host.name.startswith("@local/") or GROUP in host.groups


def _truthy(value) -> bool:
    """Host data from --data arrives as a string: "0", "false" and "no" are false."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


if _applies():
    p2p_python = host.data.get("p2p_python")
    remote_script = host.data.get("p2p_script_path", "/tmp/pve_sglang_gpu_checks.py")
    if p2p_python:
        files.put(
            name="Upload gpu_checks.py for the P2P bandwidth check",
            src=str(SCRIPT),
            dest=remote_script,
            mode="0644",
        )
    verify.p2p_preflight(
        name="GPU P2P preflight report",
        python=p2p_python,
        script=remote_script,
        size_mib=int(host.data.get("p2p_size_mib", 256)),
        iters=int(host.data.get("p2p_iters", 5)),
        timeout=int(host.data.get("p2p_timeout", 600)),
        strict=_truthy(host.data.get("p2p_strict", False)),
    )
else:
    logger.info(f"[{host.name}] not in group {GROUP}: P2P preflight skipped")
