"""One measured deploy (wall time, CPU, commands, changes), and the rounds of first and no-op runs."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from devtools.deploy_cost import log
from devtools.deploy_cost.counting import (
    overlap,
    parse_run_json,
    restart_commands,
    stage_seconds,
)
from devtools.deploy_cost.fleet import REPO, container_snapshot, hosts_file


class Bench:
    """The fleets of the run: one set of containers per size for this checkout and, with
    ``--against``, one more for the other revision. Each checkout converges its own: a
    remote file that differs between the two (a script they upload) would otherwise be
    written back and forth, and neither no-op would be one."""

    def __init__(self, work: Path, tarball: Path, wh: Path, sizes: list[int], unit: str,
                 against: bool = False):
        self.work = work
        self.lxc_path = work / "lxc"
        self.lxc_path.mkdir()
        self.lxc_path.chmod(0o755)
        self.unit = unit
        tag = os.getpid() % 100000
        self.sets: dict[tuple[str, int], list[str]] = {}
        self.hosts: dict[tuple[str, int], Path] = {}
        for variant in ("new", "old") if against else ("new",):
            prefix = "" if variant == "new" else "o"
            for n in sizes:
                key = (variant, n)
                self.sets[key] = [f"pvsb{tag}-{prefix}{n}-{i}" for i in range(1, n + 1)]
                self.hosts[key] = work / f"hosts-{prefix}{n}.yml"
                hosts_file(self.hosts[key], self.lxc_path, tarball, wh, self.sets[key])
        self.runs = 0

    def deploy(self, n: int, label: str, checkout: "Checkout | None" = None) -> dict[str, Any]:
        """One pyinfra run against the set of N containers: wall time, JSON, commands. CHECKOUT:
        another revision's ``inventory.py deploy.py`` and package (``--against``); None: this one."""
        self.runs += 1
        stem = self.work / f"run{self.runs:02d}-{label}-{n}"
        cmd_log = stem.with_suffix(".commands.json")
        env = {**os.environ, "PVE_SGLANG_HOSTS": str(self.hosts[(variant(checkout), n)])}
        cwd = REPO
        if checkout is not None:
            cwd = checkout.path
            env = checkout.environ(env)
        argv = [sys.executable, "-m", "devtools.deploy_cost.driver", str(cmd_log), "--",
                "inventory.py", "deploy.py", "-y", "--json"]
        load = os.getloadavg()[0]
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        started_at = time.time()
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU of pyinfra and of every command it waited for (lxc-attach and what runs inside).
        cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
        stem.with_suffix(".stderr.txt").write_text(proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} run of {n} containers failed ({proc.returncode}):\n"
                               + proc.stderr[-4000:])
        result = parse_run_json(proc.stdout)
        if result["errors"] or result["failed_hosts"]:
            raise RuntimeError(f"{label} run of {n} containers: errors {result['failed']}")
        log_doc = json.loads(cmd_log.read_text())
        commands = log_doc["commands"]
        stages = stage_seconds(log_doc["stages"])
        stages["Startup"] = round(stages.get("Startup", 0) + log_doc["started_at"] - started_at, 3)
        stages["Exit"] = round(wall - sum(stages.values()), 3)
        return {
            "containers": n,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            # pyinfra's own Python vs the processes it started (lxc-attach, what runs inside)
            "cpu_pyinfra_s": round(log_doc["cpu_pyinfra_s"], 3),
            "cpu_commands_s": round(log_doc["cpu_commands_s"], 3),
            "load_before": round(load, 2),
            "command_seconds": round(sum(c["seconds"] for c in commands), 3),
            "changes": result["changes"],
            "no_change": result["no_change"],
            "operations": result["operations"],
            "changed": result["changed"],
            "commands": len(commands),
            "commands_by_kind": dict(Counter(c["kind"] for c in commands)),
            "restart_commands": restart_commands(commands),
            "stage_s": stages,
            "prepare_overlap": overlap(commands, "Prepare"),
            "execute_overlap": overlap(commands, "Execute"),
            "_commands": commands,
        }

    def snapshot(self, n: int, checkout: "Checkout | None" = None) -> dict[str, dict[str, str]]:
        return {name: container_snapshot(self.lxc_path, name, self.unit)
                for name in self.sets[(variant(checkout), n)]}


