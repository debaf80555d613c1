"""Phase 3: GPUs visible, CUDA initialises, the server answers, optional benchmark."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host, logger
from pyinfra.api import deploy

from pve_sglang import remote
from pve_sglang.server.bench_history import run_meta
from pve_sglang.server.bench import PROMPTS_IN_CONTAINER, bench_levels, bench_runs
from pve_sglang.model_store import operations as model
from pve_sglang.operations import paths, stack_switch, verify
from pve_sglang.operations import roll as rolling
from tasks import stack_steps
from tasks.common import container_gpus, expect_container_reads, run_when_container_exists, upload_script
from tasks.gateway import rolled_with_others
from pve_sglang.stack.identity import settings_stack_id, settings_stack_path, stack_lock_of
from pve_sglang.server.command import venv_python
from pve_sglang.server.unit_text import env_file_path, unit_name
from pve_sglang.config.settings import BenchView, ContainerSettings, ServerView, host_settings
from pve_sglang.server.addresses import base_url, client_address

#: A check of the verify phase: what it checks in words (the plan shown before the container
#: runs), and the function that calls its operations.
Check = tuple[str, Callable[[], object]]


@deploy("Verify")
def verify_phase() -> None:
    """Check the container end to end."""
    if "gpu_containers" not in host.groups:
        return
    run_when_container_exists(verify_steps, "verify", planned_checks)


def planned_checks() -> list[str]:
    """What verify will check, in words, for a plan made before the container runs."""
    cs = host_settings(ContainerSettings)
    stack = ["the stack is the locked set (what the container runs)"] \
        if cs.stack_install == "pinned" else []
    served = [f"the model is {cs.model_download}, verified (which commit it serves)"] \
        if cs.model_download else []
    checks = verify_plan(cs, container_gpus(cs.lxc))
    return stack + served + ([words for words, _ in checks] or ["nothing: the host has no NVIDIA GPU"])


def verify_plan(cs: ContainerSettings, gpu_host: tuple[str | None, list[dict]]) -> list[Check]:
    """The verify phase's checks, in order, each with its words: one list for both; none when
    the container's host has no NVIDIA driver (GPU_HOST: its driver version and the GPUs the
    container gets, ``container_gpus(cs.lxc)``). The phase's plan: CS whole, as its checks span
    the server, its stack's switch and the benchmark."""
    driver, gpus = gpu_host
    if not driver:
        return []
    expected = len(gpus)
    py = venv_python(cs.server)
    script = remote.path(remote.GPU_CHECKS)
    # The server itself binds to server_host; checks run inside the container.
    address = client_address(cs.server_host)

    def cuda() -> None:
        upload_script(remote.GPU_CHECKS, "Upload the GPU checks")
        verify.cuda_initialises(name="CUDA initialises on every GPU", python=py, script=script,
                                expected=expected)

    checks: list[Check] = [
        ("GPUs visible in the container", lambda: verify.gpus_visible(
            name=f"{expected} GPUs visible in the container", expected=expected)),
        ("CUDA initialises on every GPU", cuda),
    ]
    if expected > 1:
        checks.append((f"P2P between the {expected} GPUs", lambda: verify.p2p_preflight(
            name=f"P2P between the {expected} GPUs", python=py, script=script)))
    checks += server_checks(cs, address)
    if cs.bench:
        checks.append((f"benchmark at concurrency {bench_levels(cs.benchmark)}",
                       lambda: benchmark_check(cs.benchmark, cs.server, address)))
    return checks


def server_checks(cs: ContainerSettings, address: str) -> list[Check]:
    """The server's start followed in its journal up to /health (fails fast, with a hint, on a
    crash or a silent log), then one chat completion (``generation_check``). ADDRESS: where
    the server answers inside the container. CS whole: the checks span the server, the
    verify phase's bounds and the stack's switch and retention (``stack_steps.kept`` takes the
    settings so)."""
    unit, env_file = unit_name(cs.server), env_file_path(cs.server)
    url = base_url(address, cs.server_port)
    watch = remote.path(remote.STARTUP_WATCH)
    health = f"{url}/health"
    follow = stack_steps.follow_start(cs.server, cs.startup_stall_s)
    stacks = cs.server.stacks_at

    def judged(failure):
        # A stack on trial (an upgrade) that fails is rolled back, and its start followed; a
        # node of several is judged with its group (``group_judged``, below).
        return stack_switch.judged(failure, stacks, unit, rollback=cs.upgrade_rollback,
                                   watch=follow, nodes=cs.nodes)

    def started() -> None:
        upload_script(remote.STARTUP_WATCH, "Upload the startup watch")
        verify.server_started(
            name=f"{unit} starts and answers /health (up to {cs.health_timeout_s}s, "
            f"stuck after {cs.startup_stall_s}s of silence)",
            unit=unit, health_url=health, env_file=env_file, script=watch,
            timeout_s=cs.health_timeout_s, stall_s=cs.startup_stall_s, on_failure=judged)

    checks: list[Check] = [(
        f"the server starts (progress from its journal, stuck after {cs.startup_stall_s}s of "
        f"silence) and answers /health within {cs.health_timeout_s}s", started)]
    if cs.generation_check:
        checks.append((f"one chat completion is not degenerate (TTFT, tok/s) and answers "
                       f"within {cs.generation_timeout_s}s",
                       lambda: verify.generation_works(
                           name="One chat completion is not degenerate", url=url,
                           env_file=env_file, script=watch, on_failure=judged,
                           skip=lambda: stack_switch.node_failure(host.name) is not None,
                           timeout_s=cs.generation_timeout_s)))
    if cs.nodes:
        checks.append((f"the nodes {', '.join(cs.nodes)} are judged together (one failed: "
                       "all roll back)", lambda: stack_switch.group_judged(
                           name=f"The nodes of the model ({', '.join(cs.nodes)}) are judged "
                           "together", stacks=stacks, unit=unit,
                           rollback=cs.upgrade_rollback, nodes=cs.nodes, watch=follow)))
    back = back_check(cs.server, follow)
    if back is not None:
        checks.append(back)
    checks.append((f"a new stack that serves ends its trial after upgrade_probation_s "
                   f"{cs.upgrade_probation_s} (a failed one was rolled back)",
                   lambda: stack_switch.trial_passed(
                       name="An upgraded stack serves: its trial ends",
                       stacks=stacks, probation_s=cs.upgrade_probation_s)))
    # After the verdict: the container phase removes none while a stack is on trial.
    checks.append((f"{stack_steps.kept_words(cs.stack, cs.stack_retention)}, after the verdict",
                   lambda: stack_steps.kept(cs, settings_stack_id(host.name, cs),
                                            after_verdict=True)))
    return checks


