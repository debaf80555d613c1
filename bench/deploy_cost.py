"""What a deploy costs, measured against real LXC containers on this machine (issue 7).

    make bench                       # or: python bench/deploy_cost.py [--reps 5] [--sizes 1,2,4]

Steps, all in a private LXC path under /tmp that is destroyed at the end (also on error):

1. a rootfs tarball for the containers: ``pve_sglang/testing/lxc_env.py``'s cached Debian rootfs with the
   test-time additions (resolv.conf, this machine's CA certificates, sshd and apt timers off);
2. one hosts file per size (1, 2, 4 containers), every container installing the real sglang
   wheel (``stack_install: sglang-no-deps``) from a bind-mounted wheelhouse; the host has no
   GPU, so the CPU-runnable phases run: container create/start, CA store, apt base packages,
   uv, the venv, sglang, the autotune patch, the unit (not started: it needs a GPU);
3. the first run of each size (that sets the containers up), then the no-op re-runs, sizes
   interleaved in each round so that their ratios come from the same conditions.

Commands are counted for real: every deploy runs pyinfra's own CLI in a child Python
(``deploy_cost.py _driver``) that wraps ``pyinfra.connectors.local.run_local_process``, the
one place where a command leaves pyinfra on this machine (the ``@local`` host's commands and
every ``lxc-attach`` of the container connector). Each command is attributed to the fact,
operation or connector step that sent it (``_get_fact``, ``_run_host_op``,
``ContainerConnector.container_state``/``put_file``/``get_file`` are wrapped too).

Restarts: commands that restart or stop anything (``systemctl restart|stop|start``,
``lxc-stop``/``lxc-start``, ``pct reboot|start|stop``) are counted, and between runs each
container's init process (PID and start time) and the server unit's ``InvocationID`` and
``ExecMainStartTimestamp`` are compared.

Output: ``bench/results/deploy_cost.json``, ``bench/results/deploy_cost.png`` and a table.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["_driver"]:
    # As the pyinfra command does before anything else: gevent's monkey patching.
    import pyinfra_cli  # noqa: F401

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
WORK_PREFIX = "pve-sglang-bench-"
OWNER_FILE = "owner.pid"
CA_DIR = Path("/usr/local/share/ca-certificates")

# Goals of issue 7.
GOAL_NOOP_COMMANDS = 40  # commands of a no-op run of one container, fewer than this
GOAL_NOOP_OVER_FIRST = 0.25  # no-op wall time / first-run wall time, less than this
GOAL_FOUR_OVER_ONE = 1.5  # no-op wall time of 4 containers / of 1, less than this

#: Commands that restart, stop or start a service or a container.
RESTART_RE = re.compile(
    r"\bsystemctl\s+(?:--\S+\s+)*(?:restart|try-restart|reload-or-restart|stop|start|kill)\b"
    r"|\blxc-(?:stop|start)\b|\bpct\s+(?:reboot|start|stop|shutdown)\b|\breboot\b"
)


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The driver: pyinfra's CLI in this process, with every command recorded
# --------------------------------------------------------------------------------------------


def driver(log_path: str, pyinfra_args: list[str]) -> None:
    """Run ``pyinfra PYINFRA_ARGS`` here, writing every command it sends to LOG_PATH (JSON)."""
    import gevent

    from pyinfra.api import facts as facts_mod
    from pyinfra.api import operations as ops_mod
    from pyinfra.api.state import State
    from pyinfra.connectors import local as local_mod
    from pyinfra.connectors.local import LocalConnector
    from pyinfra_cli.main import main as pyinfra_main

    from pve_sglang.connectors.container import ContainerConnector

    t0 = time.monotonic()
    started_at = time.time()
    records: list[dict[str, Any]] = []
    stages: list[tuple[str, float]] = []
    stacks: dict[Any, list[dict[str, str]]] = {}
    current_state: list[Any] = []

    def stack() -> list[dict[str, str]]:
        return stacks.setdefault(gevent.getcurrent(), [])

    @contextmanager
    def frame(**values: str):
        frames = stack()
        frames.append(values)
        try:
            yield
        finally:
            frames.pop()

    def wrap(owner: Any, name: str, make_frame) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            with frame(**make_frame(*args, **kwargs)):
                return original(*args, **kwargs)

        setattr(owner, name, wrapper)

    def fact_frame(state, host, cls, args=None, kwargs=None, *rest, **kw):
        shown = ", ".join(f"{k}={v}" for k, v in sorted((kwargs or {}).items()))
        return {"kind": "fact", "name": cls.__name__, "args": shown[:160]}

    def op_frame(state, host, op_hash):
        meta = state.get_op_meta(op_hash)
        return {"kind": "op", "name": " / ".join(meta.names) or op_hash}

    wrap(facts_mod, "_get_fact", fact_frame)
    wrap(ops_mod, "_run_host_op", op_frame)
    wrap(LocalConnector, "run_shell_command", lambda self, *a, **k: {"host": self.host.name})
    wrap(ContainerConnector, "container_state",
         lambda self: {"kind": "connector", "name": "container state (lxc-info)"})
    wrap(ContainerConnector, "put_file",
         lambda self, src, dest, *a, **k: {"kind": "transfer", "name": f"put {dest}"})
    wrap(ContainerConnector, "get_file",
         lambda self, src, *a, **k: {"kind": "transfer", "name": f"get {src}"})

    original_set_stage = State.set_stage

    def set_stage(self, stage):
        if not current_state:
            current_state.append(self)
        stages.append((stage.name, time.monotonic() - t0))
        return original_set_stage(self, stage)

    State.set_stage = set_stage

    original_run = local_mod.run_local_process

    def run_local_process(command, *args, **kwargs):
        frames = stack()
        host = next((f["host"] for f in reversed(frames) if "host" in f), "?")
        inner = next((f for f in reversed(frames) if "kind" in f), {"kind": "other", "name": "?"})
        op = next((f["name"] for f in reversed(frames) if f.get("kind") == "op"), None)
        stage = current_state[0].current_stage.name if current_state else "?"
        start = time.monotonic()
        rc, output = original_run(command, *args, **kwargs)
        records.append({
            "host": host,
            "kind": inner["kind"],
            "name": inner["name"],
            "args": inner.get("args", ""),
            "op": op,
            "stage": stage,
            "start_s": round(start - t0, 4),
            "seconds": round(time.monotonic() - start, 4),
            "rc": rc,
            "command": command if len(command) <= 600 else command[:600] + "...",
        })
        return rc, output

    local_mod.run_local_process = run_local_process

    sys.argv = ["pyinfra", *pyinfra_args]
    code: Any = 0
    try:
        code = pyinfra_main()
    except SystemExit as exit_:
        code = exit_.code
    finally:
        stages.append(("End", time.monotonic() - t0))
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        Path(log_path).write_text(json.dumps({
            "started_at": started_at, "stages": stages, "commands": records,
            "cpu_pyinfra_s": me.ru_utime + me.ru_stime,
            "cpu_commands_s": kids.ru_utime + kids.ru_stime,
        }))
    sys.exit(code if isinstance(code, int) else (0 if code is None else 1))


# --------------------------------------------------------------------------------------------
# Pure parts: parsing pyinfra's JSON, summarising commands, statistics
# --------------------------------------------------------------------------------------------


def parse_run_json(text: str) -> dict[str, Any]:
    """Changes, no-changes and errors of a ``pyinfra --json`` run (its stdout)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON document in pyinfra's output")
    doc = json.loads(text[start:])
    results = doc.get("results") or {}
    ops = results.get("operations") or []
    changed = [(op["name"], host) for op in ops for host in op.get("success", [])]
    errors = [(op["name"], host) for op in ops for host in op.get("error", [])]
    no_change = sum(len(op.get("no_change", [])) for op in ops)
    return {
        "operations": len(ops),
        "changes": len(changed),
        "no_change": no_change,
        "errors": len(errors),
        "changed": [f"{host}: {name}" for name, host in changed],
        "failed": [f"{host}: {name}" for name, host in errors],
        "failed_hosts": list(results.get("failed_hosts") or []),
        "planned": len(doc.get("plan") or []),
    }


