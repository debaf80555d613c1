"""``make status``'s rows: what one read of a container (``facts.status.ContainerStatus``) and
the local records (the benchmark history, the tuned file) say, as words, and the table of them
(pure functions: ``tests/unit/test_status.py``).

What a container answers is untrusted: every value shown goes through ``clean`` (control
characters, terminal escapes among them, dropped; bounded length).
"""

from __future__ import annotations

import json
import time
import unicodedata
from typing import Any

from pve_sglang.server.unit_action import RUNNING_STATES, changed_after, looping
from pve_sglang.stack import switch_rules

#: The columns, in order: key -> heading.
COLUMNS = {
    "host": "HOST", "container": "CONTAINER", "state": "STATE", "release": "RELEASE",
    "stack": "STACK", "model": "MODEL", "commit": "COMMIT", "unit": "UNIT", "since": "SINCE",
    "health": "HEALTH", "running": "RUN", "queued": "QUEUE", "token_usage": "TOKENS",
    "bench_tok_s": "BENCH TOK/S", "bench_date": "BENCH DATE", "probation": "PROBATION",
    "rollback": "ROLLBACK", "restart_pending": "RESTART PENDING", "tuned": "TUNED",
}
#: The longest value shown in the table (the JSON keeps up to ``JSON_CHARS``).
CELL_CHARS = 40
JSON_CHARS = 300


def clean(value: Any, limit: int = CELL_CHARS) -> str:
    """VALUE as text fit for a terminal: control and format characters (ESC, CR, BEL, the C1
    set, bidi overrides) dropped, whitespace runs one space, at most LIMIT characters."""
    text = "" if value is None else str(value)
    kept = "".join(" " if ch.isspace() else ch for ch in text
                   if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn"))
    text = " ".join(kept.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def utc(epoch_s: float | None) -> str:
    """``2026-12-07 05:10 UTC``, or empty for an unknown time."""
    if epoch_s is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch_s))


def probation_words(record: dict, current: str | None, now: float) -> str:
    """The upgrade on trial as the stack record says: empty when none (no trial, or the link
    names another stack), ``until <time>`` while its probation runs, ``not judged yet`` before
    the verify phase's first good verdict, ``ended <time>: the next run closes it`` after."""
    trial, until = record.get("trial"), record.get("trial_until")
    if not trial or trial != current:
        return ""
    if until is None:
        return f"stack {trial}: not judged yet"
    try:
        until = float(until)
    except (TypeError, ValueError):
        return f"stack {trial}: unreadable end {until!r}"
    if now < until:
        return f"until {utc(until)}"
    return f"ended {utc(until)}: the next run closes it"


def rollback_words(record: dict) -> str:
    """The last rollback the stack record holds: the fallback systemd made (``fell_back``), else
    the newest failed set, ``<when>: <why>``; empty when none."""
    seen = []
    fell = record.get("fell_back")
    if isinstance(fell, dict) and fell.get("when"):
        seen.append((str(fell["when"]), f"{fell.get('from')} -> {fell.get('to')}: {fell.get('why')}"))
    for stack, failed in (record.get("failed") or {}).items():
        if isinstance(failed, dict) and failed.get("when"):
            seen.append((str(failed["when"]), f"stack {stack}: {failed.get('why')}"))
    if not seen:
        return ""
    when, why = max(seen)
    return f"{when}: {why}"


def health_words(health: dict | None) -> str:
    """``ok`` for a 200, ``HTTP <code>``, or the error; empty when not asked."""
    if not health:
        return ""
    if "status" in health:
        return "ok" if health["status"] == 200 else f"HTTP {health['status']}"
    return f"down: {health.get('error')}"


def bench_last(runs: list[dict]) -> tuple[float | None, str]:
    """The newest benchmark run's best output tok/s over its levels and its time (``bench_history``
    runs, oldest first)."""
    if not runs:
        return None, ""
    last = runs[-1]
    rates = [row.get("output_token_throughput") for row in last.get("rows") or ()]
    rates = [float(r) for r in rates if isinstance(r, (int, float))]
    return (max(rates) if rates else None), str(last.get("time") or "")


