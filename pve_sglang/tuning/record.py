"""The record of a search: every try as it ended, one JSON line each, in
``<tune_dir>/<host>-<container>.tries.jsonl`` beside the tuned file.

A line is written (and flushed to the disk) as soon as its try ended, so a search that is
killed keeps every try it finished; run again, it replays them (``strategy.Replayed``) and goes
on where it stopped. The first line holds the flags the server was found with (``found``), so
that whatever happens the server can be put back on them; the last, once the search ended, its
best and why it stopped (``end``): a record without one is a search that did not end.

Lines:

- ``{"event": "found", "time": ..., "candidate": {...}}``
- ``{"event": "try", "time": ..., "candidate": {...}, "length": 0.25, "why": "...",
  "ended": "measured", "objective": 1234.5, "row": {...}, "cost_s": 512.0}``
- ``{"event": "end", "time": ..., "best": {...}, "score": ..., "stopped": "..."}``

Read back as untrusted input: a line that is not one of these (a torn last line of a kill) ends
the reading there; each candidate's settings are checked by their own rules.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pve_sglang.tuning.space import SpaceError, check_value
from pve_sglang.tuning.strategy import Outcome, Proposal, Try

ENDINGS = ("measured", "start", "oom", "stall", "degenerate", "constraint")


def record_path(tuned: Path) -> Path:
    """The record beside the tuned file TUNED."""
    return tuned.with_name(tuned.name.removesuffix(".yml") + ".tries.jsonl")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _append(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps({**entry, "time": _now()}, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def begin(path: Path, found: dict[str, Any]) -> None:
    """A new record, holding the flags the server was found with."""
    path.unlink(missing_ok=True)
    _append(path, {"event": "found", "candidate": found})


def add(path: Path, done: Try) -> None:
    outcome = done.outcome
    _append(path, {"event": "try", "candidate": done.proposal.candidate,
                   "length": done.proposal.length, "why": done.proposal.why,
                   "ended": outcome.ended, "objective": outcome.objective, "row": outcome.row,
                   "cost_s": outcome.cost_s})


def end(path: Path, best: dict[str, Any] | None, score: float | None, stopped: str) -> None:
    _append(path, {"event": "end", "best": best, "score": score, "stopped": stopped})


@dataclass
class Record:
    found: dict[str, Any] | None = None
    tries: list[Try] = field(default_factory=list)
    ended: dict[str, Any] | None = None
    #: Why the reading stopped before the file's end (a torn or foreign line), or "".
    cut: str = ""


def _candidate(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("a candidate is not a mapping")
    return {str(name): check_value(str(name), v) for name, v in value.items()}


def _try(entry: dict[str, Any]) -> Try:
    length, ended = entry.get("length"), entry.get("ended")
    objective, cost = entry.get("objective"), entry.get("cost_s")
    if not isinstance(length, (int, float)) or not 0 < length <= 1:
        raise ValueError(f"length {length!r}")
    if ended not in ENDINGS:
        raise ValueError(f"ended {ended!r}")
    if objective is not None and not isinstance(objective, (int, float)):
        raise ValueError(f"objective {objective!r}")
    if not isinstance(cost, (int, float)) or cost < 0:
        raise ValueError(f"cost_s {cost!r}")
    row = entry.get("row") if isinstance(entry.get("row"), dict) else {}
    return Try(Proposal(_candidate(entry.get("candidate")), float(length), str(entry.get("why"))),
               Outcome(ended, objective, row, float(cost)))


def read(path: Path) -> Record:
    """The record at PATH (an empty one where there is none)."""
    record = Record()
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return record
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            event = entry.get("event") if isinstance(entry, dict) else None
            if event == "found" and number == 1:
                record.found = _candidate(entry.get("candidate"))
            elif event == "try" and record.found is not None and record.ended is None:
                record.tries.append(_try(entry))
            elif event == "end" and record.found is not None and record.ended is None:
                record.ended = entry
            else:
                raise ValueError(f"a {event!r} line here")
        except (ValueError, SpaceError, AttributeError) as error:
            record.cut = f"{path}: line {number} not read ({error}); the record ends before it"
            break
    return record
