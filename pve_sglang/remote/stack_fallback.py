"""The server unit's ``OnFailure=``: a stack on trial whose server failed for good (systemd's
start limit, after its automatic restarts) is switched back to the previous stack by systemd
itself, without a deploy run, and the why is recorded for the next run to report.

``python3 stack_fallback.py --unit UNIT --venv-path VENV --state STATE``, run by the oneshot unit
``<service>-stack-fallback.service`` that the server's unit names in ``OnFailure=``.

The steps are the deploy's rollback's (``operations.stack_switch.rollback_commands``), in its
order, so that a kill at any point is finished by the next deploy run
(``switch_rules.unfinished_rollback``): the record with the failed set, the trial and its target
kept; the link back to the previous stack in one rename; the start limit reset and the server
started; the trial cleared last. Standard library only: uploaded as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable

STACK_NAME = re.compile(r"^[0-9a-f]{16}$")
SUFFIX = ".stacks"
RELEASE_FILE = "pve-sglang-stack.json"


def linked(venv: str) -> str | None:
    """The stack the VENV link names (its relative or absolute target), or None."""
    try:
        target = os.readlink(venv.rstrip("/"))
    except OSError:
        return None
    folder, _, name = target.rstrip("/").rpartition("/")
    base = venv.rstrip("/") + SUFFIX
    return name if folder in (os.path.basename(base), base) and STACK_NAME.match(name) else None


def fall_back(record: dict, current: str | None, stacks: set[str], now: float) -> str | None:
    """Whether to switch back: the stack on trial (RECORD's ``trial``) is the one the link names
    (CURRENT), its probation has not ended (``trial_until``, none: never judged), and the
    previous stack is complete in the folder (STACKS). Returns the stack to go back to, or
    None: nothing to do (no trial, a trial that passed, a failure after it, no target)."""
    trial, previous = record.get("trial"), record.get("previous")
    if not trial or trial != current:
        return None
    until = record.get("trial_until")
    if until is not None and now >= float(until):
        return None
    if not previous or previous == trial or previous not in stacks:
        return None
    return previous


def _show(unit: str) -> dict[str, str]:
    done = subprocess.run(["systemctl", "show", "-p", "Result,NRestarts,ExecMainStatus", unit],
                          capture_output=True, text=True, check=False)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def why(unit: str, shown: dict[str, str]) -> str:
    """The record's words for a failure systemd gave up on (SHOWN: ``systemctl show``)."""
    return (f"{unit} failed for good while on trial (Result={shown.get('Result', '?')}, exit "
            f"status {shown.get('ExecMainStatus', '?')}, after {shown.get('NRestarts', '?')} "
            "automatic restarts: its start limit); systemd switched back to the previous stack "
            "(OnFailure=)")


def _write(state: str, record: dict) -> None:
    temporary = f"{state}.tmp"
    with open(temporary, "w") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(temporary, state)


def _release(venv: str, stack: str) -> str | None:
    try:
        with open(f"{venv.rstrip('/')}{SUFFIX}/{stack}/{RELEASE_FILE}") as release:
            return json.load(release).get("sglang")
    except (OSError, ValueError):
        return None


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True)
    parser.add_argument("--venv-path", required=True)
    parser.add_argument("--state", required=True)
    return parser.parse_args(argv)


def steps(args: argparse.Namespace) -> list[tuple[str, Callable[[], None]]]:
    """The switch back, one (name, step) each, in the order a kill after any one of them
    leaves for the next deploy run (``rollback_finished``) or the next fallback to finish:
    the record with the failed set, the trial and its target kept; the link back in one
    rename; the start limit reset; the server's start queued; the trial cleared. Empty:
    nothing to switch back (said why)."""
    try:
        with open(args.state) as state:
            record = json.load(state)
    except (OSError, ValueError):
        print(f"{args.unit} failed: no stack record ({args.state}): nothing to switch back")
        return []
    venv = args.venv_path.rstrip("/")
    folder = venv + SUFFIX
    stacks = {name for name in (os.listdir(folder) if os.path.isdir(folder) else ())
              if STACK_NAME.match(name) and os.path.isfile(f"{folder}/{name}/{RELEASE_FILE}")}
    current = linked(venv)
    previous = fall_back(record, current, stacks, time.time())
    if previous is None:
        print(f"{args.unit} failed: no stack on trial to switch back from (link: {current}, "
              f"record: trial {record.get('trial')}, until {record.get('trial_until')})")
        return []
    words = why(args.unit, _show(args.unit))
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    trial = record["trial"]
    failed = dict(record.get("failed") or {})
    failed[trial] = {"sglang": _release(venv, trial), "when": when, "why": words}
    recorded = {**record, "failed": failed,
                "fell_back": {"from": trial, "to": previous, "when": when, "why": words}}
    cleared = {key: value for key, value in recorded.items() if key != "trial_until"}
    cleared.update(trial=None, previous=None)
    print(f"{words}: stack {trial} -> stack {previous}")

    def link_back() -> None:
        temporary = f"{venv}.switching"
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(f"{os.path.basename(venv)}{SUFFIX}/{previous}", temporary)
        os.rename(temporary, venv)

    return [
        ("record the failed set", lambda: _write(args.state, recorded)),
        ("link back", link_back),
        ("reset the start limit",
         lambda: subprocess.run(["systemctl", "reset-failed", args.unit], check=False)),
        # --no-block: this unit runs as the server's OnFailure=; the start is the server's job.
        ("queue the start",
         lambda: subprocess.run(["systemctl", "restart", "--no-block", args.unit], check=True)),
        ("clear the trial", lambda: _write(args.state, cleared)),
    ]


def main(argv: list[str] | None = None) -> int:
    for _name, step in steps(arguments(argv)):
        step()
    return 0

if __name__ == "__main__":
    sys.exit(main())
