"""Retention in a host's wheel store: the pure decisions (``stack/store_retention.py``) on
tables, the plan's prediction of a container's record, the store's read on a store made here
(the fact's own shell command), and the removal's commands run on it, cut short and run again."""

from __future__ import annotations

import subprocess

import pytest

from pve_sglang.facts.wheel_store import WheelStoreState
from pve_sglang.operations.wheel_store import commands, held, held_after_retention
from pve_sglang.stack.store_retention import (
    Prune, StoreLock, decide, mount_source, mounting, user_key, user_locks, user_text,
)

A, B, C, D = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc", "dddddddddddddddd"


def lock(mtime: float, *wheels: str, complete: bool = True, removing: bool = False) -> StoreLock:
    return StoreLock(mtime=mtime, wheels=wheels, complete=complete, removing=removing)


# Three sets, oldest A; A and B share x.whl; each has a wheel of its own.
STORE = {A: lock(1, "x-1.whl", "a-1.whl"), B: lock(2, "x-1.whl", "b-1.whl"),
         C: lock(3, "c-1.whl")}

DECISIONS = [
    # (why, locks, users, mounts, keep, expected Prune)
    ("three upgrades of one container: the oldest set goes, its own wheel only",
     STORE, {"lxc-a": {B, C}}, {"lxc-a"}, 2,
     Prune(locks=(A,), wheels=("a-1.whl",), kept=(B, C))),
    ("a second container still on the oldest set keeps it",
     STORE, {"lxc-a": {B, C}, "lxc-b": {A}}, {"lxc-a", "lxc-b"}, 2,
     Prune(kept=(A, B, C))),
    ("a container mounting the store without a record blocks every removal",
     STORE, {"lxc-a": {C}}, {"lxc-a", "lxc-x"}, 2, Prune(blocked=("lxc-x",), kept=(A, B, C))),
    ("an unreadable record blocks too",
     STORE, {"lxc-a": {C}, "lxc-b": None}, {"lxc-a", "lxc-b"}, 2,
     Prune(blocked=("lxc-b",), kept=(A, B, C))),
    ("a record of a container that no longer mounts the store holds nothing",
     STORE, {"lxc-a": {C}, "lxc-gone": {A}}, {"lxc-a"}, 1,
     Prune(locks=(A, B), wheels=("a-1.whl", "b-1.whl", "x-1.whl"), kept=(C,))),
    ("the newest are kept besides the held ones",
     STORE, {"lxc-a": {A}}, {"lxc-a"}, 1, Prune(locks=(B,), wheels=("b-1.whl",), kept=(A, C))),
    ("a wheel another kept set names stays",
     STORE, {"lxc-a": {B}}, {"lxc-a"}, 1, Prune(locks=(A,), wheels=("a-1.whl",), kept=(B, C))),
    ("no container mounts the store: the newest only",
     STORE, {}, set(), 2, Prune(locks=(A,), wheels=("a-1.whl",), kept=(B, C))),
    ("a removal cut short is finished",
     {**STORE, D: lock(0, "d-1.whl", complete=False, removing=True)}, {"lxc-a": {B, C}},
     {"lxc-a"}, 2, Prune(locks=(A, D), wheels=("a-1.whl", "d-1.whl"), kept=(B, C))),
    ("a set fetched again after a cut removal: kept, its stale file goes",
     {**STORE, C: lock(3, "c-1.whl", removing=True)}, {"lxc-a": {B, C}}, {"lxc-a"}, 2,
     Prune(locks=(A,), wheels=("a-1.whl",), kept=(B, C), stale=(C,))),
    ("a held lock the store does not have changes nothing",
     STORE, {"lxc-a": {D}}, {"lxc-a"}, 3, Prune(kept=(A, B, C))),
    ("names not ours are never listed: a file that is not a lock id, a wheel name with a path",
     {"notalock": lock(0, "n-1.whl"), A: lock(1, "../etc/passwd", "a-1.whl"), C: lock(3)},
     {}, set(), 1, Prune(locks=(A,), wheels=("a-1.whl",), kept=(C,))),
    ("nothing to do", STORE, {"lxc-a": {A, B, C}}, {"lxc-a"}, 2, Prune(kept=(A, B, C))),
]


@pytest.mark.parametrize("why,locks,users,mounts,keep,expected", DECISIONS,
                         ids=[row[0] for row in DECISIONS])
def test_decide(why, locks, users, mounts, keep, expected):
    assert decide(locks, users, mounts, keep) == expected


