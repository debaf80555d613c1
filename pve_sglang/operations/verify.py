"""Verify operations: they read, report and fail loudly, and never count as a change."""

from __future__ import annotations

import time

import gevent

from pyinfra import host, logger
from pyinfra.api import OperationError, operation
from pyinfra.context import state
from pyinfra.facts.server import Command

from ..bench_serving import bench_shell, parse_bench_output, summary_table
from ..facts.nvidia import GpuCheck, NvidiaP2pMatrix, NvidiaTopoMatrix
from ..facts.system import IommuAcs, VirtualMachineType
from ..facts.verify import HttpStatus, VisibleGpus
from ..p2p import build_report, format_report
from ..settings import ContainerSettings, settings_for
from ..sglang_launch import mask_text

HMM_HINT = (
    "if nvidia-smi works but CUDA does not initialise (cuInit error 3), nvidia_uvm runs with "
    "HMM on: see the host phase's uvm_disable_hmm warning"
)


def _after_execution(what: str) -> bool:
    """Checks run once the deploy has run; at prepare time (--dry) they are only planned."""
    if not state.is_executing:
        host.noop(f"{what}: checked after the run")
        return False
    return True


@operation()
def gpus_visible(expected: int):
    """Fail unless the container sees EXPECTED GPUs through nvidia-smi."""
    if _after_execution("GPUs visible"):
        lines = host.get_fact(VisibleGpus)
        if len(lines) < expected:
            raise OperationError(
                f"the container sees {len(lines)} of {expected} GPUs (nvidia-smi -L): check "
                "the passthrough (devN / lxc.* lines) and the user-space driver version"
            )
        logger.info(f"{host.name}: {len(lines)} GPUs visible: " + "; ".join(lines))
        host.noop(f"{len(lines)} GPUs visible")
    yield from ()


@operation()
def cuda_initialises(python: str, script: str, expected: int):
    """Fail unless torch initialises CUDA and runs a matmul on every GPU."""
    if _after_execution("CUDA on every GPU"):
        result = host.get_fact(GpuCheck, python=python, script=script, check="cuda")
        if not result or not result.get("ok") or result.get("device_count", 0) < expected:
            error = (result or {}).get("error") or "no result"
            raise OperationError(f"CUDA check failed: {error}; {HMM_HINT}")
        names = ", ".join(d["name"] for d in result["devices"])
        logger.info(f"{host.name}: CUDA initialised on {result['device_count']} GPUs ({names}), "
                    f"torch {result.get('torch')}")
        host.noop("CUDA initialised on every GPU")
    yield from ()


@operation()
def p2p_preflight(
    python: str | None, script: str, size_mib: int = 256, iters: int = 5, timeout: int = 600,
    strict: bool = False,
):
    """
    Report P2P between every GPU pair: the topology and the driver's P2P status (nvidia-smi
    topo), and, when PYTHON (with torch) is given, peer access and copy bandwidth measured by
    SCRIPT (gpu_checks.py). Warns where the topology promises P2P that is missing (a VM, ACS);
    STRICT fails the host then.
    """
    if _after_execution("P2P between GPUs"):
        checks = None
        if python:
            checks = host.get_fact(GpuCheck, python=python, script=script, check="p2p",
                                   args=("--size-mib", str(size_mib), "--iters", str(iters)),
                                   timeout=timeout)
        report = build_report(
            host.get_fact(NvidiaTopoMatrix),
            host.get_fact(NvidiaP2pMatrix, mode="r"),
            host.get_fact(NvidiaP2pMatrix, mode="w"),
            checks=checks,
            virt=host.get_fact(VirtualMachineType),
            iommu_acs=host.get_fact(IommuAcs),
        )
        logger.info("\n".join(f"[{host.name}] {line}" for line in format_report(report).splitlines()))
        for warning in report["warnings"]:
            logger.warning(f"[{host.name}] P2P: {warning}")
        if strict and report["warnings"]:
            raise OperationError(f"P2P preflight: {len(report['warnings'])} warning(s)")
        host.noop("P2P report printed")
    yield from ()


@operation()
def server_healthy(url: str, env_file: str, timeout_s: int, poll_s: float = 10.0):
    """Wait until the server answers URL with 200, showing progress; fail after TIMEOUT_S."""
    if _after_execution("server health"):
        start = time.monotonic()
        last_report = start
        while True:
            status = host.get_fact(HttpStatus, url=url, env_file=env_file)
            waited = time.monotonic() - start
            if status == 200:
                logger.info(f"{host.name}: {url} answered 200 after {waited:.0f}s")
                break
            if waited > timeout_s:
                raise OperationError(
                    f"{url} did not answer 200 within {timeout_s}s (last: {status}); see "
                    "`journalctl -u` of the server unit in the container"
                )
            if time.monotonic() - last_report >= 60:
                logger.info(f"{host.name}: waiting for {url} ({waited:.0f}s, last: {status})")
                last_report = time.monotonic()
            gevent.sleep(poll_s)  # other hosts go on meanwhile
        host.noop("server answers /health")
    yield from ()


@operation()
def benchmark(runs: dict[int, list[str]], env_file: str):
    """Run the benchmark once per concurrency (RUNS: argv per level) and print tok/s per level."""
    if _after_execution("benchmark"):
        rows = []
        for concurrency, argv in sorted(runs.items()):
            logger.info(f"{host.name}: benchmark at concurrency {concurrency}...")
            output = host.get_fact(Command, command=bench_shell(argv, env_file))
            try:
                rows.append({"concurrency": concurrency, **parse_bench_output(output)})
            except ValueError as error:
                # The benchmark holds the key (OPENAI_API_KEY): none of its output is trusted.
                secrets = settings_for(host.data, ContainerSettings).secrets
                raise OperationError(f"benchmark at concurrency {concurrency}: {error}:\n"
                                     + mask_text(output, secrets)[-2000:]) from None
        logger.info(f"{host.name}: benchmark summary\n" + summary_table(rows))
        host.noop("benchmark ran")
    yield from ()