def restart_commands(commands: list[dict[str, Any]]) -> list[str]:
    """The commands that restart, stop or start a service or container."""
    return [c["command"] for c in commands if c["kind"] != "fact" and RESTART_RE.search(c["command"])]


def stage_seconds(stages: list[list]) -> dict[str, float]:
    """``[(stage, t), ...]`` transitions as seconds spent in each stage (and before the first)."""
    result: dict[str, float] = {}
    previous_name, previous_t = "Startup", 0.0
    for name, t in stages:
        result[previous_name] = round(result.get(previous_name, 0.0) + t - previous_t, 3)
        previous_name, previous_t = name, t
    return result


def summarise_commands(commands: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and time by kind, by fact, by operation, by host and stage; repeated facts."""
    by_kind: Counter = Counter(c["kind"] for c in commands)
    facts: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, list[float]] = defaultdict(list)
    repeats: Counter = Counter()
    for c in commands:
        if c["kind"] == "fact":
            facts[c["name"]].append(c["seconds"])
            repeats[(c["host"], c["name"], c["args"])] += 1
        ops[c["op"] or f"(outside operations) {c['name']}"].append(c["seconds"])

    def table(groups: dict[str, list[float]]) -> list[dict[str, Any]]:
        rows = [{"name": k, "commands": len(v), "seconds": round(sum(v), 3)} for k, v in groups.items()]
        return sorted(rows, key=lambda r: (-r["commands"], -r["seconds"], r["name"]))

    by_stage: Counter = Counter(c["stage"] for c in commands)
    by_host: Counter = Counter(c["host"] for c in commands)
    return {
        "commands": len(commands),
        "command_seconds": round(sum(c["seconds"] for c in commands), 3),
        "by_kind": dict(by_kind),
        "by_stage": dict(by_stage),
        "by_host": dict(by_host),
        "by_fact": table(facts),
        "by_operation": table(ops),
        "repeated_facts": [
            {"host": h, "fact": n, "args": a, "times": t}
            for (h, n, a), t in sorted(repeats.items(), key=lambda kv: -kv[1]) if t > 1
        ],
    }


def overlap(commands: list[dict[str, Any]], stage: str) -> float:
    """Mean number of commands running at once during STAGE (1.0: strictly one at a time)."""
    spans = sorted((c["start_s"], c["start_s"] + c["seconds"]) for c in commands if c["stage"] == stage)
    if not spans:
        return 0.0
    busy, end = 0.0, None
    for s, e in spans:  # union of the intervals
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    total = sum(e - s for s, e in spans)
    return round(total / busy, 2) if busy else 0.0


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and the range relative to the median."""
    med = statistics.median(values)
    return {
        "median": round(med, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "range_pct": round(100 * (max(values) - min(values)) / med, 1) if med else 0.0,
        "n": len(values),
    }


from pve_sglang.testing import lxc_env  # noqa: E402  (the rootfs cache the tests build)

# --------------------------------------------------------------------------------------------
# The LXC test bed
# --------------------------------------------------------------------------------------------


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("check", True)
    return subprocess.run(cmd, **kwargs)


def destroy_containers(lxc_path: Path) -> None:
    """Stop and destroy every container under LXC_PATH."""
    if not lxc_path.is_dir():
        return
    for config in sorted(lxc_path.glob("*/config")):
        name = config.parent.name
        _run(["lxc-stop", "-P", str(lxc_path), "-n", name, "-k"], check=False, capture_output=True)
        _run(["lxc-destroy", "-P", str(lxc_path), "-n", name], check=False, capture_output=True)


def remove_stale_workdirs() -> None:
    """Clean up after bench runs that died (their owner pid is gone)."""
    for work in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}*"):
        try:
            owner = int((work / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not lxc_env._pid_alive(owner):
            log(f"removing stale bench dir {work} (owner {owner} is gone)")
            destroy_containers(work / "lxc")
            shutil.rmtree(work, ignore_errors=True)


def bench_tarball(work: Path) -> Path:
    """The tests' cached rootfs with their test-time additions, repacked for ``lxc.create``."""

    source = lxc_env.ensure_rootfs_tarball()
    base = work / "rootfs-build"
    lxc_env.extract_rootfs(source, base)
    # resolv.conf, hosts, CA certificates; sshd off (the containers share the host's network,
    # port 22 included), apt's timers off.
    lxc_env.prepare_base(base)
    dest = work / "rootfs.tar.zst"
    _run(["tar", "-C", str(base), "--numeric-owner", "--xattrs", "--xattrs-include=*",
          "-I", "zstd -T0 -3", "-cf", str(dest), "."])
    shutil.rmtree(base)
    log(f"rootfs tarball from {source.name}: {dest.stat().st_size / 1e6:.0f} MB")
    return dest


def wheelhouse(work: Path, version: str) -> Path:
    """A directory with sglang's wheel: from .cache/wheels, else downloaded with pip."""
    wh = work / "wh"
    wh.mkdir()
    name = f"sglang-{version}-py3-none-any.whl"
    cached = REPO / ".cache" / "wheels" / name
    if cached.is_file():
        shutil.copy(cached, wh / name)
    else:
        log(f"downloading {name} with pip")
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}",
              "-d", str(wh)])
    return wh