STORE_PATH = "/var/cache/pve-sglang/wheels"
MOUNTS = [
    # (platform, config line, the source it mounts, mounts the store)
    ("lxc", f"lxc.mount.entry = {STORE_PATH} var/cache/pve-sglang/wheels none bind,ro 0 0",
     STORE_PATH, True),
    ("lxc", "lxc.mount.entry = /var/cache srv none bind 0 0", "/var/cache", True),  # above it
    ("lxc", f"lxc.mount.entry = {STORE_PATH}/layers l none bind 0 0", f"{STORE_PATH}/layers", True),
    ("lxc", "lxc.mount.entry = /var/cache/pve-sglang/wheels2 w none bind 0 0",
     "/var/cache/pve-sglang/wheels2", False),
    ("lxc", "lxc.mount.fstab = /etc/lxc/ct.fstab", "?", True),  # unknown: counted
    ("lxc", "lxc.uts.name = ct", None, False),
    ("pve", f"mp0: {STORE_PATH},mp={STORE_PATH},ro=1", STORE_PATH, True),
    ("pve", f"mp3: volume={STORE_PATH}/,mp=/w", f"{STORE_PATH}/", True),
    ("pve", "mp1: local-lvm:vm-105-disk-1,mp=/data,size=8G", "local-lvm:vm-105-disk-1", False),
    ("pve", "memory: 4096", None, False),
]


@pytest.mark.parametrize("platform,line,source,mounts", MOUNTS, ids=[row[1] for row in MOUNTS])
def test_mounts(platform, line, source, mounts):
    assert mount_source(platform, line) == source
    assert mounting(platform, {"k": [line]}, STORE_PATH) == ({"k"} if mounts else set())


def test_user_keys_and_records():
    assert user_key("pve", 105) == "pct-105" and user_key("lxc", "gpu-1") == "lxc-gpu-1"
    for bad in ("a/b", "$(touch x)", "x'y", "a\nb", "a\n", "", "../x"):
        with pytest.raises(ValueError):
            user_key("lxc", bad)
    assert user_locks(user_text("lxc-a", {B, A})) == {A, B}
    assert user_text("lxc-a", {B, A}) == user_text("lxc-a", [A, B])  # one text per set
    assert user_locks("not json") is None and user_locks('{"locks": "x"}') is None
    assert user_locks(f'{{"locks": ["{A}", "../x"]}}') == {A}


def stacks_read(*names, target=None, previous=None, trial=None, mtimes=None):
    return {"kind": "link" if target else "missing", "target": target and f"venv.stacks/{target}",
            "stacks": {n: {"mtime": (mtimes or {}).get(n, i + 1)} for i, n in enumerate(names)},
            "state": {"previous": previous, "trial": trial}}


PREDICTIONS = [
    # (why, read, wanted, keep, restart_on_change, predicted record)
    ("the third upgrade: the oldest stack goes", stacks_read(A, B, target=B, previous=A), C, 2,
     True, {B, C}),
    ("a re-run", stacks_read(B, C, target=C, previous=B), C, 2, True, {B, C}),
    ("restart pending: the serving one and its rollback target stay, and the new one",
     stacks_read(A, B, target=B, previous=A), C, 2, False, {A, B, C}),
    ("a first deploy", stacks_read(), A, 2, True, {A}),
]


@pytest.mark.parametrize("why,raw,wanted,keep,restart,expected", PREDICTIONS,
                         ids=[row[0] for row in PREDICTIONS])
def test_the_plan_predicts_the_record(why, raw, wanted, keep, restart, expected):
    assert held_after_retention("/opt/sglang/venv", raw, wanted, keep, restart) == expected


def test_the_record_names_every_stack_and_the_state_record():
    assert held(stacks_read(B, C, target=C, previous=A, trial=C), C) == {A, B, C}
    assert held(stacks_read(), D) == {D}


def make_store(root, locks: dict[str, tuple[str, ...]], removing=()) -> str:
    store = root / "store"
    for sub in (".locks", ".users", "layers"):
        (store / sub).mkdir(parents=True, exist_ok=True)
    for i, wheels in locks.items():
        name = f"{i}.removing" if i in removing else i
        (store / ".locks" / name).write_text("".join(f"{'0' * 64}  {w}\n" for w in wheels))
        (store / ".locks" / f"{i}.layer").write_text("")
        (store / "layers" / i / "pkg").mkdir(parents=True)
        (store / "layers" / i / "pkg" / "m.py").write_text("x" * 1000)
        for w in wheels:
            (store / w).write_text("w" * 100)
    return str(store)


def read(store: str, lxc_path: str) -> dict:
    fact = WheelStoreState()
    out = subprocess.run(["sh", "-c", fact.command(store=store, platform="lxc",
                                                   lxc_path=lxc_path).get_raw_value()],
                         capture_output=True, text=True, check=True)
    return fact.process(out.stdout.splitlines())


def run(cmds) -> None:
    for cmd in cmds:
        subprocess.run(["sh", "-c", cmd.get_raw_value()], check=True)