def back_check(server: ServerView, follow: Callable[[], None]) -> Check | None:
    """Behind a gateway with other replicas, where its roll stops at another one: what this
    replica serves then, and with ``gateway_roll_failure: back`` an upgrade of this run sent
    back to the release it served, in turn (``operations.roll.back_with_the_roll``); None for
    a replica alone behind its gateway, a node of several, or no gateway."""
    rolled = rolled_with_others(server)
    if rolled is None:
        return None
    gw, gs, _ = rolled
    unit = unit_name(server)

    def target() -> str | None:
        return stack_switch.back_target(server.stacks_at)

    def go_back(why: str) -> None:
        stack_switch.sent_back(why, server.stacks_at, unit, follow)

    policy = gs.gateway_roll_failure
    return (f"where the roll behind {gw.name} stops at another replica: " + (
        "an upgrade of this run goes back to the release it served, in turn"
        if policy == "back" else "it keeps the change of this run, named") +
        " (gateway_roll_failure)",
        lambda: rolling.back_with_the_roll(
            name=f"Where the roll behind {gw.name} stopped: back or kept "
                 f"(gateway_roll_failure {policy})",
            gateway=gw.name, policy=policy, target=target, go_back=go_back))


def benchmark_check(bench: BenchView, server: ServerView, address: str) -> None:
    """The serving benchmark at each level of the preset against the server at ADDRESS, under
    the GPU sampler, the server metrics sampler (``enable_metrics``) and the record wrapper (its
    record, the key inside, in a private file); the SERVER's venv, release and env file."""
    upload_script(remote.GPU_SAMPLER, "Upload the GPU sampler")
    upload_script(remote.BENCH_RECORD, "Upload the benchmark record wrapper")
    upload_prompts(bench)
    # The server metrics sampler is uploaded beside the GPU sampler (its companion).
    scraper = remote.path(remote.SERVER_METRICS) if bench.enable_metrics else None
    runs = bench_runs(bench, venv_python(server), address, server.sglang_version,
                      remote.path(remote.GPU_SAMPLER), remote.path(remote.BENCH_RECORD), scraper)
    verify.benchmark(name=f"Benchmark at concurrency {bench_levels(bench)}",
                     runs=runs, env_file=env_file_path(server), history_dir=bench.bench_history_dir,
                     meta=run_meta(bench, server), regression_pct=bench.bench_regression_pct,
                     low_power_pct=bench.bench_low_power_pct)


def upload_prompts(bench: BenchView) -> None:
    """The user's prompts (``bench_prompts_file``, checked when the settings were read) where
    the benchmark reads them (``bench.PROMPTS_IN_CONTAINER``)."""
    if bench.bench_prompts_file:
        paths.put(name=f"The benchmark's prompts {bench.bench_prompts_file}",
                  src=bench.bench_prompts_file, dest=PROMPTS_IN_CONTAINER, mode="644")


def verify_steps() -> None:
    """GPU, CUDA, health and benchmark checks (``verify_plan``); without a GPU, say what was
    skipped."""
    cs = host_settings(ContainerSettings)
    expect_container_reads(cs.stack, cs.server)
    if cs.stack_install == "pinned":
        lock, _ = stack_lock_of(host.name, cs)
        # The settings' stack (the serving one, unless its switch waits: restart pending).
        verify.stack_as_locked(name=f"The stack is lock {lock.id}",
                               python=f"{settings_stack_path(host.name, cs)}/bin/python", tools=remote.TOOLS,
                               lock=lock)
    if cs.model_download:
        model.served(name=f"The model served is {cs.model_download}", path=cs.model_path,
                     repo=cs.model_download)
    checks = verify_plan(cs, container_gpus(cs.lxc))
    if not checks:
        logger.warning(
            f"{host.name}: verify skipped (GPUs visible, CUDA init, /health, benchmark): the "
            "host has no NVIDIA GPU"
        )
    for _, check in checks:
        check()