def hosts_file(path: Path, lxc_path: Path, tarball: Path, wh: Path, names: list[str]) -> None:
    certs = sorted(str(p) for p in CA_DIR.glob("*.crt")) if CA_DIR.is_dir() else []
    entry = {
        "platform": "lxc",
        "require_gpu": False,
        "lxc_path": str(lxc_path),
        "lxc_rootfs_tarball": str(tarball),
        "lxc_config": [
            "lxc.net.0.type = none",
            f"lxc.mount.entry = {wh} opt/wheelhouse none bind,ro,create=dir 0 0",
        ],
        "containers": [
            {"name": name, "wheelhouse": "/opt/wheelhouse", "stack_install": "sglang-no-deps",
             **({"ca_certificates": certs} if certs else {})}
            for name in names
        ],
    }
    path.write_text(json.dumps({"local": entry}, indent=2))  # JSON is YAML


def container_snapshot(lxc_path: Path, name: str, unit: str) -> dict[str, str]:
    """What a restart would change: init's PID and start time, the unit's invocation."""
    info = _run(["lxc-info", "-P", str(lxc_path), "-n", name, "-s", "-p"], check=False,
                capture_output=True, text=True).stdout
    values = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in info.splitlines())
    )
    pid = values.get("PID", "")
    start = ""
    if pid:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            start = stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in ticks
        except (OSError, IndexError):
            pass
    show = _run(
        ["lxc-attach", "-P", str(lxc_path), "-n", name, "--clear-env", "--", "systemctl", "show",
         unit, "-p", "InvocationID", "-p", "ExecMainStartTimestamp", "-p", "ActiveState",
         "-p", "NRestarts"],
        check=False, capture_output=True, text=True,
    ).stdout
    values.update(dict(line.split("=", 1) for line in show.splitlines() if "=" in line))
    return {"state": values.get("State", ""), "init_pid": pid, "init_start": start,
            **{k: values.get(k, "") for k in ("InvocationID", "ExecMainStartTimestamp",
                                                 "ActiveState", "NRestarts")}}


