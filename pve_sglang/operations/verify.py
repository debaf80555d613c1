"""Verify operations: they read, report and fail loudly, and never count as a change."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

import gevent

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.context import state
from pyinfra.facts.server import Command

from pve_sglang.server import bench_history
from pve_sglang.server.bench import (
    bench_exit_status,
    bench_shell,
    gpu_columns,
    metric_columns,
    metrics_problem,
    record_row,
    summary_table,
)
from pve_sglang.facts.nvidia import GpuCheck, NvidiaP2pMatrix, NvidiaTopoMatrix
from pve_sglang.facts.system import IommuAcs, VirtualMachineType
from pve_sglang.facts.container import UnitState
from pve_sglang.facts.verify import GenerationCheck, HttpStatus, JournalTail, StartupWatch, VisibleGpus
from pve_sglang.gpu.p2p import build_report, format_report
from pve_sglang.config.settings import ContainerSettings, host_settings
from pve_sglang.stack.lock import Lock
from pve_sglang.operations.venv import lock_differences, venv_state
from pve_sglang.remote import bench_record, gpu_sampler, marked_json, server_metrics
from pve_sglang.remote.sglang_launch import mask_text
from pve_sglang.server.startup_log import READY_LINE, Progress, bad_logprobs, degenerate, diagnose, duration

HMM_HINT = (
    "if nvidia-smi works but CUDA does not initialise (cuInit error 3), nvidia_uvm runs with "
    "HMM on: see the host phase's uvm_disable_hmm warning"
)


#: Seconds one call of the startup watch follows the journal at most (it returns at once on a
#: verdict): a log line per call at worst, while other hosts go on.
WATCH_CALL_S = 20.0


def _after_execution(what: str) -> bool:
    """Checks run once the deploy has run; at prepare time (--dry) they are only planned."""
    if not state.is_executing:
        host.noop(f"{what}: checked after the run")
        return False
    return True


#: Packages named when the verify phase says what a container runs.
STACK_SHOWN = ("sglang", "torch", "flashinfer-python", "sgl-kernel", "transformers", "triton",
               "xgrammar", "nvidia-nccl-cu12", "nvidia-cudnn-cu12")


@operation()
def stack_as_locked(python: str, tools: str, lock: Lock):
    """
    Say what the container runs: the lock it was made from and the versions of its main
    packages, read from the venv; fail when the venv differs from LOCK, naming each package.
    Checked once the deploy has run.

    + python: the sglang venv's Python
    + tools: the directory of the helper scripts the venv's state is read with
    + lock: the parsed lock (``stack_lock.lock_for``)

    **Example:**

    .. code:: python

        from pve_sglang.stack import lock as stack_lock
        from pve_sglang.operations import verify

        verify.stack_as_locked(name="The stack is the locked set",
                               python="/opt/sglang/venv/bin/python", tools="/opt/sglang",
                               lock=stack_lock.lock_for(stack_lock.default_key()))
    """
    if not _after_execution("the stack is the locked set"):
        return
    installed = venv_state(python, tools)["packages"]
    differences = lock_differences(installed, lock.packages)
    if differences:
        raise OperationError(f"the venv differs from lock {lock.id} ({lock.path.name}) in "
                             f"{len(differences)} packages: {', '.join(differences[:10])}")
    # No difference: the venv runs exactly the lock's versions.
    shown = ", ".join(f"{name} {lock.packages[name]}" for name in STACK_SHOWN if name in lock.packages)
    logger.info(f"{host.name}: runs lock {lock.id} ({lock.path.name}): {len(lock.packages)} packages "
                f"as locked: {shown}")
    host.noop(f"the venv is lock {lock.id}: {shown}")
    yield from ()


@operation()
def gpus_visible(expected: int):
    """
    Fail unless the container sees EXPECTED GPUs through ``nvidia-smi -L``. Checked once the
    deploy has run; a plan (``--dry``) only lists it.

    + expected: the number of GPUs passed through to the container

    **Example:**

    .. code:: python

        from pve_sglang.operations import verify

        verify.gpus_visible(name="8 GPUs visible in the container", expected=8)
    """
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
    """
    Fail unless torch initialises CUDA and runs a matmul on every GPU, and sees EXPECTED of them.
    Checked once the deploy has run.

    + python: the sglang venv's Python (with torch)
    + script: the uploaded GPU checks (``gpu_checks.py``) in the container
    + expected: the number of GPUs CUDA must see

    **Example:**

    .. code:: python

        from pve_sglang.operations import verify

        verify.cuda_initialises(
            name="CUDA initialises on every GPU",
            python="/opt/sglang/venv/bin/python",
            script="/opt/sglang/gpu_checks.py",
            expected=8,
        )
    """
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
    SCRIPT. Warns where the topology promises P2P that is missing (a VM, ACS). Checked once the
    deploy has run.

    + python: a Python with torch that runs SCRIPT; ``None`` reports nvidia-smi's view only
    + script: the uploaded GPU checks (``gpu_checks.py``) in the container
    + size_mib: the size of each measured copy, in MiB
    + iters: copies measured per GPU pair
    + timeout: seconds the measurement may take
    + strict: fail the host when the report has a warning (otherwise it only warns)

    **Example:**

    .. code:: python

        from pve_sglang.operations import verify

        verify.p2p_preflight(
            name="P2P between the 8 GPUs",
            python="/opt/sglang/venv/bin/python",
            script="/opt/sglang/gpu_checks.py",
            strict=True,
        )
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
    """
    Wait until the server answers URL with 200, logging progress every minute; fail after
    TIMEOUT_S. Other hosts go on while one waits. Checked once the deploy has run.

    + url: the health URL, asked from inside the container
    + env_file: the server's env file; its API key (if any) is sent to curl on stdin
    + timeout_s: seconds to wait for a 200 (loading a large model takes long)
    + poll_s: seconds between two requests

    **Example:**

    .. code:: python

        from pve_sglang.operations import verify

        verify.server_healthy(
            name="Server answers /health (up to 3600s)",
            url="http://127.0.0.1:30000/health",
            env_file="/etc/sglang/sglang.env",
            timeout_s=3600,
        )
    """
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


def _unit_words(state: dict) -> str:
    """``failed (Result=exit-code, exit status 1, 2 restarts)`` from a unit's state."""
    active, sub = state.get("ActiveState") or state.get("active"), state.get("SubState") or state.get("sub")
    words = [f"Result={state.get('Result') or state.get('result')}"]
    if state.get("ExecMainStatus") not in (None, "", "0"):
        words.append(f"exit status {state['ExecMainStatus']}")
    restarts = state.get("NRestarts") or state.get("restarts")
    if restarts not in (None, "", "0"):
        words.append(f"{restarts} restarts")
    return f"{active}/{sub} ({', '.join(words)})"


