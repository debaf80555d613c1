"""Test deploy: stacks on the host's shared layer and the wheel store's retention, on a plain
LXC host (``@local``) and its containers (``@lxc/NAME``), for a lock given in host data.

On ``@local``: the wheel store (``wheels.store``), and last, once the containers ran, its
retention (``wheel_store.pruned``). In each container, as the deploy's container phase does for a
stack: its venv beside the others (``<venv>.stacks/<lock id>``), the host's shared layer of its
lock (``layer.shared``), its release file, the switch of the link (``stack_switch.switch``), the
container's retention (``stack_switch.retention``: none while a stack is on trial), then as the
verify phase ends, the verdict (taken as good: no server runs here), the retention that waited
for it and the container's record in the store (``wheel_store.holds``).

Host data: ``lock_file`` (on this machine), ``pins``, ``python``, ``store``, ``uv`` (in the
containers), ``keep`` (``stack_retention``), ``lxc_path`` (the host's containers), and on
``@local`` ``planned`` (``{container key: its inventory name}``: the containers of this run).
"""

import json
from io import StringIO
from pathlib import Path

from pyinfra import host

from pve_sglang.operations import layer, paths, phase, stack_switch, venv, wheel_store, wheels
from pve_sglang.stack import lock as stack_lock
from pve_sglang.stack import switch_rules
from pve_sglang.stack.store_retention import user_key

data = host.data
lock = stack_lock.parse(Path(data.lock_file))
key = stack_lock.LockKey(pins=tuple(tuple(pin) for pin in data.pins), python=data.python)
VENV = "/opt/sglang/venv"
STACKS = switch_rules.StacksAt(VENV, "sglang", "/opt/sglang/stack.lock")

if host.name == "@local":
    wheels.store(name=f"Wheel store {data.store}", path=data.store, lock=lock, key=key)
phase.done(name="Host done", phase="host")
if host.name != "@local":
    built = switch_rules.stack_path(VENV, lock.id)
    python = f"{built}/bin/python"
    venv.venv(name=f"Stack {lock.id}", uv=data.uv, path=built, python="/usr/bin/python3")
    layer.shared(name=f"Shared layer of lock {lock.id}", uv=data.uv, python=python,
                 tools="/opt/sglang", pth=layer.pth_path(built, data.python), store=data.store,
                 lock=lock)
    paths.put(name=f"Stack {lock.id} complete", src=StringIO(json.dumps({"lock": lock.id}) + "\n"),
              dest=f"{built}/{switch_rules.RELEASE_FILE}", mode="644")
    stack_switch.switch(name=f"Switch to {lock.id}", stacks=STACKS, unit="sglang.service",
                        wanted=lock.id, restart_on_change=True)
    stack_switch.retention(name="Stack retention", stacks=STACKS, wanted=lock.id, keep=data.keep,
                           restart_on_change=True)
phase.done(name="Containers done", phase="container")
if host.name != "@local":
    # The verify phase's end (``tasks.stack_steps.kept``, after the verdict): no server runs here
    # (its judgement is tests/lxc/test_upgrade_lxc.py's), so the verdict is good: the trial ends,
    # then retention removes what waited for it, then the record is written from what is left.
    stack_switch.trial_passed(name="The verdict: the stack serves", stacks=STACKS)
    stack_switch.retention(name="Stack retention, after the verdict", stacks=STACKS,
                           wanted=lock.id, keep=data.keep, restart_on_change=True)
    wheel_store.holds(name="The store knows this container's locks", store=data.store,
                      key=user_key("lxc", data.lxc_name), stacks=STACKS, wanted=lock.id)
phase.done(name="Verify done", phase="verify")
if host.name == "@local":
    from pyinfra.context import state

    planned = {key: wheel_store.planned_record(state.inventory.get_host(name), STACKS, lock.id,
                                               data.keep, True)
               for key, name in data.planned.items()}
    wheel_store.pruned(name="Wheel store retention", path=data.store, keep=data.keep,
                       platform="lxc", lxc_path=data.lxc_path, planned=planned,
                       wanted=[lock.id])