class Bench:
    def __init__(self, work: Path, tarball: Path, wh: Path, sizes: list[int], unit: str):
        self.work = work
        self.lxc_path = work / "lxc"
        self.lxc_path.mkdir()
        self.lxc_path.chmod(0o755)
        self.unit = unit
        tag = os.getpid() % 100000
        self.sets = {n: [f"pvsb{tag}-{n}-{i}" for i in range(1, n + 1)] for n in sizes}
        self.hosts = {}
        for n, names in self.sets.items():
            self.hosts[n] = work / f"hosts-{n}.yml"
            hosts_file(self.hosts[n], self.lxc_path, tarball, wh, names)
        self.runs = 0

    def deploy(self, n: int, label: str) -> dict[str, Any]:
        """One pyinfra run against the set of N containers: wall time, JSON, commands."""
        self.runs += 1
        stem = self.work / f"run{self.runs:02d}-{label}-{n}"
        cmd_log = stem.with_suffix(".commands.json")
        env = {**os.environ, "PVE_SGLANG_HOSTS": str(self.hosts[n])}
        argv = [sys.executable, str(Path(__file__).resolve()), "_driver", str(cmd_log), "--",
                "inventory.py", "deploy.py", "-y", "--json"]
        load = os.getloadavg()[0]
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        started_at = time.time()
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
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

    def snapshot(self, n: int) -> dict[str, dict[str, str]]:
        return {name: container_snapshot(self.lxc_path, name, self.unit) for name in self.sets[n]}