def _number(value: Any, digits: int = 0) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return ""
    return f"{value:.{digits}f}"


def container_row(host: str, container: str, venv_path: str, read: dict, runs: list[dict],
                  tuned_mtime: float | None, now: float) -> dict[str, str]:
    """The row of a running container from its status READ, its benchmark RUNS and its tuned
    file's mtime (None: no tuned file)."""
    row = _running_row(host, container, "running", read)
    if "error" in read:
        return row
    raw = read.get("stacks") or {}
    found = switch_rules.found_of(venv_path, {"kind": raw.get("kind", "missing"), **raw})
    record = state if isinstance(state := raw.get("state"), dict) else {}
    stack = found.named
    row["stack"] = stack or found.kind
    release = ((raw.get("stacks") or {}).get(stack) or {}).get("sglang") if stack else None
    row["release"] = f"sglang {release}" if release else ""
    marker = read.get("marker")
    if isinstance(marker, dict):
        row["model"], row["commit"] = str(marker.get("repo") or ""), str(marker.get("commit") or "")[:12]
    unit = read.get("unit") or {}
    started = unit.get("started")
    figures = read.get("metrics") or {}
    if "error" in figures:
        row["running"] = f"metrics: {figures['error']}"
    else:
        row.update(running=_number(figures.get("running_reqs")),
                   queued=_number(figures.get("queue_reqs")),
                   token_usage=_number(figures.get("token_usage"), 2))
    tok_s, when = bench_last(runs)
    row.update(bench_tok_s=_number(tok_s, 1), bench_date=when)
    row["probation"] = probation_words(record, found.current, now)
    row["rollback"] = rollback_words(record)
    # As the deploy decides it (``systemd_unit.service_running``): only a serving unit waits.
    active = unit.get("active")
    serving = active in RUNNING_STATES and not looping(active, unit.get("sub"))
    mtimes = read.get("mtimes") or {}
    row["restart_pending"] = ", ".join(changed_after(started, mtimes)) if serving else ""
    row["tuned"] = utc(tuned_mtime)
    return row


def gateway_row(host: str, container: str, read: dict) -> dict[str, str]:
    """The row of a running gateway container: its unit and /health."""
    return _running_row(host, container, "running (gateway)", read)


def _running_row(host: str, container: str, state: str, read: dict) -> dict[str, str]:
    """A running container's row with what every kind shows: its unit, since when, /health;
    the STATE cell says where its status READ failed."""
    row = down_row(host, container, state)
    if "error" in read:
        row["state"] = f"running; status read failed: {read['error']}"
        return row
    unit = read.get("unit") or {}
    row["unit"] = "/".join(str(p) for p in (unit.get("active"), unit.get("sub")) if p)
    started = unit.get("started")
    row["since"] = utc(started / 1e6) if isinstance(started, int) else ""
    row["health"] = health_words(read.get("health"))
    return row


def down_row(host: str, container: str, state: str) -> dict[str, str]:
    """The row of a container that is not running, or of a host not reached: STATE says why."""
    row = {key: "" for key in COLUMNS}
    row.update(host=host, container=container, state=state)
    return row


def table(rows: list[dict[str, str]]) -> str:
    """ROWS as an aligned text table under ``COLUMNS``' headings; each cell ``clean``."""
    cells = [[clean(row.get(key)) for key in COLUMNS] for row in rows]
    heads = list(COLUMNS.values())
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def as_json(rows: list[dict[str, str]]) -> str:
    """ROWS as a JSON list of objects (``COLUMNS``' keys), each value ``clean`` (longer bound)."""
    return json.dumps([{key: clean(row.get(key), JSON_CHARS) for key in COLUMNS} for row in rows],
                      indent=1, ensure_ascii=False)