def startup_failure(unit: str, what: str, since: int | None, progress: Progress | None = None,
                    now: float | None = None, shown: int = 25) -> str:
    """The words of a failed start: WHAT happened, the time per phase, the unit's last journal
    lines (since SINCE, microseconds) and the hints ``startup_log.HINTS`` finds in them."""
    tail = host.get_fact(JournalTail, unit=unit, since=since)
    parts = [f"{unit} {what}"]
    if progress is not None and now is not None:
        parts[0] += f" during {progress.phase}, {duration(now - progress.start)} after its start"
        parts.append(f"time per phase: {progress.summary(now)}")
    parts.append(f"last journal lines of {unit}:\n" + "\n".join(f"    {line.replace(chr(13), '')}" for line in tail[-shown:]))
    hints = diagnose(tail)
    parts += [f"hint ({hint.name}): {hint.hint}\n    seen: {line[:200]}" for hint, line in hints]
    if not hints:
        parts.append("no known cause matched these lines (startup_log.HINTS)")
    return "\n".join(parts)


#: What a failed check does before the host fails (``stack_switch.judged``: a rollback): given the
#: failure, it returns the error to raise, or None when the failure is judged later (a node of
#: several, with its group: ``stack_switch.group_judged``) and the host goes on.
OnFailure = Callable[[OperationError], OperationError | None]


def _failed(failure: OperationError, on_failure: OnFailure | None):
    """Fail the host with what ON_FAILURE makes of FAILURE, unless it judges it later (None)."""
    raised = on_failure(failure) if on_failure else failure
    if raised is not None:
        yield from host_fails(raised)
        return
    host.noop(f"failed, judged later: {str(failure).splitlines()[0][:200]}")


def _fails(state, host) -> bool:  # pyinfra passes both to a FunctionCommand naming them
    return False