def public(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if not k.startswith("_")}


# --------------------------------------------------------------------------------------------
# Report: JSON, table, plot
# --------------------------------------------------------------------------------------------


def build_report(first: dict[int, dict], noop: dict[int, list[dict]], snapshots_ok: dict[int, bool],
                 meta: dict[str, Any]) -> dict[str, Any]:
    sizes = sorted(first)
    one = sizes[0]
    noop_stats = {}
    for n in sizes:
        runs = noop[n]
        noop_stats[str(n)] = {
            "wall_s": spread([r["wall_s"] for r in runs]),
            "cpu_s": spread([r["cpu_s"] for r in runs]),
            "cpu_pyinfra_s": spread([r["cpu_pyinfra_s"] for r in runs]),
            "cpu_commands_s": spread([r["cpu_commands_s"] for r in runs]),
            "commands": spread([r["commands"] for r in runs]),
            "commands_per_container": round(statistics.median(r["commands"] for r in runs) / n, 1),
            "changes": [r["changes"] for r in runs],
            "restart_commands": sum(len(r["restart_commands"]) for r in runs),
            "state_unchanged": snapshots_ok[n],
            # the stages of the run with the median wall time (the lower one of two middles)
            "stage_s_median_run": sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2][
                "stage_s"],
            "prepare_overlap": statistics.median(r["prepare_overlap"] for r in runs),
            "execute_overlap": statistics.median(r["execute_overlap"] for r in runs),
            "runs": [public(r) for r in runs],
        }
    med = {n: noop_stats[str(n)]["wall_s"]["median"] for n in sizes}
    ratios = {
        f"noop_over_first_{n}": round(med[n] / first[n]["wall_s"], 3) for n in sizes
    }
    for n in sizes[1:]:
        ratios[f"noop_{n}_over_{one}"] = round(med[n] / med[one], 3)
        ratios[f"first_{n}_over_{one}"] = round(first[n]["wall_s"] / first[one]["wall_s"], 3)
    one_cmds = noop_stats[str(one)]["commands"]["median"]
    goals = {
        "noop_commands_1": {"goal": f"< {GOAL_NOOP_COMMANDS}", "value": one_cmds,
                            "met": one_cmds < GOAL_NOOP_COMMANDS},
        "noop_over_first_1": {"goal": f"< {GOAL_NOOP_OVER_FIRST}",
                              "value": ratios[f"noop_over_first_{one}"],
                              "met": ratios[f"noop_over_first_{one}"] < GOAL_NOOP_OVER_FIRST},
        "noop_changes": {"goal": "0", "value": max(max(s["changes"]) for s in noop_stats.values()),
                         "met": all(max(s["changes"]) == 0 for s in noop_stats.values())},
        "noop_restarts": {
            "goal": "0",
            "value": sum(s["restart_commands"] for s in noop_stats.values()),
            "met": all(s["restart_commands"] == 0 and s["state_unchanged"]
                       for s in noop_stats.values()),
        },
    }
    if 4 in sizes and 1 in sizes:
        goals["noop_4_over_1"] = {"goal": f"< {GOAL_FOUR_OVER_ONE}", "value": ratios["noop_4_over_1"],
                                  "met": ratios["noop_4_over_1"] < GOAL_FOUR_OVER_ONE}
    profiles = {}
    for n in (sizes[0], sizes[-1]):
        summary = summarise_commands(noop[n][-1]["_commands"])
        summary["by_fact"] = summary["by_fact"][:25]
        summary["by_operation"] = summary["by_operation"][:25]
        summary["repeated_facts"] = summary["repeated_facts"][:25]
        profiles[f"noop_{n}"] = summary
    first_profile = summarise_commands(first[one]["_commands"])
    return {
        "meta": meta,
        "first_run": {str(n): public(first[n]) for n in sizes},
        "noop": noop_stats,
        "ratios": ratios,
        "goals": goals,
        "profile": profiles,
        "first_run_profile_1": {
            "commands": first_profile["commands"],
            "by_kind": first_profile["by_kind"],
            "by_operation": sorted(first_profile["by_operation"], key=lambda r: -r["seconds"])[:12],
        },
    }


