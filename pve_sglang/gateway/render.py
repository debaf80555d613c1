"""The gateway's files, rendered from its settings and workers (pure): smg's command line, its
systemd unit, its 0600 env file (the keys) and its worker list (no secret).

smg 1.13.0 takes its API key only as ``--api-key`` (``smg/router_args.py``), so the unit starts
it through the server's launcher (``remote/sglang_launch.py``): the key comes from the env file,
never a command line, and is masked in the gateway's output. The workers are not on its command
line: ``remote/gateway_workers.py`` registers them through smg's worker API once it listens, so
a changed list changes no unit and restarts nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pve_sglang import remote
from pve_sglang.config.gateway import GatewaySettings
from pve_sglang.server.addresses import base_url
from pve_sglang.gateway.workers import Worker
from pve_sglang.remote import sglang_launch
from pve_sglang.server.command import EnvRef
from pve_sglang.server.unit_text import (
    _plain_path,
    _templates,
    env_file_of,
    env_quote,
    launch_argv,
    systemd_command,
    unit_file,
)

UNIT_TEMPLATE = "smg.service.j2"
ENV_TEMPLATE = "sglang.env.j2"
#: The gateway container's folder for the deploy's files: scripts, lock, worker list, state.
TOOLS = "/opt/smg"
ENV_DIR = "/etc/smg"
GATEWAY_KEY = "SGLANG_API_KEY"
#: The env file's variable of the Nth worker's API key.
WORKER_KEY = "SMG_WORKER_KEY_{index}"


def unit_name(gs: GatewaySettings) -> str:
    return f"{gs.gateway_service_name}.service"


def unit_path(gs: GatewaySettings) -> str:
    return unit_file(unit_name(gs))


def env_file_path(gs: GatewaySettings) -> str:
    return env_file_of(gs.gateway_service_name, ENV_DIR)


def keys_path(gs: GatewaySettings) -> str:
    """The workers' API keys (mode 0600), read by the worker script alone: a worker added with
    a key changes this file, not the unit's env file, and restarts nothing."""
    return f"{ENV_DIR}/{gs.gateway_service_name}-workers.env"


def workers_path(gs: GatewaySettings) -> str:
    return f"{TOOLS}/{gs.gateway_service_name}-workers.json"


def state_path(gs: GatewaySettings) -> str:
    """What the sync registered last: the only workers it ever removes."""
    return f"{TOOLS}/{gs.gateway_service_name}-registered.json"


def lock_path(gs: GatewaySettings) -> str:
    return f"{TOOLS}/smg-{gs.smg_version}-py{gs.gateway_python}.txt"


def python(gs: GatewaySettings) -> str:
    return f"{gs.gateway_venv.rstrip('/')}/bin/python"


def gateway_url(gs: GatewaySettings) -> str:
    """Where a client in the gateway's container reaches it (a wildcard on loopback)."""
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(gs.gateway_host, gs.gateway_host)
    return base_url(address, gs.gateway_port)


def smg_argv(gs: GatewaySettings) -> list[str]:
    """``PYTHON -m smg.launch_router ...`` as smg 1.13.0 spells its flags; the key an
    ``EnvRef`` (the launcher fills it in from the env file)."""
    argv = [python(gs), "-m", "smg.launch_router",
            "--host", gs.gateway_host, "--port", str(gs.gateway_port),
            "--policy", gs.gateway_policy,
            "--prometheus-host", gs.gateway_host,
            "--prometheus-port", str(gs.gateway_prometheus_port),
            "--health-check-interval-secs", str(gs.gateway_health_check_interval_s),
            "--health-check-timeout-secs", str(gs.gateway_health_check_timeout_s),
            "--health-failure-threshold", str(gs.gateway_health_failure_threshold),
            "--health-check-endpoint", "/health",
            # A worker registered while its server is down stays pending this long (smg's
            # default: 1800 s), checked as often as the registered ones (default: 30 s).
            "--worker-startup-timeout-secs", str(gs.gateway_worker_startup_timeout_s),
            "--worker-startup-check-interval", str(gs.gateway_health_check_interval_s),
            "--remove-unhealthy-workers" if gs.gateway_remove_unhealthy
            else "--no-remove-unhealthy-workers"]
    if gs.gateway_api_key:
        argv += ["--api-key", EnvRef(GATEWAY_KEY)]
    return argv


