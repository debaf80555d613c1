"""What a run did, from pyinfra's ``--json`` output and the driver's command log (pure)."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from typing import Any

#: Commands that restart, stop or start a service or a container.
RESTART_RE = re.compile(
    r"\bsystemctl\s+(?:--\S+\s+)*(?:restart|try-restart|reload-or-restart|stop|start|kill)\b"
    r"|\blxc-(?:stop|start)\b|\bpct\s+(?:reboot|start|stop|shutdown)\b|\breboot\b"
)



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