def print_table(report: dict[str, Any]) -> None:
    sizes = sorted(int(n) for n in report["first_run"])
    head = (f"{'containers':>10} | {'first run':>9} | {'no-op median (min-max)':>24} | "
            f"{'no-op CPU':>9} | {'commands':>8} | {'per ct':>6} | {'changes':>7} | "
            f"{'restarts':>8} | {'no-op/first':>11}")
    print()
    print(head)
    print("-" * len(head))
    for n in sizes:
        f = report["first_run"][str(n)]
        s = report["noop"][str(n)]
        w = s["wall_s"]
        timing = f"{w['median']:.2f}s ({w['min']:.2f}-{w['max']:.2f})"
        print(f"{n:>10} | {f['wall_s']:>8.1f}s | {timing:>24} | {s['cpu_s']['median']:>8.2f}s | "
              f"{s['commands']['median']:>8.0f} | {s['commands_per_container']:>6.1f} | "
              f"{max(s['changes']):>7} | {s['restart_commands']:>8} | "
              f"{report['ratios'][f'noop_over_first_{n}']:>11.3f}")
    print(f"  ({report['meta']['reps']} no-op runs per size, interleaved; CPU: pyinfra and every "
          "process it waited for)")
    print()
    for key, value in report["ratios"].items():
        print(f"  {key}: {value}")
    print()
    for key, goal in report["goals"].items():
        print(f"  goal {key} {goal['goal']}: {goal['value']} -> {'met' if goal['met'] else 'MISSED'}")
    prof = report["profile"][f"noop_{sizes[0]}"]
    print(f"\n  no-op run, {sizes[0]} container: {prof['commands']} commands {prof['by_kind']}, "
          f"by host {prof['by_host']}")
    for row in prof["by_fact"][:10]:
        print(f"    fact {row['name']}: {row['commands']} commands, {row['seconds']:.2f}s")
    print()


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(n) for n in report["first_run"])
    one = sizes[0]
    noop = [report["noop"][str(n)] for n in sizes]
    med = [s["wall_s"]["median"] for s in noop]
    low = [s["wall_s"]["median"] - s["wall_s"]["min"] for s in noop]
    high = [s["wall_s"]["max"] - s["wall_s"]["median"] for s in noop]
    first = [report["first_run"][str(n)]["wall_s"] for n in sizes]

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.8))
    ax1.bar([str(n) for n in sizes], first, color="#c9a26b")
    for i, v in enumerate(first):
        ax1.text(i, v, f"{v:.1f}s", ha="center", va="bottom")
    ax1.set_title("First run (sets the containers up)")
    ax1.set_xlabel("containers")
    ax1.set_ylabel("wall time [s]")

    x = [str(n) for n in sizes]
    groups = {
        "start: python, imports, inventory, connect": ("Startup", "Setup", "Connect"),
        "prepare (deploy code, facts)": ("Prepare",),
        "execute (operations, facts)": ("Execute",),
        "disconnect, exit": ("Disconnect", "Exit"),
    }
    shades = ["#bee3f8", "#63b3ed", "#2b6cb0", "#a0aec0"]
    bottom = [0.0] * len(sizes)
    for (label, names), color in zip(groups.items(), shades):
        values = [sum((s.get("stage_s_median_run") or s.get("stage_s_median", {})).get(k, 0)
                      for k in names) for s in noop]
        ax2.bar(x, values, bottom=bottom, color=color, label=label, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax2.errorbar(x, med, yerr=[low, high], fmt="o", capsize=5, color="black",
                 label=f"wall time: median, min-max of {noop[0]['wall_s']['n']}")
    ax2.plot(x, [s["cpu_s"]["median"] for s in noop], "x--", color="#9b2c2c", lw=1,
             label="CPU time (pyinfra + its processes), median")
    # Each goal line over the bar it is for.
    if 4 in sizes:
        i4 = sizes.index(4)
        ax2.hlines(GOAL_FOUR_OVER_ONE * med[0], i4 - 0.4, i4 + 0.4, color="#c53030", ls="--",
                   lw=1.5, label=f"goal: 4 containers < {GOAL_FOUR_OVER_ONE} x {one}")
    ax2.hlines(GOAL_NOOP_OVER_FIRST * first[0], -0.4, 0.4, color="#dd6b20", ls=":", lw=2,
               label=f"goal: {one} container < {GOAL_NOOP_OVER_FIRST} x its first run")
    for i, v in enumerate(med):
        ax2.annotate(f"{v:.2f}s", (i, v + high[i]), textcoords="offset points", xytext=(0, 4),
                     ha="center")
    top = max(max(m + h for m, h in zip(med, high)), GOAL_FOUR_OVER_ONE * med[0],
              max(s["cpu_s"]["median"] for s in noop),
              GOAL_NOOP_OVER_FIRST * first[0])
    ax2.set_ylim(0, top * 1.75)
    ax2.set_title("No-op re-run: wall time (stages: median run)")
    ax2.set_xlabel("containers")
    ax2.set_ylabel("wall time [s]")
    ax2.legend(fontsize=7.5, loc="upper left")

    kinds = ["fact", "op", "connector", "transfer", "other"]
    colors = {"fact": "#2f855a", "op": "#805ad5", "connector": "#718096", "transfer": "#d69e2e",
              "other": "#e53e3e"}
    bottom = [0.0] * len(sizes)
    for kind in kinds:
        values = [statistics.median(r["commands_by_kind"].get(kind, 0) for r in s["runs"]) for s in noop]
        if any(values):
            ax3.bar(x, values, bottom=bottom, color=colors[kind], label=kind)
            bottom = [b + v for b, v in zip(bottom, values)]
    for i, v in enumerate(bottom):  # above the goal line where that is near
        ax3.text(i, max(v, GOAL_NOOP_COMMANDS if i == 0 else 0) * 1.02, f"{v:.0f}", ha="center",
                 va="bottom")
    ax3.hlines(GOAL_NOOP_COMMANDS, -0.4, 0.4, color="#c53030", ls="--", lw=1.5,
               label=f"goal for {one}: < {GOAL_NOOP_COMMANDS}")
    for i, n in enumerate(sizes):
        ax3.text(i, bottom[i] / 2, f"{bottom[i] / n:.0f}\nper\ncontainer", ha="center",
                 va="center", color="white", fontsize=8)
    ax3.set_ylim(0, max(max(bottom), GOAL_NOOP_COMMANDS) * 1.3)
    ax3.set_title("No-op re-run: commands sent (median run)")
    ax3.set_xlabel("containers")
    ax3.set_ylabel("commands (processes)")
    ax3.legend(fontsize=8, loc="upper left")

    fig.suptitle(f"pve-sglang deploy cost on real LXC containers (commit "
                 f"{report['meta'].get('git_commit') or '?'}; {report['meta']['machine']})",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def git_commit() -> str:
    result = _run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False,
                  capture_output=True, text=True)
    return result.stdout.strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="no-op runs per size (default 5)")
    parser.add_argument("--sizes", default="1,2,4", help="container counts (default 1,2,4)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--keep", action="store_true", help="keep the containers and the work dir")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="only redraw the plot and the table from a results file")
    args = parser.parse_args(argv)
    if args.replot:
        report = json.loads(args.replot.read_text())
        plot(report, args.replot.with_suffix(".png"))
        print_table(report)
        return 0
    sizes = sorted({int(s) for s in args.sizes.split(",")})

    missing = [t for t in ("lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "lxc-destroy",
                           "zstd", "tar") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        log(f"needs root and {', '.join(missing) or 'lxc'} (make system-deps)")
        return 2

    from pve_sglang.settings import load_defaults

    defaults = load_defaults()
    remove_stale_workdirs()
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX))
    (work / OWNER_FILE).write_text(f"{os.getpid()}\n")
    # SIGTERM/SIGHUP end the run through the cleanup below too.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))
    bench_start = time.monotonic()
    try:
        tarball = bench_tarball(work)
        wh = wheelhouse(work, defaults["sglang_version"])
        bench = Bench(work, tarball, wh, sizes, f"{defaults['service_name']}.service")

        first: dict[int, dict] = {}
        for n in sizes:
            log(f"first run, {n} container(s) ...")
            first[n] = bench.deploy(n, "first")
            log(f"  {first[n]['wall_s']:.1f}s, {first[n]['changes']} changes, "
                f"{first[n]['commands']} commands")

        noop: dict[int, list[dict]] = {n: [] for n in sizes}
        snapshots_ok = {n: True for n in sizes}
        before = {n: bench.snapshot(n) for n in sizes}
        for rep in range(args.reps):
            for n in sizes:
                run = bench.deploy(n, "noop")
                after = bench.snapshot(n)
                run["state_unchanged"] = after == before[n]
                if not run["state_unchanged"]:
                    snapshots_ok[n] = False
                    log(f"  state changed in a no-op run of {n}: {before[n]} -> {after}")
                before[n] = after
                noop[n].append(run)
                log(f"no-op {rep + 1}/{args.reps}, {n} container(s): {run['wall_s']:.2f}s, "
                    f"{run['commands']} commands, {run['changes']} changes")

        meta = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "git_commit": git_commit(),
            "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Linux {platform.release()}",
            "python": platform.python_version(),
            "pyinfra": __import__("pyinfra").__version__,
            "sglang_wheel": defaults["sglang_version"],
            "reps": args.reps,
            "counting": "run_local_process wrapped in a driver that runs pyinfra's CLI: one "
                        "count per process started on this machine (every lxc-attach and every "
                        "@local command), attributed to its fact, operation or connector step",
            "first_run_scope": "container create+start, CA store, apt base packages, uv, venv, "
                               "sglang wheel (no deps), autotune patch, unit; no GPU steps",
            "container_snapshot": "init PID + start time, unit InvocationID, "
                                  "ExecMainStartTimestamp, NRestarts; compared around each no-op run",
            "bench_seconds": round(time.monotonic() - bench_start, 1),
        }
        report = build_report(first, noop, snapshots_ok, meta)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "deploy_cost.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(report, args.out / "deploy_cost.png")
        print_table(report)
        log(f"wrote {args.out / 'deploy_cost.json'} and deploy_cost.png "
            f"({meta['bench_seconds']:.0f}s in all)")
        return 0
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            destroy_containers(work / "lxc")
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_driver":
        rest = sys.argv[3:]
        driver(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest)
    sys.exit(main(sys.argv[1:]))