def host_fails(error: OperationError):
    """At execution, fail this host alone with ERROR's words (the journal tail, the hint) as
    its error line: an exception raised out of an operation here would end the run of every
    host, after a gevent greenlet's traceback that buries the message."""
    host.log_styled(str(error), fg="red", log_func=logger.error)
    yield FunctionCommand(_fails, (), {})


@operation()
def server_started(unit: str, health_url: str, env_file: str, script: str, timeout_s: int,
                   stall_s: int, on_failure: OnFailure | None = None):
    """
    Follow the server's start in its journal until /health answers 200: each phase with its
    time (weights with shards done, rate and ETA, KV cache, autotune, CUDA graphs), then the
    time per phase. The verdict rests on the server's answer; the log gives progress and
    hints. Fails at once, with the last journal lines and a hint for known causes
    (``startup_log.HINTS``), when the unit fails or restarts, when its log is silent and
    /health does not answer 200 for STALL_S seconds, or after TIMEOUT_S. A server already
    answering /health is reported as serving. Other hosts go on meanwhile. Checked once the
    deploy has run.

    + unit: the server's systemd unit, e.g. ``sglang.service``
    + health_url: its /health URL, asked from inside the container
    + env_file: the server's env file; its API key (if any) is read by SCRIPT, never on argv
    + script: the uploaded ``remote/startup_watch.py``
    + timeout_s: seconds from the unit's start to ready at most
    + stall_s: seconds the log may stay silent (and /health not 200) before the start is
      called stuck
    + on_failure: called with the failure before the host fails (a failed upgrade's rollback),
      returns the error raised; None raises the failure

    **Example:**

    .. code:: python

        from pve_sglang.operations import verify

        verify.server_started(
            name="sglang.service starts and answers /health",
            unit="sglang.service",
            health_url="http://127.0.0.1:30000/health",
            env_file="/etc/sglang/sglang.env",
            script="/opt/sglang/startup_watch.py",
            timeout_s=3600,
            stall_s=900,
        )
    """
    if _after_execution("server start"):
        try:
            watch_start(unit, health_url, env_file, script, timeout_s, stall_s)
        except OperationError as failure:
            yield from _failed(failure, on_failure)
            return
        host.noop("the server started and answers /health")
    yield from ()


def watch_start(unit: str, health_url: str, env_file: str, script: str, timeout_s: int,
                stall_s: int) -> None:
    """At execution: follow the unit's start in its journal until it is ready
    (``server_started``); raises ``OperationError`` with the journal lines and hints."""
    unit_state = host.get_fact(UnitState, unit=unit)
    started = unit_state.get("started")
    if unit_state.get("active") != "active" or not started:
        raise OperationError(startup_failure(
            unit, f"is not running: {_unit_words(unit_state)}", started))
    progress = Progress(start=started / 1e6)
    cursor, first = "", True
    now = time.time()
    while True:
        deadline = min(progress.last_line + stall_s, progress.start + timeout_s)
        watch = host.get_fact(
            StartupWatch, script=script, unit=unit, start=started, cursor=cursor,
            health_url=health_url, env_file=env_file,
            max_wait=math.ceil(max(1.0, min(WATCH_CALL_S, deadline - now + 0.5))),
            return_on=(re.escape(READY_LINE),),
        )
        now, cursor = watch["now"] or time.time(), watch["cursor"] or cursor
        if first and watch["health"] == 200:
            logger.info(f"{host.name}: {unit} is serving (started "
                        f"{duration(now - progress.start)} ago): {health_url} answers 200")
            break
        first = False
        for when, line in watch["lines"]:
            for message in progress.feed(line, when):
                logger.info(f"{host.name}: {unit}: {message}")
        state_now = watch["state"]
        if state_now.get("ActiveState") != "active" or state_now.get("started") != started:
            raise OperationError(startup_failure(
                unit, f"stopped running: {_unit_words(state_now)}", started, progress, now))
        # The server's own answer decides: /health 200 is ready, whether or not the log printed
        # the ready line this release is known for (the completion judges it next).
        if watch["health"] == 200:
            seen = "" if progress.ready else " (by /health: no ready line in its log)"
            logger.info(f"{host.name}: {unit} ready in {duration(now - progress.start)}{seen}: "
                        f"{progress.summary(now)}")
            break
        # A stall is silence of both: no log line, and no 200 from /health (asked every second).
        if progress.silent_for(now) >= stall_s:
            raise OperationError(startup_failure(
                unit, f"is stuck: no log line for {duration(progress.silent_for(now))} and "
                f"/health not 200 (last: {watch['health']}; startup_stall_s {stall_s}); it "
                f"still runs: `systemctl stop {unit}` ends it", started, progress, now))
        if now - progress.start >= timeout_s:
            raise OperationError(startup_failure(
                unit, f"not ready within {timeout_s}s (health_timeout_s; last /health: "
                f"{watch['health']})", started, progress, now))


