"""Phase 4, in each gateway's container: SGLang's model gateway (smg) in front of the serving
containers, after they were verified.

smg from its hashed lock (from the host's wheel store, offline, where its container mounts
one: the host phase filled it, as for a serving set); its unit (settings only), its env file (the clients' key, 0600), the
workers' keys (0600, read by the worker script alone) and its worker list; the unit started, and
restarted only when its unit, env file, venv or launcher changed; the worker list kept through
smg's worker API (a changed list restarts nothing); then each worker's health as the gateway
sees it, and one chat completion through the gateway.
"""

from __future__ import annotations

import functools
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.context import state

from pve_sglang import remote
from pve_sglang.config.gateway import GatewaySettings, gateway_lock, gateway_store
from pve_sglang.config.settings import (BenchView, ContainerSettings, ServerView, container_hostname,
                                        host_settings)
from pve_sglang.gateway import render, roll
from pve_sglang.gateway.workers import Worker, gateway_address, key_problem
from pve_sglang.operations import debs, gateway, paths, systemd_unit, verify, wheel_store
from pve_sglang.operations import roll as rolling
from pve_sglang.operations.changes import any_changed
from pve_sglang.runtime.errors import PreflightError
from pve_sglang.server.bench import bench_levels, bench_runs
from pve_sglang.server.bench_history import run_meta
from pve_sglang.server.command import venv_python
from pve_sglang.server.unit_text import env_file_path
from pve_sglang.stack.store_retention import user_path
from tasks import stack_steps
from tasks.common import run_when_container_exists, store_user_key, upload_script

BASE_PACKAGES = ["ca-certificates", "python3", "python3-venv"]


@deploy("Gateway")
def gateway_phase() -> None:
    """Bring a gateway's container to a serving smg in front of its workers."""
    if "gateways" not in host.groups:
        return
    gs = host_settings(GatewaySettings)
    workers = gateway_workers()
    keys = worker_keys(workers)
    # Before any change: keys that cannot work together stop the run here.
    problem = key_problem(f"host {host.data.get('pve_host')}, gateway {host.name}",
                          gs.gateway_api_key.get_secret_value() if gs.gateway_api_key else None,
                          {w.name: k for w, k in zip(workers, keys)})
    if problem:
        raise PreflightError(problem)
    wheels = gateway_store(host_settings(ContainerSettings).stack, gs)
    timeout_s = check_timeout_s(workers)
    run_when_container_exists(lambda: gateway_steps(gs, workers, keys, wheels, timeout_s),
                              "gateway", lambda: planned_steps(gs, workers, wheels))


def gateway_workers() -> list[Worker]:
    """The workers the inventory chose for this gateway (``hosts_file.build_gateways``)."""
    return [Worker(str(w["name"]), str(w["url"]), bool(w["has_key"]))
            for w in host.data.get("gateway_worker_list") or []]


def worker_keys(workers: list[Worker]) -> list[str | None]:
    """Each worker's API key (its container's ``api_key``), None where it has none."""
    keys = []
    for worker in workers:
        cs = host_settings(ContainerSettings, of=state.inventory.get_host(worker.name))
        keys.append(cs.api_key.get_secret_value() if cs.api_key else None)
    return keys


def check_timeout_s(workers: list[Worker]) -> int:
    """Seconds each worker may take to answer the gateway's generation check: the longest
    ``generation_timeout_s`` of their containers (their own verify phase's bound)."""
    return max((host_settings(ContainerSettings, of=state.inventory.get_host(w.name))
                .generation_timeout_s for w in workers), default=60)


def planned_steps(gs: GatewaySettings, workers: list[Worker], wheels: str | None) -> list[str]:
    """What the gateway steps do, in words, for a plan made before its container runs."""
    return [f"smg {gs.smg_version} from its hashed lock in {gs.gateway_venv}"
            + (f", from the host's wheel store {wheels}" if wheels else ""),
            f"{render.unit_name(gs)} on {gs.gateway_host}:{gs.gateway_port}, policy "
            f"{gs.gateway_policy}, its env file (0600)",
            f"{len(workers)} workers registered: " + ", ".join(w.url for w in workers),
            "each worker healthy in the gateway and answering a generation asked as the "
            "gateway asks it, one chat completion through it"]


