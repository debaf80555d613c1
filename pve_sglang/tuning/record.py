"""The record of a search: every try as it ended, one JSON line each, in
``<tune_dir>/<host>-<container>.tries.jsonl`` beside the tuned file.

A line is written (and flushed to the disk) as soon as its try ended, so a search that is
killed keeps every try it finished; run again, it replays them (``strategy.Replayed``) and goes
on where it stopped. The first line holds the flags the server was found with (``found``), so
that whatever happens the server can be put back on them; an ``end`` line, each time a run
ends, its best, why it stopped, and whether the search is ``finished`` (it stopped by itself:
no move left, or the budget spent). A record whose last end is not finished (stopped with
Ctrl-C, an error) or that has none (killed) is a search that goes on: the next run replays it
and appends to it.

Lines:

- ``{"event": "found", "time": ..., "candidate": {...}}``
- ``{"event": "try", "time": ..., "candidate": {...}, "length": 0.25, "why": "...",
  "ended": "measured", "objective": 1234.5, "row": {...}, "cost_s": 512.0, "start_s": 420.0}``
- ``{"event": "end", "time": ..., "best": {...}, "score": ..., "weight": 1.5, "stopped": "...",
  "finished": true, "serving": {...}}``: ``weight``, how much of the whole benchmark the best
  was measured for; ``serving``, the flags the server was left on (null: none started).

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

ENDINGS = ("measured", "start", "oom", "stall", "degenerate", "bench", "constraint")


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
                   "cost_s": outcome.cost_s, "start_s": outcome.start_s})


def end(path: Path, best: dict[str, Any] | None, score: float | None, stopped: str,
        finished: bool = True, weight: float = 0.0,
        serving: dict[str, Any] | None = None) -> None:
    _append(path, {"event": "end", "best": best, "score": score, "weight": weight,
                   "stopped": stopped, "finished": finished, "serving": serving})


@dataclass
class Record:
    found: dict[str, Any] | None = None
    tries: list[Try] = field(default_factory=list)
    #: The last end line, if any.
    ended: dict[str, Any] | None = None
    #: Why the reading stopped before the file's end (a torn or foreign line), or "".
    cut: str = ""

    @property
    def finished(self) -> bool:
        """Whether the search ended by itself (its last end line says so): a new run starts a
        new search; otherwise it goes on from this record."""
        return self.ended is not None and self.ended.get("finished") is True


def _candidate(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("a candidate is not a mapping")
    return {str(name): check_value(str(name), v) for name, v in value.items()}


def _try(entry: dict[str, Any]) -> Try:
    length, ended = entry.get("length"), entry.get("ended")
    objective, cost = entry.get("objective"), entry.get("cost_s")
    start = entry.get("start_s", 0.0)
    if not isinstance(length, (int, float)) or not 0 < length <= 1:
        raise ValueError(f"length {length!r}")
    if ended not in ENDINGS:
        raise ValueError(f"ended {ended!r}")
    if objective is not None and not isinstance(objective, (int, float)):
        raise ValueError(f"objective {objective!r}")
    if not isinstance(cost, (int, float)) or cost < 0:
        raise ValueError(f"cost_s {cost!r}")
    if not isinstance(start, (int, float)) or not 0 <= start <= cost:
        raise ValueError(f"start_s {start!r}")
    row = given if isinstance(given := entry.get("row"), dict) else {}
    return Try(Proposal(_candidate(entry.get("candidate")), float(length), str(entry.get("why"))),
               Outcome(ended, objective, row, float(cost), float(start)))


def read_search(path: Path) -> Record:
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
            elif event == "try" and record.found is not None and not record.finished:
                record.tries.append(_try(entry))
            elif event == "end" and record.found is not None and not record.finished:
                record.ended = entry
            else:
                raise ValueError(f"a {event!r} line here")
        except (ValueError, SpaceError, AttributeError) as error:
            record.cut = f"{path}: line {number} not read ({error}); the record ends before it"
            break
    return record
