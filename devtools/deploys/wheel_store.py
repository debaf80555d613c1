"""Test and bench deploy: the stack step of the deploy alone, on a plain LXC host (``@local``)
and its containers (``@lxc/NAME``), for a lock given in host data.

On ``@local``: the wheel store (``operations/wheels.store``) the container phase installs
from. In each container: the venv (``venv.venv``), the lock file, and the locked install
(``venv.locked_venv``) from the store, offline, with the uv binary the host data names.

Host data: ``lock_file`` (on this machine), ``pins`` (``[[name, version], ...]``), ``python``,
``store`` (the store's path on the host and in the containers), ``uv`` (in the containers),
``own`` (a list: the venv holds these itself and reads the rest from the host's shared layer,
``operations/layer.venv_on_layer``, as the deploy's ``shared_layer`` does; None: the whole set).
"""

from io import StringIO
from pathlib import Path

from pyinfra import host

from pve_sglang.stack import lock as stack_lock
from pve_sglang.operations import layer, paths, venv, verify, wheels

data = host.data
lock = stack_lock.parse(Path(data.lock_file))
key = stack_lock.LockKey(pins=tuple(tuple(pin) for pin in data.pins), python=data.python)

if host.name == "@local":
    wheels.store(name=f"Wheel store {data.store}", path=data.store, lock=lock, key=key)
else:
    venv.venv(name="venv /opt/stack/venv", uv=data.uv, path="/opt/stack/venv",
              python="/usr/bin/python3")
    paths.put(name="Stack lock", src=StringIO(lock.text), dest="/opt/stack/stack.lock", mode="644")
    own = None if data.get("own") is None else tuple(data.own)
    lock_file = "/opt/stack/stack.lock"
    if own is not None:
        lock_file = "/opt/stack/stack-venv.lock"
        layer.venv_on_layer(uv=data.uv, python="/opt/stack/venv/bin/python", tools="/opt/stack",
                            venv_path="/opt/stack/venv", python_version=data.python,
                            store=data.store, lock=lock, lock_file=lock_file, own=own)
    venv.locked_venv(name="Stack as locked, from the wheel store", uv=data.uv,
                     python="/opt/stack/venv/bin/python", tools="/opt/stack",
                     lock_file=lock_file, lock=lock,
                     args=venv.source_args(None, None, None, data.store),
                     python_version=data.python, own=None if own is None else list(own))
    verify.stack_as_locked(name="The stack is the locked set", python="/opt/stack/venv/bin/python",
                           tools="/opt/stack", lock=lock)
