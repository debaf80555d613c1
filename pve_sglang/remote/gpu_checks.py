#!/usr/bin/env python3
"""
GPU checks that run where the GPUs are used: uploaded into the container (or run on the host)
and started with the python of the venv that holds torch. Standard library and torch only: this
file imports nothing from the project.

    python3 gpu_checks.py cuda             # CUDA init + a small matmul on every GPU
    python3 gpu_checks.py p2p [--size-mib 256] [--iters 5]

Each prints ONE line of JSON on stdout (progress and warnings go to stderr) and exits 0 when the
check passed, 1 when it ran and failed, 2 when it could not run (no torch).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
import warnings

UVM_DISABLE_HMM = "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
DRIVER_VERSION = "/proc/driver/nvidia/version"

# CUresult codes cuInit may return (cuda.h)
CU_ERRORS = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}

HMM_HINT = (
    "CUDA could not initialise although the NVIDIA driver is loaded (cuInit error {code}, or "
    "'no CUDA devices' while nvidia-smi works). A known cause is the nvidia_uvm HMM code path on "
    "some kernels: on the HOST, check {path} (currently {hmm}); 'N' means HMM is in use. Set "
    "'options nvidia_uvm uvm_disable_hmm=1' in /etc/modprobe.d/nvidia-uvm.conf, stop every GPU "
    "process and container, reload nvidia_uvm (modprobe -r nvidia_uvm && modprobe nvidia_uvm; "
    "nvidia-modprobe -u -c0), and update-initramfs -u -k all. Also check that /dev/nvidia-uvm "
    "exists here and that this container may open it."
)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _driver_version() -> str | None:
    text = _read(DRIVER_VERSION)
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            for token in line.split():
                parts = token.split(".")
                if len(parts) in (2, 3) and all(part.isdigit() for part in parts):
                    return token
    return None


def environment() -> dict:
    """What the process can see of the driver, without touching CUDA."""
    return {
        "driver_version": _driver_version(),
        "uvm_disable_hmm": _read(UVM_DISABLE_HMM),
        "dev_nvidiactl": os.path.exists("/dev/nvidiactl"),
        "dev_nvidia_uvm": os.path.exists("/dev/nvidia-uvm"),
        "dev_nvidia_gpus": sorted(
            name
            for name in (os.listdir("/dev") if os.path.isdir("/dev") else [])
            if name.startswith("nvidia") and name[6:].isdigit()
        ),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def cu_init() -> dict:
    """cuInit(0) and cuDeviceGetCount through libcuda itself, for the exact error code."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return {"libcuda": False, "code": None, "name": None, "device_count": None,
                "error": str(error)}
    code = int(libcuda.cuInit(0))
    count = ctypes.c_int(0)
    if code == 0:
        libcuda.cuDeviceGetCount(ctypes.byref(count))
    return {"libcuda": True, "code": code, "name": CU_ERRORS.get(code, f"CUresult {code}"),
            "device_count": count.value if code == 0 else None, "error": None}


def diagnose(env: dict, cu: dict, error: str | None) -> str | None:
    """A hint for the operator, or None."""
    if env["driver_version"] is None and not env["dev_nvidiactl"]:
        return ("No NVIDIA driver is visible here (/proc/driver/nvidia/version and /dev/nvidiactl "
                "are missing): load the driver on the host and pass the device nodes through.")
    if not cu.get("libcuda"):
        return ("libcuda.so.1 cannot be loaded: the user-space driver is not installed here, or "
                "not in the linker path. It must be the exact version of the host's kernel "
                f"module ({env['driver_version']}).")
    code = cu.get("code")
    text = (error or "").lower()
    if code == 803 or "mismatch" in text:
        return ("The user-space driver here does not match the kernel module "
                f"({env['driver_version']}): install the same version.")
    init_failed = code in (3, 100, 999) or any(
        marker in text for marker in ("error 3", "initialization error", "no cuda gpus",
                                      "no cuda-capable device", "cuinit")
    )
    if init_failed:
        if not env["dev_nvidia_uvm"]:
            return ("/dev/nvidia-uvm is missing here: on the host run 'nvidia-modprobe -u -c0' "
                    "(before the containers start) and pass /dev/nvidia-uvm and "
                    "/dev/nvidia-uvm-tools through.")
        return HMM_HINT.format(code=code, path=UVM_DISABLE_HMM, hmm=env["uvm_disable_hmm"])
    return None


def emit(result: dict) -> int:
    print(json.dumps(result, sort_keys=True))
    sys.stdout.flush()
    return 0 if result.get("ok") else (2 if result.get("torch") is None else 1)


def import_torch(result: dict):
    try:
        import torch  # noqa: PLC0415
    except ImportError as error:
        result.update(
            ok=False,
            torch=None,
            error=f"torch is not importable with {sys.executable}: {error}",
            hint="Run this check with the python of the venv that holds torch "
                 "(e.g. /opt/sglang/venv/bin/python).",
        )
        return None
    result.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    return torch


def _cuda_available(torch) -> tuple[int, str | None]:
    """(device count, error text): torch turns CUDA init failures into warnings or errors."""
    if torch.version.cuda is None:
        return 0, f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            available = torch.cuda.is_available()
            count = torch.cuda.device_count() if available else 0
            if available:
                torch.cuda.init()
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            return 0, f"{type(error).__name__}: {error}"
    messages = [str(warning.message) for warning in caught]
    if count == 0:
        return 0, " | ".join(messages) or "torch.cuda.is_available() is False: no CUDA devices"
    return count, None