def gateway_steps(gs: GatewaySettings, workers: list[Worker], keys: list[str | None],
                  wheels: str | None = None, timeout_s: int = 60) -> None:
    """The gateway's steps in its container; WHEELS: the host's wheel store it installs smg from
    (``gateway_store``), None: ``gateway_wheelhouse`` or the index; TIMEOUT_S: each worker's
    bound to answer the generation check (``check_timeout_s``)."""
    tools = render.TOOLS
    lock, _ = gateway_lock(gs)
    files = {render.lock_path(gs), render.env_file_path(gs), render.keys_path(gs),
             render.unit_path(gs), render.workers_path(gs),
             *(remote.path(s, tools) for s in (remote.LAUNCHER, remote.GATEWAY_WORKERS,
                                               remote.REMOTE_ENV, remote.STARTUP_WATCH)),
             *([user_path(wheels, store_user_key())] if wheels else [])}
    paths.watch(*sorted(files))
    debs.deb_packages(name="Base packages", packages=BASE_PACKAGES)
    launcher = upload_script(remote.LAUNCHER, "Upload the launcher (keys off the command line)",
                             tools)
    upload_script(remote.GATEWAY_WORKERS, "Upload the gateway's worker script", tools)
    paths.put(name=f"smg lock {lock.path.name}", src=str(lock.path), dest=render.lock_path(gs),
              mode="644")
    venv = gateway.smg_venv(name=f"smg {gs.smg_version} as locked in {gs.gateway_venv}",
                            venv=gs.gateway_venv, lock_file=render.lock_path(gs), lock=lock,
                            args=gateway.install_args(gs.gateway_wheelhouse or wheels,
                                                      gs.gateway_pip_index_url))
    if wheels:
        # Its record: the store keeps the smg set, and the gateway's mount blocks no pruning.
        wheel_store.holds_locks(name=f"The wheel store {wheels} knows the gateway's lock",
                                store=wheels, key=store_user_key(), locks=[lock.id])
    env = paths.put(name=f"Gateway environment {render.env_file_path(gs)} (its key, mode 0600)",
                    src=StringIO(render.render_env(gs)), dest=render.env_file_path(gs),
                    mode="600", secret=True)
    paths.put(name=f"Workers' keys {render.keys_path(gs)} (mode 0600)",
              src=StringIO(render.render_keys(gs, keys)), dest=render.keys_path(gs), mode="600",
              secret=True)
    paths.put(name=f"Worker list {render.workers_path(gs)} ({len(workers)} workers)",
              src=StringIO(render.render_workers(workers)), dest=render.workers_path(gs),
              mode="644")
    unit_file = paths.put(name=f"Unit {render.unit_path(gs)}", src=StringIO(render.render_unit(gs)),
                          dest=render.unit_path(gs), mode="644")
    unit = render.unit_name(gs)
    systemd_unit.service_running(
        name=f"{unit} enabled and running", unit=unit, start=True,
        restart=any_changed(unit_file, env, venv, launcher, restarts=unit),
        since={"the unit file": render.unit_path(gs), "the environment file":
               render.env_file_path(gs)})
    gateway.workers_registered(name=f"The gateway lists its {len(workers)} workers",
                               status_argv=render.sync_argv(gs, "status"),
                               sync_argv=render.sync_argv(gs), workers=workers)
    gateway.workers_healthy(name="Each worker as the gateway sees it, answering a generation",
                            status_argv=render.sync_argv(gs, "status"),
                            check_argv=render.sync_argv(gs, "check", timeout_s), workers=workers)
    upload_script(remote.STARTUP_WATCH, "Upload the generation check", tools)
    verify.generation_works(name="One chat completion through the gateway",
                            url=render.gateway_url(gs), env_file=render.env_file_path(gs),
                            script=remote.path(remote.STARTUP_WATCH, tools))


@deploy("Benchmark through a gateway")
def gateway_bench_phase() -> None:
    """In the first worker's container of each gateway with ``gateway_bench``: the serving
    benchmark through the gateway (its address as the workers reach it)."""
    if "gpu_containers" not in host.groups:
        return
    for gw in fronted_by(host.name):
        gs = host_settings(GatewaySettings, of=gw)
        if gs.gateway_bench:
            run_when_container_exists(functools.partial(bench_through, gw, gs),
                                      "gateway benchmark")


def fronted_by(name: str) -> list:
    """The gateways of the inventory whose first worker is container NAME."""
    found = []
    for gw in state.inventory.get_group("gateways", []):
        workers = gw.data.get("gateway_worker_list") or []
        if workers and workers[0].get("name") == name:
            found.append(gw)
    return found