def test_removal_on_a_real_store_cut_short_converges(tmp_path):
    """The fact's own command reads a store made here; the removal's commands, cut after the
    rename of the manifest (and again after the layers), are finished by the next plan."""
    store = make_store(tmp_path, {A: ("x-1.whl", "a-1.whl"), B: ("x-1.whl", "b-1.whl"),
                                  C: ("c-1.whl",)})
    lxc_path = tmp_path / "lxc"
    (lxc_path / "ct").mkdir(parents=True)
    (lxc_path / "ct" / "config").write_text(f"lxc.mount.entry = {store} s none bind,ro 0 0\n")
    (tmp_path / "store" / ".users" / "lxc-ct.json").write_text(user_text("lxc-ct", {B, C}))
    found = read(store, str(lxc_path))
    assert found["users"] == {"lxc-ct": {B, C}} and found["sizes"]["a-1.whl"] == 100
    assert mounting("lxc", found["configs"], store) == {"lxc-ct"}
    plan = decide(found["locks"], found["users"], {"lxc-ct"}, 2)
    assert plan.locks == (A,) and plan.wheels == ("a-1.whl",)
    steps = commands(store, plan)
    run(steps[:1])  # cut short after the rename
    again = read(store, str(lxc_path))
    assert again["locks"][A].removing and not again["locks"][A].complete
    plan = decide(again["locks"], again["users"], {"lxc-ct"}, 2)
    assert plan.locks == (A,) and plan.wheels == ("a-1.whl",)
    run(commands(store, plan)[:3])  # cut short after the layers
    plan = decide(read(store, str(lxc_path))["locks"], again["users"], {"lxc-ct"}, 2)
    assert plan.wheels == ("a-1.whl",)
    run(commands(store, plan))
    left = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert left == [".locks", ".users", "b-1.whl", "c-1.whl", "layers", "x-1.whl"]
    assert sorted(p.name for p in (tmp_path / "store" / "layers").iterdir()) == [B, C]
    assert sorted(p.name for p in (tmp_path / "store" / ".locks").iterdir()) == \
        [B, f"{B}.layer", C, f"{C}.layer"]
    final = read(store, str(lxc_path))
    assert decide(final["locks"], final["users"], {"lxc-ct"}, 2) == Prune(kept=(B, C))


def test_the_host_phase_plans_the_removal_on_recorded_proxmox_answers():
    """``tasks/host.store_retention_phase`` on ``@fake`` hosts: a Proxmox host whose container
    105 (of the inventory) serves the default lock with the previous one as its rollback
    target, and whose store holds a third, older set. The plan reads the container's stacks,
    keeps both of its sets and removes the older one with the wheel only it names; a container
    120 that mounts the store without a record blocks it all (the control)."""
    from harness import plan_deploy
    from pve_sglang.facts.installed_stacks import Stacks
    from pve_sglang.facts.wheel_store import FolderSizes
    from pve_sglang.project import load_defaults
    from pve_sglang.stack import switch_rules as stacks
    from pve_sglang.stack.lock import default_key, lock_for
    from tasks.container import LOCK_FILE
    from tasks.host import store_retention_phase

    defaults = load_defaults()
    store, current = defaults["wheel_store"], lock_for(default_key()).id
    older, previous = "0" * 16, "1" * 16
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve"}
    pve = {**defaults, "platform": "pve", "containers": ["@fake/ct105"]}

    def answers(*configs: str) -> dict:
        stacks_read = (f"link|{stacks.link_target(defaults['venv_path'], current)}\n"
                       f"stack|{previous}|100|{{}}\nstack|{current}|200|{{}}\n"
                       f"state|{{\"previous\": \"{previous}\"}}")
        store_read = "\n".join([
            *(f"mount|pct-{vmid}|mp0: {store},mp={store},ro=1" for vmid in configs),
            f"lock|{older}|100", "wheel|0  old-1-py3-none-any.whl", "wheel|0  shared-1-py3-none-any.whl",
            f"lock|{previous}|200", "wheel|0  shared-1-py3-none-any.whl",
            f"lock|{current}|300", "wheel|0  shared-1-py3-none-any.whl",
            f"user|pct-105|{user_text('pct-105', {previous, current})}".rstrip(),
            "size|2000|old-1-py3-none-any.whl", "size|3000|shared-1-py3-none-any.whl"])
        layer = f"{store}/layers/{older}"
        return {
            Stacks().command(defaults["venv_path"], LOCK_FILE, stacks.state_path(
                defaults["service_name"])).get_raw_value(): stacks_read,
            WheelStoreState().command(store, "pve", defaults["lxc_path"]).get_raw_value(): store_read,
            FolderSizes().command([layer]).get_raw_value(): f"5000\t{layer}",
        }

    def plan(responses: dict) -> list[str]:
        ops = plan_deploy(store_retention_phase, hosts=[("pve1", pve), ("ct105", ct)],
                          responses=responses, groups={"pve_hosts": ["pve1"],
                                                       "gpu_containers": ["ct105"]})["pve1"]
        return [c for name, commands in ops if "Wheel store" in name for c in commands]

    removal = plan(answers("105"))
    assert removal, "nothing planned"
    assert any(f"mv -f {store}/.locks/{older} {store}/.locks/{older}.removing" in c
               for c in removal), removal
    assert any(f"rm -rf {store}/layers/{older}" in c for c in removal), removal
    assert any(f"rm -f -- {store}/old-1-py3-none-any.whl" == c for c in removal), removal
    assert not any("shared-1" in c or previous in c or current in c for c in removal), removal
    assert plan(answers("105", "120")) == []  # an unknown container mounts the store
