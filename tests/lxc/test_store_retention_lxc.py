"""The wheel store's retention on a real plain LXC host (this machine) and real unprivileged
containers that mount the store read-only, through the pyinfra CLI.

The deploy is ``devtools/deploys/store_retention.py``: the deploy's own store, shared layer,
switch, container retention, container record and store retention operations. Four small real
locks (``requests`` 2.31.0 to 2.32.3 and their dependencies, a few MB each, made with uv from
the package index): three upgrades of one container, the oldest set pruned (shown by ``--dry``
first); a fourth, while a second container stays on an older set, which is kept; a container the
deploy does not know mounting the store, which blocks; then neither, and a re-run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from devtools.wheel_store_site import PYINFRA, UV, WheelStoreSite
from pve_sglang.project import ROOT
from pve_sglang.stack import lock as stack_lock
from pve_sglang.stack.store_retention import USERS

DEPLOY = "devtools/deploys/store_retention.py"
RELEASES = ("2.31.0", "2.32.0", "2.32.2", "2.32.3")


class Site(WheelStoreSite):
    """The wheel store site with a lock per run and the retention deploy."""

    def run(self, lock, *boxes, dry: bool = False) -> tuple[dict, str]:
        """``({host: [changed operations]}, log)`` of the deploy of LOCK on BOXES."""
        key = stack_lock.LockKey(pins=(("requests", lock.packages["requests"]),), python="3.11")
        common = {"lock_file": str(lock.path), "pins": [list(p) for p in key.pins],
                  "python": "3.11", "store": str(self.store), "uv": UV, "keep": 2}
        lxc_path = str(boxes[0].lxc_path)
        planned = {f"lxc-{b.name}": b.inventory_name for b in boxes}
        hosts = [("@local", {**common, "lxc_path": lxc_path, "planned": planned})] + \
            [(b.inventory_name, {**b.host_data(), **common}) for b in boxes]
        inventory = self.root / "inventory.py"
        inventory.write_text(f"hosts = {hosts!r}\n")
        started = time.monotonic()
        done = subprocess.run(
            [str(PYINFRA), str(inventory), DEPLOY, *(["--dry"] if dry else ["-y", "--json"])],
            cwd=ROOT, capture_output=True, text=True, timeout=1800,
            env={**os.environ, "PVE_SGLANG_CACHE": str(self.cache)})
        self.seconds = time.monotonic() - started
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-5000:]
        changed: dict = {}
        if not dry:
            for op in json.loads(done.stdout)["results"]["operations"]:
                for name in op["success"]:
                    changed.setdefault(name, []).append(op["name"])
        return changed, log

    def layers(self) -> set[str]:
        return {p.name for p in (self.store / "layers").iterdir()}

    def sets(self) -> set[str]:
        return {p.name for p in (self.store / ".locks").iterdir() if "." not in p.name}

    def wheels(self) -> set[str]:
        return {p.name for p in self.store.glob("*.whl")}


@pytest.fixture
def site(tmp_path, lxc_container_factory, package_index):
    locks = [package_index(lambda v=v: stack_lock.compile_lock(
        stack_lock.LockKey(pins=(("requests", v),), python="3.11"), tmp_path / f"{v}.lock"),
        f"the lock of requests {v}") for v in RELEASES]
    make = lambda **kwargs: lxc_container_factory(**kwargs)[0]  # noqa: E731
    made = Site(tmp_path / "site", make, locks[0], None)
    made.locks = locks
    return made


def manifest_wheels(lock) -> set[str]:
    from pve_sglang.stack.wheel_fetch import fetch

    return set(fetch(lock, stack_lock.LockKey(pins=(("requests", lock.packages["requests"]),),
                                              python="3.11"))[1])


def test_three_upgrades_keep_the_two_newest_sets_and_what_containers_hold(site):
    times = {}
    first_lock, second_lock, third_lock, fourth_lock = site.locks
    first, second = site.container(), site.container()
    site.run(first_lock, first)
    site.run(second_lock, first, second)  # the second container stays on this one
    records = site.store / USERS
    assert {p.name for p in records.iterdir()} == {f"lxc-{first.name}.json",
                                                   f"lxc-{second.name}.json"}
    assert site.layers() == {first_lock.id, second_lock.id}
    own = manifest_wheels(first_lock) - manifest_wheels(second_lock) - manifest_wheels(third_lock)
    assert own, "the oldest lock has no wheel of its own: the test proves nothing on wheels"

    # The third upgrade: planned (--dry, from the container's stacks and its retention), then run.
    _, dry = site.run(third_lock, first, dry=True)
    assert f"removing lock {first_lock.id} (1 layer" in dry, dry[-3000:]
    assert site.layers() == {first_lock.id, second_lock.id} and own <= site.wheels()
    started = time.monotonic()
    changed, log = site.run(third_lock, first)
    times["third upgrade"] = time.monotonic() - started
    freed = int(log.split(" bytes)")[0].rsplit("(", 1)[1])
    assert "Wheel store retention" in changed["@local"], changed
    assert first.attach("ls /opt/sglang/venv.stacks").stdout.split() == \
        sorted([second_lock.id, third_lock.id])
    assert site.layers() == site.sets() == {second_lock.id, third_lock.id}
    assert not own & site.wheels()
    assert manifest_wheels(second_lock) | manifest_wheels(third_lock) <= site.wheels()
    assert not list((site.store / ".locks").glob("*.removing"))

    # A fourth upgrade: the second container still runs the second set, which stays.
    changed, log = site.run(fourth_lock, first)
    assert site.layers() == site.sets() == {second_lock.id, third_lock.id, fourth_lock.id}
    assert "Wheel store retention" not in changed.get("@local", []), changed

    # The second container goes; a container the deploy does not know mounts the store.
    second.destroy()
    unknown = site.container()
    changed, log = site.run(fourth_lock, first)
    assert f"wheel store {site.store} is not pruned: lxc-{unknown.name} mounts it" in log, \
        log[-3000:]
    assert site.layers() == {second_lock.id, third_lock.id, fourth_lock.id}
    assert changed == {}, changed

    # Without it, the second set goes (the gone container's record holds nothing).
    unknown.destroy()
    changed, log = site.run(fourth_lock, first)
    assert changed == {"@local": ["Wheel store retention"]}, changed
    assert site.layers() == site.sets() == {third_lock.id, fourth_lock.id}
    # The container imports from the layer of its serving stack.
    assert first.attach("/opt/sglang/venv/bin/python -c 'import sys; sys.path.append("
                        f"\"{site.store}/layers/{fourth_lock.id}\"); import requests; "
                        "print(requests.__version__)'").stdout.strip() == RELEASES[-1]

    started = time.monotonic()
    changed, _ = site.run(fourth_lock, first)
    times["re-run"] = time.monotonic() - started
    assert changed == {}, changed
    print(f"\nstore retention: the third upgrade freed {freed} bytes; " + ", ".join(
        f"{k} {v:.1f}s" for k, v in times.items()))