def check_cuda(args: argparse.Namespace) -> int:
    env = environment()
    cu = cu_init()
    result: dict = {"check": "cuda", "python": sys.version.split()[0], "env": env, "cuInit": cu}
    torch = import_torch(result)
    if torch is None:
        driver_hint = diagnose(env, cu, None)
        if driver_hint:
            result["hint"] = f"{result['hint']} Also: {driver_hint}"
        return emit(result)
    count, error = _cuda_available(torch)
    result.update(device_count=count, devices=[], error=error)
    if error:
        result.update(ok=False, hint=diagnose(env, cu, error))
        return emit(result)
    ok = True
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        device = {
            "index": index,
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_mib": props.total_memory // (1024 * 1024),
            "multiprocessors": props.multi_processor_count,
        }
        try:
            generator = torch.Generator().manual_seed(index)
            a = torch.randn(args.matmul_n, args.matmul_n, generator=generator)
            b = torch.randn(args.matmul_n, args.matmul_n, generator=generator)
            expected = a @ b
            started = time.perf_counter()
            got = (a.to(f"cuda:{index}") @ b.to(f"cuda:{index}")).cpu()
            torch.cuda.synchronize(index)
            device["matmul_ms"] = round((time.perf_counter() - started) * 1000, 3)
            device["matmul_max_abs_err"] = float((got - expected).abs().max())
            device["matmul_ok"] = bool(torch.allclose(got, expected, rtol=1e-2, atol=1e-2))
        except Exception as error:  # noqa: BLE001
            device.update(matmul_ok=False, error=f"{type(error).__name__}: {error}")
        ok = ok and device["matmul_ok"]
        result["devices"].append(device)
    result["ok"] = ok
    if not ok:
        result["hint"] = "A matmul on a GPU failed or gave wrong results: see devices[].error."
    return emit(result)


def _copy_gbps(torch, src, dst, iters: int) -> float:
    """Bytes copied per second (GB/s, 1e9), timed with CUDA events on the source's stream."""
    src_index = src.device.index
    with torch.cuda.device(src_index):
        dst.copy_(src)  # warm-up: peer mapping, clocks
        torch.cuda.synchronize(src_index)
        torch.cuda.synchronize(dst.device.index)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        torch.cuda.synchronize(dst.device.index)
        seconds = start.elapsed_time(end) / 1000.0
    return src.numel() * src.element_size() * iters / seconds / 1e9


def check_p2p(args: argparse.Namespace) -> int:
    env = environment()
    cu = cu_init()
    result: dict = {"check": "p2p", "python": sys.version.split()[0], "env": env, "cuInit": cu,
                    "size_mib": args.size_mib, "iters": args.iters}
    torch = import_torch(result)
    if torch is None:
        return emit(result)
    count, error = _cuda_available(torch)
    result.update(device_count=count, error=error, pairs=[], local=[], matrix_gbps=[])
    if error:
        result.update(ok=False, hint=diagnose(env, cu, error))
        return emit(result)
    numel = args.size_mib * 1024 * 1024
    buffers = {}
    for index in range(count):
        generator = torch.Generator(device=f"cuda:{index}").manual_seed(1234 + index)
        buffers[index] = torch.randint(0, 256, (numel,), dtype=torch.uint8,
                                       device=f"cuda:{index}", generator=generator)
    matrix = [[None] * count for _ in range(count)]
    ok = True
    for src in range(count):
        for dst in range(count):
            entry: dict = {"src": src, "dst": dst}
            try:
                if src != dst:
                    entry["can_access_peer"] = bool(torch.cuda.can_device_access_peer(src, dst))
                target = torch.empty(numel, dtype=torch.uint8, device=f"cuda:{dst}")
                print(f"copy GPU{src} -> GPU{dst} ({args.size_mib} MiB x {args.iters})",
                      file=sys.stderr)
                entry["gbps"] = round(_copy_gbps(torch, buffers[src], target, args.iters), 2)
                want = int(buffers[src].sum(dtype=torch.int64))
                got = int(target.sum(dtype=torch.int64))
                entry["data_ok"] = want == got
                del target
            except Exception as error:  # noqa: BLE001
                entry.update(gbps=None, data_ok=False, error=f"{type(error).__name__}: {error}")
            ok = ok and entry["data_ok"]
            matrix[src][dst] = entry.get("gbps")
            (result["local"] if src == dst else result["pairs"]).append(entry)
    result.update(ok=ok, matrix_gbps=matrix)
    if not ok:
        result["hint"] = ("A device-to-device copy failed or delivered wrong data: with P2P on, "
                          "that points at the IOMMU/ACS (try iommu=pt) or a VM's VFIO passthrough.")
    return emit(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    sub = parser.add_subparsers(dest="check", required=True)
    cuda = sub.add_parser("cuda", help="initialise CUDA and run a small matmul on every GPU")
    cuda.add_argument("--matmul-n", type=int, default=512)
    p2p = sub.add_parser("p2p", help="peer access and copy bandwidth for every GPU pair")
    p2p.add_argument("--size-mib", type=int, default=256)
    p2p.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    return check_cuda(args) if args.check == "cuda" else check_p2p(args)


if __name__ == "__main__":
    sys.exit(main())