def bench_through(gw, gs: GatewaySettings) -> None:
    cs = host_settings(ContainerSettings)
    address = gateway_address(gs.gateway_host, container_hostname(gw.data))
    upload_script(remote.GPU_SAMPLER, "Upload the GPU sampler")
    upload_script(remote.BENCH_RECORD, "Upload the benchmark record wrapper")
    runs = gateway_bench_runs(cs.benchmark, cs.server, gs, address)
    verify.benchmark(name=f"Benchmark through the gateway {gw.name} at concurrency "
                          f"{bench_levels(cs.benchmark)}",
                     runs=runs, env_file=env_file_path(cs.server),
                     history_dir=f"{cs.bench_history_dir.rstrip('/')}/gateway",
                     meta={**run_meta(cs.benchmark, cs.server), "gateway": gw.name,
                           "gateway_policy": gs.gateway_policy},
                     regression_pct=cs.bench_regression_pct, low_power_pct=cs.bench_low_power_pct)


def gateway_bench_runs(bench: BenchView, server: ServerView, gs: GatewaySettings,
                       address: str) -> dict[int, list[str]]:
    """The benchmark's argv per level against the gateway at ADDRESS:``gateway_port``, under
    the GPU sampler of this container's GPUs (its SERVER's venv and release); no /metrics
    sampler (the gateway's is smg's)."""
    via = bench.model_copy(update={"server_port": gs.gateway_port, "enable_metrics": False})
    return bench_runs(via, venv_python(server), address, server.sglang_version,
                      remote.path(remote.GPU_SAMPLER), remote.path(remote.BENCH_RECORD), None)


# --- a roll: the replicas behind a gateway restarted in turn (issue 51) -------------------------


def rolled_by(name: str) -> tuple | None:
    """The gateway that rolls container NAME's restarts, with its settings and its replicas'
    names: the first gateway of the inventory whose workers name it; None where none does."""
    for gw in state.inventory.get_group("gateways", []):
        names = [str(w["name"]) for w in gw.data.get("gateway_worker_list") or []]
        if name in names:
            return gw, host_settings(GatewaySettings, of=gw), names
    return None


def rolled_with_others(server: ServerView) -> tuple | None:
    """``rolled_by`` this host where its gateway fronts other replicas too and it is no node of
    several (SERVER's ``nodes``: a group restarts together): the replicas a roll, a tuning
    search and a stopped roll's back step go over in turn; None otherwise."""
    rolled = rolled_by(host.name) if not server.nodes else None
    return rolled if rolled is not None and len(rolled[2]) > 1 else None


def roll_words(server: ServerView) -> str:
    """This replica's restart in words, for the plan: in its turn behind its gateway, or ''
    (a node of several, SERVER's ``nodes``: its group restarts together)."""
    rolled = rolled_by(host.name) if not server.nodes else None
    if rolled is None:
        return ""
    gw, gs, names = rolled
    if len(names) < 2:
        return f" (plainly: the only replica behind {gw.name})"
    return f", {roll.step_words(gw.name, gs.gateway_drain_timeout_s)}"


def replica_turn(server: ServerView, check_s: int, stall_s: int):
    """The turn this replica's restart runs in its gateway's roll (``operations.roll.turn``),
    or None: no gateway fronts it, it is the only replica behind its gateway (said so), or it
    is a node of several (SERVER's ``nodes``: its group restarts together). The roll's order
    is said once per gateway, in the plan too. CHECK_S: ``generation_timeout_s``; STALL_S:
    ``startup_stall_s`` (its start followed, ``stack_steps.follow_start``); no view holds
    them."""
    rolled = rolled_by(host.name)
    if rolled is None:
        return None
    gw, gs, names = rolled
    if len(names) < 2:
        logger.info(roll.order_words(gw.name, names, gs.gateway_roll_batch))
        return None
    if server.nodes:
        logger.warning(f"{host.name}: a node of a multi-node replica behind {gw.name}: its "
                       "group restarts together, not in turn")
        return None
    return turn_for(gw.name, gs, names, check_s, stack_steps.follow_start(server, stall_s))


def turn_for(gateway_name: str, gs: GatewaySettings, names: list[str], check_s: int, judge):
    """This host's turn behind GATEWAY_NAME (settings GS, replicas NAMES, in the inventory's
    order): the worker script's ``out``, ``in`` and ``check`` of it in the gateway's
    container, JUDGE following its start, CHECK_S each generation's bound."""
    if names[0] == host.name:
        logger.info(roll.order_words(gateway_name, names, gs.gateway_roll_batch))
    return rolling.InTurn(gateway_name, names, gs.gateway_roll_batch, host.name,
                          render.turn_argv(gs, host.name, check_s), judge,
                          roll.step_words(gateway_name, gs.gateway_drain_timeout_s),
                          [*render.sync_argv(gs), "--not-up-ok"])