@operation()
def generation_works(url: str, env_file: str, script: str, max_tokens: int = 48,
                     on_failure: OnFailure | None = None,
                     skip: Callable[[], bool] | None = None, timeout_s: int = 60):
    """
    Ask the server for one short chat completion (``/v1/chat/completions``, streamed, with
    logprobs) and fail unless it answers 200 with text that is not degenerate (one character,
    word or token repeated for most of it, e.g. ``!!!!!!!``, ``的的的的的的``; ``startup_log.
    degenerate``) and finite logprobs. Logs the time to first
    token and the single-stream tokens/s. Checked once the deploy has run.

    + url: the server's base URL, asked from inside the container
    + env_file: the server's env file; its API key (if any) is read by SCRIPT, never on argv
    + script: the uploaded ``remote/startup_watch.py``
    + max_tokens: tokens to generate
    + on_failure: as ``server_started``'s
    + skip: true when the server's start already failed, judged later (no completion asked)
    + timeout_s: seconds the whole answer may take (``generation_timeout_s``); longer fails

    **Example:**

    .. code:: python

        from pve_sglang.operations import verify

        verify.generation_works(
            name="One chat completion is not degenerate",
            url="http://127.0.0.1:30000",
            env_file="/etc/sglang/sglang.env",
            script="/opt/sglang/startup_watch.py",
        )
    """
    if _after_execution("generation"):
        if skip and skip():
            host.noop("not asked: the server's start failed")
            return
        try:
            generation_answers(url, env_file, script, max_tokens, timeout_s)
        except OperationError as failure:
            yield from _failed(failure, on_failure)
            return
        host.noop("one chat completion is not degenerate")
    yield from ()


def generation_answers(url: str, env_file: str, script: str, max_tokens: int,
                       timeout_s: int = 60) -> None:
    """At execution: one chat completion, judged (``generation_works``); raises
    ``OperationError`` when it fails, is degenerate or takes longer than TIMEOUT_S."""
    result = host.get_fact(GenerationCheck, script=script, url=url, env_file=env_file,
                           max_tokens=max_tokens, timeout_s=timeout_s)
    try:
        _judge_answer(result, timeout_s)
    except OperationError as failure:
        worker = (result or {}).get("worker")
        if worker:  # through a gateway: the worker it chose is the one to look at
            raise OperationError(f"{failure} (the gateway routed it to worker {worker})") from None
        raise


def _judge_answer(result: dict | None, timeout_s: int) -> None:
    """Raise ``OperationError`` unless RESULT (``startup_watch.py generate``'s) is a timely,
    non-degenerate answer; log its rate when it is."""
    if result and result.get("timed_out"):
        raise OperationError(f"chat completion timed out after {timeout_s}s "
                             f"(generation_timeout_s): {result.get('error')}")
    if result and result.get("status") == 200 and result.get("error"):
        raise OperationError(f"chat completion: HTTP 200, then {result['error']}")
    if not result or result.get("status") != 200:
        status = (result or {}).get("status")
        error = str((result or {}).get("error") or "no result")[:500]
        raise OperationError(f"chat completion: HTTP {status}: {error}")
    text = result.get("text") or ""
    shown = repr(text[:80])
    if not text.strip():
        raise OperationError("chat completion: HTTP 200 with no text")
    why = degenerate(text)
    bad = bad_logprobs(result.get("logprobs") or [])
    if why or bad:
        problem = why or f"{bad} of {len(result['logprobs'])} logprobs are NaN, inf or missing"
        raise OperationError(
            f"chat completion is degenerate ({problem}): {shown}; known on SM120 with "
            "autotuned FlashInfer CUTLASS MoE tactics: add --disable-flashinfer-autotune to "
            "extra_server_args or choose another moe_runner_backend, and restart")
    tokens, ttft, elapsed = result.get("tokens") or 0, result.get("ttft_s"), result.get("elapsed_s")
    rate = ""
    if tokens > 1 and ttft is not None and elapsed and elapsed > ttft:
        rate = f", {(tokens - 1) / (elapsed - ttft):.1f} tok/s single stream"
    logger.info(f"{host.name}: chat completion of {result.get('model')}: {tokens} tokens, "
                f"TTFT {ttft or 0:.2f}s{rate}: {shown}")


