"""
gpu_checks.py on a machine without a GPU (and, here, without torch): it must run standalone,
print one line of JSON and say clearly what is missing. The CUDA failure paths are driven with a
stand-in torch module; the real results recorded on the H200 go through the GpuCheck fact and the verify operations.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from pyinfra.api import OperationError
from pyinfra_testing.util import FakeState

from fixtures.factutil import text
from harness import fact_value, op_commands
from pve_sglang.facts.nvidia import GpuCheck, NvidiaP2pMatrix, NvidiaTopoMatrix
from pve_sglang.facts.system import IommuAcs, VirtualMachineType
from pve_sglang.operations import verify
from pve_sglang.remote import gpu_checks

SCRIPT = Path(gpu_checks.__file__)
HAS_DRIVER = os.path.exists("/proc/driver/nvidia/version")
no_gpu_here = pytest.mark.skipif(HAS_DRIVER, reason="an NVIDIA driver is loaded on this machine")
STDLIB = set(sys.stdlib_module_names)


def run_script(*args: str, python: str = sys.executable) -> tuple[int, dict, str]:
    done = subprocess.run([python, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin"})
    out_lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(out_lines) == 1, done.stdout
    return done.returncode, json.loads(out_lines[0]), done.stderr


def _torch_importable() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def test_script_imports_only_stdlib_and_torch():
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            pytest.fail("relative import in a standalone script")
    assert names - STDLIB <= {"torch"}, names - STDLIB


@no_gpu_here
@pytest.mark.parametrize("check", ["cuda", "p2p"])
def test_script_without_gpu_reports_cleanly(check):
    rc, result, _ = run_script(check)
    assert result["check"] == check and result["ok"] is False
    assert result["env"]["driver_version"] is None and result["env"]["dev_nvidiactl"] is False
    if result["torch"] is None:
        assert rc == 2
        assert "torch is not importable" in result["error"]
        assert "venv that holds torch" in result["hint"]
    else:  # a CPU torch: no CUDA
        assert rc == 1
        assert result["error"]
        assert "No NVIDIA driver is visible" in (result["hint"] or "")


def test_script_help_and_bad_check():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "cuda" in done.stdout and "p2p" in done.stdout
    done = subprocess.run([sys.executable, str(SCRIPT), "nccl"], capture_output=True, text=True)
    assert done.returncode == 2


# --- diagnosis -------------------------------------------------------------------------------

DRIVER_ENV = {"driver_version": "570.133.20", "uvm_disable_hmm": "N", "dev_nvidiactl": True,
              "dev_nvidia_uvm": True, "dev_nvidia_gpus": ["nvidia0"], "CUDA_VISIBLE_DEVICES": None}
LIBCUDA = {"libcuda": True, "code": 3, "name": "CUDA_ERROR_NOT_INITIALIZED", "device_count": None,
           "error": None}


def test_diagnose_cuinit_error_3_points_at_uvm_disable_hmm():
    hint = gpu_checks.diagnose(DRIVER_ENV, LIBCUDA, "RuntimeError: no CUDA GPUs are available")
    assert "uvm_disable_hmm" in hint and "cuInit error 3" in hint and "currently N" in hint
    assert "options nvidia_uvm uvm_disable_hmm=1" in hint


def test_diagnose_missing_uvm_node():
    env = dict(DRIVER_ENV, dev_nvidia_uvm=False)
    assert "nvidia-modprobe -u -c0" in gpu_checks.diagnose(env, dict(LIBCUDA, code=999), None)


def test_diagnose_no_driver_and_no_libcuda_and_mismatch():
    none = dict(DRIVER_ENV, driver_version=None, dev_nvidiactl=False)
    assert "No NVIDIA driver" in gpu_checks.diagnose(none, LIBCUDA, None)
    assert "libcuda.so.1 cannot be loaded" in gpu_checks.diagnose(DRIVER_ENV, {"libcuda": False}, None)
    assert "same version" in gpu_checks.diagnose(DRIVER_ENV, dict(LIBCUDA, code=803), None)
    assert gpu_checks.diagnose(DRIVER_ENV, dict(LIBCUDA, code=0), None) is None


# --- the CUDA path with a stand-in torch ------------------------------------------------------

def _fake_torch(available: bool, warning: str | None = None) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.9.1+cu128"
    torch.version = types.SimpleNamespace(cuda="12.8")

    def is_available():
        if warning:
            warnings.warn(warning, UserWarning, stacklevel=2)
        return available

    torch.cuda = types.SimpleNamespace(is_available=is_available, device_count=lambda: 0,
                                       init=lambda: None)
    return torch


@pytest.mark.parametrize("check", ["cuda", "p2p"])
def test_cuda_init_error_3_is_reported_with_the_hmm_hint(monkeypatch, capsys, check):
    message = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some "
               "cuda functions before calling NumCudaDevices() that might have already set an "
               "error? Error 3: initialization error (Triggered internally at "
               "/pytorch/c10/cuda/CUDAFunctions.cpp:109.)")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False, message))
    monkeypatch.setattr(gpu_checks, "environment", lambda: dict(DRIVER_ENV))
    monkeypatch.setattr(gpu_checks, "cu_init", lambda: dict(LIBCUDA))
    rc = gpu_checks.main([check])
    result = json.loads(capsys.readouterr().out)
    assert rc == 1 and result["ok"] is False and result["device_count"] == 0
    assert "Error 3: initialization error" in result["error"]
    assert "uvm_disable_hmm" in result["hint"]


def test_cpu_only_torch_is_named(monkeypatch, capsys):
    torch = _fake_torch(False)
    torch.version = types.SimpleNamespace(cuda=None)
    monkeypatch.setitem(sys.modules, "torch", torch)
    rc = gpu_checks.main(["cuda"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 1 and "CPU-only build" in result["error"]


# --- the recorded H200 results, through the fact and the verify operations that read them ---

VENV_PYTHON, UPLOADED = "/opt/sglang/venv/bin/python", "/opt/sglang/gpu_checks.py"


@pytest.fixture
def executing(monkeypatch):
    """Verify operations check only at execution; at prepare time they are only planned."""
    monkeypatch.setattr(FakeState, "is_executing", True, raising=False)


def test_recorded_h200_cuda_check_passes_verify_for_its_one_gpu(executing, caplog):
    result = fact_value(GpuCheck, text("h200", "gpu_checks_cuda.json"))
    facts = {GpuCheck: result}
    with caplog.at_level(logging.INFO):
        assert op_commands(verify.cuda_initialises, python=VENV_PYTHON, script=UPLOADED,
                           expected=1, facts=facts) == []
    assert "CUDA initialised on 1 GPUs (NVIDIA H200), torch 2.11.0+cu130" in caplog.text
    with pytest.raises(OperationError, match="CUDA check failed.*uvm_disable_hmm"):
        op_commands(verify.cuda_initialises, python=VENV_PYTHON, script=UPLOADED, expected=2,
                    facts=facts)


@pytest.mark.parametrize("name", ["gpu_checks_p2p_256mib.json", "gpu_checks_p2p_1024mib.json"])
def test_recorded_h200_p2p_check_passes_strict_verify_with_its_bandwidth(executing, caplog, name):
    checks = fact_value(GpuCheck, text("h200", name))
    facts = {
        GpuCheck: checks,
        NvidiaTopoMatrix: fact_value(NvidiaTopoMatrix, text("h200", "nvidia_smi_topo_m.txt")),
        (NvidiaP2pMatrix, ("r",)): fact_value(NvidiaP2pMatrix, text("h200", "nvidia_smi_topo_p2p_r.txt")),
        (NvidiaP2pMatrix, ("w",)): fact_value(NvidiaP2pMatrix, text("h200", "nvidia_smi_topo_p2p_w.txt")),
        VirtualMachineType: None,
        IommuAcs: fact_value(IommuAcs, text("h200", "raw_idle", "fact_IommuAcs.txt")),
    }
    with caplog.at_level(logging.INFO):
        assert op_commands(verify.p2p_preflight, python=VENV_PYTHON, script=UPLOADED, strict=True,
                           facts=facts) == []
    gbps = checks["local"][0]["gbps"]
    assert gbps > 1000  # GB/s of one copy on one H200
    assert f"[testhost] GPU0 {gbps:11.1f}\n" in caplog.text  # the measured copy, in the matrix
    assert "nothing to check (1 GPU)" in caplog.text and "P2P:" not in caplog.text


@no_gpu_here
@pytest.mark.skipif(not _torch_importable(), reason="torch not installed here")
def test_real_cpu_torch_reports_no_cuda():  # pragma: no cover - only where torch is installed
    rc, result, _ = run_script("cuda")
    assert rc == 1 and result["torch"] and result["error"]
