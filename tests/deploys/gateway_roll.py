"""Test deploy: replicas behind a gateway restarted by a change, in turn (issue 51).

The inventory holds one gateway (group ``gateways``: its ``settings``, ``gateway_worker_list``,
``worker_keys`` and ``check_timeout_s`` as ``tests/deploys/gateway.py`` takes them) and its
replicas (group ``replicas``): each a stand-in SGLang server (``tests/standin_sglang.py``) run
by a real systemd unit of its own, its ``port`` and ``flags`` (the change: a flag of its command
line) in its host data; several replicas may share one container (``lxc_name``). A replica's
unit restarts through the server's own operation (``systemd_unit.service_running``), in its
turn of the gateway's roll (``tasks.gateway.turn_for``: out of the rotation, drained, restarted,
its start followed by the startup watch, a generation asked as the gateway asks it, given back);
with ``roll`` false in its data, at once (today's restart without a gateway). Where the roll
stopped at another replica, one changed before it keeps its change or, with the gateway's
``gateway_roll_failure: back``, goes back to the flags it ran before, in turn
(``operations.roll.back_with_the_roll``: its unit as it was, as an upgrade's rollback switches
its stack back). Then the gateway's own steps (it lists its workers, each healthy).
"""

import sys
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.context import state
from pyinfra.facts.files import FileContents
from pyinfra.operations import systemd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang import remote  # noqa: E402
from pve_sglang.config.gateway import validate_gateway  # noqa: E402
from pve_sglang.operations import paths, roll, systemd_unit, verify  # noqa: E402
from pve_sglang.operations.changes import any_changed  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from tasks.common import upload_script  # noqa: E402
from tasks.gateway import gateway_steps, gateway_workers, turn_for  # noqa: E402

STANDIN = "/opt/standin"

if "replicas" in host.groups:
    port = int(host.data.get("port"))
    unit = f"standin-roll-{port}.service"
    env_file, unit_path = f"/etc/standin-roll/{port}.env", f"/etc/systemd/system/{unit}"
    gw = state.inventory.get_group("gateways")[0]
    gs = validate_gateway(gw.name, gw.data.get("settings", {}), load_defaults())
    names = [str(w["name"]) for w in gw.data.get("gateway_worker_list")]
    # Its own copy of the startup watch: the replicas of this test share one container.
    tools = f"/opt/standin-roll/{port}"
    watch = remote.path(remote.STARTUP_WATCH, tools)
    paths.watch(env_file, unit_path, watch, remote.path(remote.REMOTE_ENV, tools))
    upload_script(remote.STARTUP_WATCH, "Upload the startup watch", tools)
    env = paths.put(name=f"Replica environment {env_file}", dest=env_file, mode="600",
                    src=StringIO(f'SGLANG_API_KEY="{host.data.get("key")}"\n'), secret=True)

    def unit_text(flags: str) -> str:
        return (f"[Unit]\nDescription=stand-in replica {port}\n\n[Service]\n"
                f"EnvironmentFile={env_file}\n"
                f"ExecStart=/usr/bin/python3 {STANDIN}/standin_sglang.py --logs {STANDIN}/logs "
                f"--port {port} --host 0.0.0.0 --event-file /run/standin-roll-{port} "
                f"--enable-metrics --pause-scale 0.02 {flags}\n\n[Install]\n"
                "WantedBy=multi-user.target\n")

    # The flags it ran before this run (its unit's), for gateway_roll_failure back.
    found = host.get_fact(FileContents, path=unit_path)
    start_line = next((line for line in found or () if line.startswith("ExecStart=")), None)
    before = start_line.split("--pause-scale 0.02 ", 1)[1] if start_line else None
    unit_file = paths.put(name=f"Unit {unit}", dest=unit_path, mode="644",
                          src=StringIO(unit_text(host.data.get("flags", ""))))
    systemd.daemon_reload(name="Reload systemd units", _if=any_changed(unit_file))
    health = f"http://127.0.0.1:{port}/health"
    judge = lambda: verify.watch_start(unit, health, env_file, watch, 120, 60)  # noqa: E731
    systemd_unit.service_running(
        name=f"{unit} enabled and running", unit=unit, start=True,
        restart=any_changed(unit_file, env, restarts=unit),
        turn=turn_for(gw.name, gs, names, int(gw.data.get("check_timeout_s") or 60), judge)
        if host.data.get("roll", True) else None)

    def go_back(why: str) -> None:
        """The unit with the flags it ran before this run, restarted, its start followed (as
        an upgrade's rollback switches its stack back)."""
        host.put_file(StringIO(unit_text(before or "")), unit_path)
        host.run_shell_command(f"systemctl daemon-reload && systemctl restart {unit}")
        judge()

    roll.back_with_the_roll(
        name="Where the roll stopped: back or kept", gateway=gw.name,
        policy=gs.gateway_roll_failure, go_back=go_back,
        target=lambda: f"its flags before ({before})" if before is not None
        and before != host.data.get("flags", "") else None)

if host.data.get("gateway_worker_list") is not None:
    gs = validate_gateway(host.name, host.data.get("settings", {}), load_defaults())
    workers = gateway_workers()
    gateway_steps(gs, workers, list(host.data.get("worker_keys") or [None] * len(workers)),
                  timeout_s=int(host.data.get("check_timeout_s") or 60))