def benchmark_row(concurrency: int, argv: list[str], env_file: str) -> dict:
    """At execution: run one level's benchmark (ARGV, ``bench_runs``) with the key from
    ENV_FILE and return its row: the record's figures, the GPU sampler's and the server
    metrics'. Raises ``OperationError`` with the output, secrets masked, when it has no record."""
    output = host.get_fact(Command, command=bench_shell(argv, env_file))
    try:
        status = bench_exit_status(output)
        if status != 0:
            raise ValueError(f"the benchmark exited with status {status}")
        record = marked_json(bench_record.RECORD_PREFIX, output)
        gpus = marked_json(gpu_sampler.SUMMARY_PREFIX, output)
        metrics = marked_json(server_metrics.SUMMARY_PREFIX, output)
        row = {"concurrency": concurrency, **record_row(record), **gpu_columns(gpus),
               **metric_columns(metrics)}
    except ValueError as error:
        # The benchmark holds the key (OPENAI_API_KEY): none of its output is trusted.
        secrets = host_settings(ContainerSettings).secrets
        raise OperationError(f"benchmark at concurrency {concurrency}: {error}:\n"
                             + mask_text(output, secrets)[-2000:]) from None
    problem = metrics_problem(metrics)
    if problem:
        logger.warning(f"{host.name}: benchmark at concurrency {concurrency}: the "
                       f"server's /metrics gave no figures: {problem}")
    return row


@operation()
def benchmark(runs: dict[int, list[str]], env_file: str, history_dir: str | None = None,
              meta: dict | None = None, regression_pct: float | None = None,
              low_power_pct: float | None = None):
    """
    Run the serving benchmark once per concurrency and print tok/s, TTFT, ITL, read from the
    benchmark's record, and, where the run went through the GPU sampler, GPU power and
    utilisation per level; a run without a record fails the host, its output shown with the env
    file's secrets masked. With HISTORY_DIR, the table
    is saved on this machine and the host's plot redrawn (``bench_history``); a drop against
    the previous run, or GPUs far under their power limit at the highest level, is a warning.
    Run once the deploy has run.

    + runs: the benchmark's argv per concurrency level under the record wrapper
      (``recorded_argv``: the record, which holds the server's API key, goes to a private file
      removed after), or ``bench_runs`` for that under the GPU sampler too
    + env_file: the server's env file; its API key reaches the benchmark as ``OPENAI_API_KEY``
    + history_dir: where runs are saved on the machine running pyinfra; ``None`` saves nothing
    + meta: what the run was made with (``bench_history.run_meta``), saved beside it
    + regression_pct: warn when a level's output tok/s falls more than this below the last run
    + low_power_pct: warn when GPUs average under this share of their power limit at the top

    **Example:**

    .. code:: python

        from pve_sglang.server.bench import bench_argv, recorded_argv
        from pve_sglang.operations import verify

        # cs: the container's ContainerSettings; bench_record.py uploaded to /opt/sglang
        python = "/opt/sglang/venv/bin/python"
        verify.benchmark(
            name="Benchmark at concurrency [1, 16, 64]",
            runs={c: recorded_argv(python, "/opt/sglang/bench_record.py",
                                   bench_argv(cs, python, c, "127.0.0.1", 30000, "0.5.9"))
                  for c in (1, 16, 64)},
            env_file="/etc/sglang/sglang.env",
        )
    """
    if _after_execution("benchmark"):
        rows = []
        for concurrency, argv in sorted(runs.items()):
            logger.info(f"{host.name}: benchmark at concurrency {concurrency}...")
            rows.append(benchmark_row(concurrency, argv, env_file))
        logger.info(f"{host.name}: benchmark summary\n" + summary_table(rows))
        if history_dir:
            info, warnings = bench_history.after_run(
                history_dir, host.name, rows, meta or {}, regression_pct, low_power_pct)
            for line in info:
                logger.info(f"{host.name}: {line}")
            for line in warnings:
                logger.warning(f"{host.name}: benchmark: {line}")
        host.noop("benchmark ran")
    yield from ()
