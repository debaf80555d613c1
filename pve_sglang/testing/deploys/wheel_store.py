"""Test and bench deploy: the stack step of the deploy alone, on a plain LXC host (``@local``)
and its containers (``@lxc/NAME``), for a lock given in host data.

On ``@local``: the wheel store (``operations/wheels.store``) the container phase installs
from. In each container: the venv (``stack.venv``), the lock file, and the locked install
(``stack.locked_venv``) from the store, offline, with the uv binary the host data names.

Host data: ``lock_file`` (on this machine), ``pins`` (``[[name, version], ...]``), ``python``,
``store`` (the store's path on the host and in the containers), ``uv`` (in the containers).
"""

from io import StringIO
from pathlib import Path

from pyinfra import host

from pve_sglang import stack_lock
from pve_sglang.operations import paths, stack, verify, wheels

data = host.data
lock = stack_lock.parse(Path(data.lock_file))
key = stack_lock.LockKey(pins=tuple(tuple(pin) for pin in data.pins), python=data.python)

if host.name == "@local":
    wheels.store(name=f"Wheel store {data.store}", path=data.store, lock=lock, key=key)
else:
    stack.venv(name="venv /opt/stack/venv", uv=data.uv, path="/opt/stack/venv",
               python="/usr/bin/python3")
    paths.put(name="Stack lock", src=StringIO(lock.text), dest="/opt/stack/stack.lock", mode="644")
    stack.locked_venv(name="Stack as locked, from the wheel store", uv=data.uv,
                      python="/opt/stack/venv/bin/python", tools="/opt/stack",
                      lock_file="/opt/stack/stack.lock", lock=lock,
                      args=stack.source_args(None, None, None, data.store),
                      python_version=data.python)
    verify.stack_as_locked(name="The stack is the locked set", python="/opt/stack/venv/bin/python",
                           tools="/opt/stack", lock=lock)