def sync_argv(gs: GatewaySettings, command: str = "sync", timeout_s: int | None = None) -> list[str]:
    """The worker script's argv (``remote/gateway_workers.py``): no secret in it. ``sync``
    waits ``gateway_register_timeout_s``; ``check`` gives each worker TIMEOUT_S to answer."""
    argv = ["/usr/bin/python3", remote.path(remote.GATEWAY_WORKERS, TOOLS), command,
            "--gateway", gateway_url(gs), "--workers", workers_path(gs),
            "--env-file", env_file_path(gs), "--keys-file", keys_path(gs),
            "--state", state_path(gs)]
    if command == "sync":
        argv += ["--timeout", str(gs.gateway_register_timeout_s)]
    elif timeout_s is not None:
        argv += ["--timeout", str(timeout_s)]
    return argv


@dataclass(frozen=True)
class TurnArgv:
    """The worker script's argv for one replica's turn out of the rotation and back: ``out``
    (drained first), ``in`` (back, once listed healthy) and ``check`` (a generation asked as the
    gateway asks it)."""

    out: list[str]
    back: list[str]
    check: list[str]


def turn_argv(gs: GatewaySettings, name: str, check_s: int) -> TurnArgv:
    """Replica NAME's turn argv behind the gateway of GS, CHECK_S its generation's bound:
    ``in`` waits for the registration and two health checks."""
    return TurnArgv(
        out=[*sync_argv(gs, "out", gs.gateway_register_timeout_s), "--worker", name,
             "--drain", str(gs.gateway_drain_timeout_s)],
        back=[*sync_argv(gs, "in", gs.gateway_register_timeout_s
                         + 2 * gs.gateway_health_check_interval_s), "--worker", name],
        check=[*sync_argv(gs, "check", check_s), "--worker", name])


def secrets(gs: GatewaySettings) -> dict[str, str]:
    """The unit's env file: the key clients send to the gateway."""
    return {GATEWAY_KEY: gs.gateway_api_key.get_secret_value()} if gs.gateway_api_key else {}


def worker_secrets(worker_keys: list[str | None]) -> dict[str, str]:
    """The workers' keys file: each worker's key by its index in the worker list."""
    return {WORKER_KEY.format(index=index): key for index, key in enumerate(worker_keys) if key}


def render_workers(workers: list[Worker]) -> str:
    """The worker list (JSON): name, URL and the env variable of its key, never the key."""
    return json.dumps({"workers": [
        {"name": w.name, "url": w.url,
         "key_env": WORKER_KEY.format(index=index) if w.has_key else None}
        for index, w in enumerate(workers)]}, indent=2) + "\n"


def _env_text(unit: str, env: dict[str, str]) -> str:
    return _templates().get_template(ENV_TEMPLATE).render(
        unit=unit, variables=[(k, env_quote(v)) for k, v in sorted(env.items())])


def render_env(gs: GatewaySettings) -> str:
    """The unit's env file (deploy it with mode 0600)."""
    return _env_text(unit_name(gs), secrets(gs))


def render_keys(gs: GatewaySettings, worker_keys: list[str | None]) -> str:
    """The workers' keys file (deploy it with mode 0600)."""
    return _env_text(f"{unit_name(gs)} worker registration", worker_secrets(worker_keys))


def render_unit(gs: GatewaySettings) -> str:
    """The gateway's unit: smg through the launcher, the worker list registered once it listens.
    Depends on the settings only: a changed worker list leaves it as it is."""
    launcher = remote.path(remote.LAUNCHER, TOOLS)
    env_file = env_file_path(gs)
    mask = [GATEWAY_KEY] if gs.gateway_api_key else []
    return _templates().get_template(UNIT_TEMPLATE).render(
        smg_version=gs.smg_version,
        workers_file=workers_path(gs),
        env_vars=sorted(secrets(gs)),
        keys_file=keys_path(gs),
        env_file=_plain_path("env_file", env_file),
        description=f"SGLang model gateway (smg {gs.smg_version}) on port {gs.gateway_port}",
        exec_start=systemd_command(launch_argv(smg_argv(gs), mask, launcher)),
        # A worker still loading when the gateway starts is reported, and no reason to fail it.
        exec_start_post=systemd_command([*sync_argv(gs), "--not-up-ok"]),
        launcher_config_error=sglang_launch.EX_CONFIG,
        timeout_start_s=gs.gateway_register_timeout_s + 30,
    )