def variant(checkout: "Checkout | None") -> str:
    """Whose fleet a run uses: this checkout's ("new") or the ``--against`` one's ("old")."""
    return "new" if checkout is None else "old"


def rounds(bench: Bench, sizes: list[int], reps: int, against: "Checkout | None" = None
           ) -> tuple[dict[int, dict], dict[int, list[dict]], dict[int, bool], dict[int, list[dict]]]:
    """The first run of each size, then REPS no-op runs per size, sizes interleaved in each round;
    with AGAINST, each no-op run of this checkout follows one of AGAINST's on its own fleet of
    the same size, made by AGAINST's own first run (old 1, new 1, old 2, new 2, ...), so both
    come from the same conditions.

    Returns the first runs, the no-op runs, per size whether every container's snapshot (init
    process, unit invocation) stayed the same around every no-op run (either checkout's), and
    AGAINST's no-op runs (empty without it).
    """
    variants = ([("old", against)] if against else []) + [("new", None)]
    first: dict[int, dict] = {}
    for n in sizes:
        for label, checkout in variants:
            log(f"first run{f' ({label})' if against else ''}, {n} container(s) ...")
            run = bench.deploy(n, "first" if checkout is None else "first-old", checkout)
            log(f"  {run['wall_s']:.1f}s, {run['changes']} changes, {run['commands']} commands")
            if checkout is None:
                first[n] = run

    noop: dict[int, list[dict]] = {n: [] for n in sizes}
    old: dict[int, list[dict]] = {n: [] for n in sizes}
    snapshots_ok = {n: True for n in sizes}
    before = {(label, n): bench.snapshot(n, checkout) for n in sizes for label, checkout in variants}
    for rep in range(reps):
        for n in sizes:
            for label, checkout in variants:
                run = bench.deploy(n, "noop" if checkout is None else "noop-old", checkout)
                after = bench.snapshot(n, checkout)
                run["state_unchanged"] = after == before[(label, n)]
                if not run["state_unchanged"]:
                    snapshots_ok[n] = False
                    log(f"  state changed in a no-op run ({label}) of {n}: "
                        f"{before[(label, n)]} -> {after}")
                before[(label, n)] = after
                (noop if checkout is None else old)[n].append(run)
                log(f"no-op {rep + 1}/{reps}{f' ({label})' if against else ''}, {n} container(s): "
                    f"{run['wall_s']:.2f}s, {run['commands']} commands, {run['changes']} changes")
    return first, noop, snapshots_ok, old


class Checkout:
    """A git worktree of revision REV in the bench's work dir, whose own ``inventory.py
    deploy.py`` and ``pve_sglang`` a run uses (``PYTHONPATH`` before this venv's editable
    install of the current checkout)."""

    def __init__(self, work: Path, rev: str):
        self.rev = rev
        self.path = work / "against"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q",
                        str(self.path), rev], check=True)
        self.commit = subprocess.run(["git", "-C", str(self.path), "rev-parse", "--short", "HEAD"],
                                     check=True, capture_output=True, text=True).stdout.strip()
        # The package its pyinfra run imports must be its own: checked, not assumed.
        probe = subprocess.run(
            [sys.executable, "-c", "import pve_sglang, pve_sglang.connectors.lxc as c, "
             "devtools.deploy_cost.driver as d; print(pve_sglang.__file__); "
             "print(c.__file__); print(d.__file__)"],
            cwd=self.path, env=self.environ(dict(os.environ)), check=True, capture_output=True,
            text=True)
        self.imported = probe.stdout.split()
        outside = [f for f in self.imported if not Path(f).resolve().is_relative_to(self.path.resolve())]
        if outside:
            raise RuntimeError(f"--against {rev}: imports {outside}, not its worktree's")
        log(f"against {rev} ({self.commit}): worktree {self.path}, imports {self.imported[0]}")

    def environ(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, "PYTHONPATH": os.pathsep.join(
            [str(self.path), *filter(None, [env.get("PYTHONPATH")])])}

    def remove(self) -> None:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(self.path)],
                       check=False, capture_output=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False,
                       capture_output=True)
