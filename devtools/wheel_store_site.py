"""A plain LXC host for the wheel store, on this machine: the store, the pyinfra machine's
cache, a lock, and unprivileged containers without network that mount the store read-only.
The deploy run on it is ``deploys/wheel_store.py`` (the deploy's own store and install
operations) through the pyinfra CLI. Used by tests/lxc/test_wheel_store_lxc.py and
bench/stack_store.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pve_sglang.project import ROOT
from pve_sglang.stack.lock import Lock, LockKey
from devtools.lxc_env import reachable_by_container_root

PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY = "devtools/deploys/wheel_store.py"
#: The uv binary in the containers (this machine's, mounted read-only).
UV = "/opt/uv/uv"


class WheelStoreSite:
    """ROOT/store (the host's store), ROOT/pyinfra-machine-cache, containers from MAKE
    (``LxcEnv.create``-like: ``make(extra_config=..., unprivileged=True)``)."""

    def __init__(self, root: Path, make, lock: Lock, key: LockKey,
                 own: tuple[str, ...] | None = None):
        from uv import find_uv_bin

        # OWN: the venvs hold these and read the rest from the shared layer; None: whole set.
        self.root, self.make, self.lock, self.key, self.own = root, make, lock, key, own
        self.cache = root / "pyinfra-machine-cache"
        self.store = root / "store"
        self.store.mkdir(parents=True, exist_ok=True)
        uv_dir = root / "uv"
        uv_dir.mkdir(exist_ok=True)
        shutil.copy(find_uv_bin(), uv_dir / "uv")
        reachable_by_container_root(self.store)
        self.mounts = [f"lxc.mount.entry = {self.store} {str(self.store).lstrip('/')} none "
                       "bind,ro,create=dir 0 0",
                       f"lxc.mount.entry = {uv_dir} opt/uv none bind,ro,create=dir 0 0"]
        self.last: subprocess.CompletedProcess | None = None
        self.seconds = 0.0

    def container(self):
        from devtools.lxc_env import LxcError

        # Each start: another pytest session on this machine resets /tmp/pytest-of-root to
        # 0700 when it begins, and the unprivileged root could no longer reach the mounts.
        reachable_by_container_root(self.store)
        try:
            return self.make(extra_config=self.mounts, unprivileged=True)
        except LxcError:
            # A start seen aborting once while other containers started and stopped on this
            # machine: one more try, and a second failure stands.
            reachable_by_container_root(self.store)
            return self.make(extra_config=self.mounts, unprivileged=True)

    def deploy(self, *boxes, limit: str | None = None) -> dict:
        """The deploy on @local and BOXES (LIMIT: one inventory name only): ``{host: [names of
        the operations it changed]}``, or ``{"failed": output}``; its wall time in ``seconds``."""
        common = {"lock_file": str(self.lock.path), "pins": [list(p) for p in self.key.pins],
                  "python": self.key.python, "store": str(self.store), "uv": UV,
                  "own": None if self.own is None else list(self.own)}
        hosts = [("@local", common)] + [(b.inventory_name, {**b.host_data(), **common}) for b in boxes]
        inventory = self.root / "inventory.py"
        inventory.write_text(f"hosts = {hosts!r}\n")
        started = time.monotonic()
        done = subprocess.run(
            [str(PYINFRA), str(inventory), DEPLOY, "-y", "--json",
             *(["--limit", limit] if limit else [])],
            cwd=ROOT, capture_output=True, text=True, timeout=3600,
            env={**os.environ, "PVE_SGLANG_CACHE": str(self.cache)})
        self.seconds = time.monotonic() - started
        self.last = done
        if done.returncode != 0:
            return {"failed": done.stdout[-3000:] + done.stderr[-3000:]}
        changed: dict = {}
        for op in json.loads(done.stdout)["results"]["operations"]:
            for name in op["success"]:
                changed.setdefault(name, []).append(op["name"])
        return changed


def installed(box, python: str = "/opt/stack/venv/bin/python") -> dict[str, str]:
    """``{normalized name: version}`` of what the container's venv imports (the first of a name
    on ``sys.path``: the venv's own before the shared layer's)."""
    from pve_sglang.stack.lock import normalized

    out = box.attach(f"{python} -c 'import importlib.metadata as m, json; "
                     "print(json.dumps([[d.metadata[\"Name\"], d.version] for d in m.distributions()]))'")
    found: dict[str, str] = {}
    for name, version in json.loads(out.stdout):
        found.setdefault(normalized(name), version)
    return found


def own_site_packages(box, venv: str = "/opt/stack/venv", python: str = "3.11") -> set[str]:
    """The names in the venv's own site-packages folder."""
    return set(box.attach(f"ls {venv}/lib/python{python}/site-packages").stdout.split())
