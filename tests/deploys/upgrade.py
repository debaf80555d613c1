"""Test deploy: the container phase's stack and server steps (``tasks/container.py`` and
``tasks/stack_steps.py``: a rollback cut short finished, the failed-set check, a node of several
switched only with its whole group, the stack built beside the serving one, the autotune patch
and its release file, the env file and unit, the switch, the one restart, retention) with the
server started though the container has no GPU, then the verify phase's server checks
(``server_checks``: the startup watch, the chat completion, a failed upgrade's rollback, a
group's judgement, the end of a trial).

Settings: ``group_data/all.py`` and the host's ``settings`` overrides (``--data`` too)."""

import sys
from pathlib import Path

from pyinfra import host, logger
from pyinfra.context import state
from pyinfra.operations import python

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pve_sglang.config.settings import ContainerSettings  # noqa: E402
from pve_sglang.operations import stack_switch  # noqa: E402
from pve_sglang.server.render import server_files  # noqa: E402
from pve_sglang.server.unit_text import unit_name  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from pve_sglang.stack.identity import settings_stack_id  # noqa: E402
from tasks import stack_steps  # noqa: E402
from tasks.container import patched_stack, python_stack, server_unit, stack_dir  # noqa: E402
from tasks.verify import server_checks  # noqa: E402

defaults = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
overrides = {k: v for k, v in host.data.get("settings", {}).items()}
# --data retry_failed_stack=true / restart_on_change=false reach this deploy as host data.
for key in ("retry_failed_stack", "restart_on_change", "upgrade_rollback"):
    if host.data.get(key) is not None:
        value = host.data.get(key)
        overrides[key] = value if isinstance(value, bool) else str(value).lower() == "true"
# Only from --data (host.data falls back to group_data's default, over the site's settings).
if state.inventory.override_data.get("upgrade_probation_s") is not None:
    overrides["upgrade_probation_s"] = int(state.inventory.override_data["upgrade_probation_s"])
cs = ContainerSettings.model_validate({**defaults, **overrides})
py = f"{stack_dir(cs)}/bin/python"

wanted = settings_stack_id(host.name, cs)
stack_steps.before_switch(cs.server, wanted, cs.retry_failed_stack, cs.startup_stall_s)
restart_on = python_stack(cs.stack, cs.server.stacks_at, py)
restart_on += patched_stack(cs, py)
server_unit(cs, py, server_files(host.name, cs, [], state.inventory), restart_on, start=True)
stack_steps.kept(cs, wanted)
for _, check in server_checks(cs, "127.0.0.1"):
    check()


def send_back() -> None:
    """As a replica behind a gateway whose roll stopped elsewhere goes back with
    ``gateway_roll_failure: back`` (``operations.roll.back_with_the_roll``): the release it goes
    back to, then the product's own sending back, its start followed."""
    stacks = cs.server.stacks_at
    logger.warning(f"{host.name}: goes back to: {stack_switch.back_target(stacks)}")
    stack_switch.sent_back("the roll behind the test's gateway stopped at another replica",
                           stacks, unit_name(cs.server),
                           stack_steps.follow_start(cs.server, cs.startup_stall_s))


# --data send_back=true: the server sent back after the checks, as its roll's back step does.
if str(host.data.get("send_back") or "").lower() == "true":
    python.call(name="Sent back with its roll (gateway_roll_failure back)", function=send_back)
