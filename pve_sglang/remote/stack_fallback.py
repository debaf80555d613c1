"""The server unit's own fallback, run by systemd without a deploy run; it decides by the rollback
rule the deploy decides by (``rollback_rules.py``, uploaded beside it).

``python3 stack_fallback.py --unit UNIT --venv-path VENV --state STATE [--on-exit]
[--keep-failed] [--no-restart-status N]``, run

+ with ``--on-exit`` as the server unit's ``ExecStopPost=``, each time its process ended: a
  stack judged good and on probation that crashed (``rollback_rules.at_exit``) is switched back
  to the previous stack at this first crash, and the previous release started at once;
+ without it, by the oneshot ``<service>-stack-fallback.service`` that the server's unit names
  in ``OnFailure=``, once its start limit stopped it (``rollback_rules.at_start_limit``): a stack
  on trial is switched back; any other is started again after a pause that grows at each start
  limit, never giving up, and the loop is recorded for the next run to report.

A switch back takes the steps of the deploy's rollback (``operations.stack_switch.
rollback_commands``), in its order, so that a kill at any point is finished by the next deploy
run (``switch_rules.unfinished_rollback``): the record with the failed set, the trial and its
target kept; the link back to the previous stack in one rename; the start limit reset and the
server started; the trial cleared last. Standard library only: uploaded as it is.
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

try:  # uploaded beside this script (remote.COMPANIONS)
    import rollback_rules as rules
except ImportError:  # imported as part of pve_sglang (the deploy's side, the tests)
    from pve_sglang.remote import rollback_rules as rules

#: What the unit reports of its last failure, and its restart settings.
SHOWN = ("Result", "NRestarts", "ExecMainStatus", "ActiveState", "SubState", "RestartUSec")
#: A pause before a restart of the crash loop is cut in slices this long: the server unit is
#: looked at between them (started meanwhile by someone: nothing more to do).
PAUSE_SLICE_S = 1.0
#: The unit's states while its process stops (``ExecStopPost=`` runs in ``stop-post``): a
#: restart asked then is lost to the automatic restart's ``RestartSec`` (systemd 252), so the
#: switch back's start waits for the unit to leave them (``--start-once-stopped``).
STOPPING = ("stop", "stop-sigterm", "stop-sigkill", "stop-post", "final-sigterm",
            "final-sigkill", "final-watchdog")
#: How long that start waits for the stop to end at most (the unit's TimeoutStopSec is 120 s).
STOPPED_WITHIN_S = 180.0

Step = tuple[str, Callable[[], object]]


def linked(venv: str) -> str | None:
    """The stack the VENV link names (its relative or absolute target), or None."""
    try:
        target = os.readlink(venv.rstrip("/"))
    except OSError:
        return None
    return rules.linked_id(venv, target)


def complete_stacks(venv: str) -> set[str]:
    """The complete stacks beside VENV: folders named by a lock id, each with its release file."""
    folder = rules.stacks_dir(venv)
    names = os.listdir(folder) if os.path.isdir(folder) else ()
    return {name for name in names if rules.STACK_NAME.match(name)
            and os.path.isfile(f"{folder}/{name}/{rules.RELEASE_FILE}")}


def read_record(state: str) -> dict | None:
    try:
        with open(state) as record:
            value = json.load(record)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def switched_back(record: dict, trial: str, previous: str, release: str | None, when: str,
                  words: str) -> tuple[dict, dict]:
    """RECORD once the failed TRIAL is recorded (its first record kept: a reason the deploy
    wrote, e.g. a rollback cut short, is the truer one), with the note of the switch back to
    PREVIOUS for the next run to report; and the same with the trial cleared (the last step)."""
    failed = dict(record.get("failed") or {})
    failed.setdefault(trial, {"sglang": release, "when": when, "why": words})
    recorded = {**record, "failed": failed,
                "fell_back": {"from": trial, "to": previous, "when": when, "why": words}}
    cleared = {key: value for key, value in recorded.items() if key != "trial_until"}
    cleared.update(trial=None, previous=None)
    return recorded, cleared


def seconds(span: str) -> float | None:
    """A systemd time span (``RestartUSec``: ``10s``, ``1min 30s``, ``100ms``) in seconds."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(us|ms|min|s|h)", span or "")
    return sum(float(number) * units[unit] for number, unit in parts) if parts else None


def _show(unit: str) -> dict[str, str]:
    done = subprocess.run(["systemctl", "show", *(f"-p{name}" for name in SHOWN), unit],
                          capture_output=True, text=True, check=False)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def _asked_to_stop(unit: str) -> bool:
    """Whether a job (a stop or restart someone asked for) runs on UNIT: its process ended
    because it was told to, whatever its exit status."""
    done = subprocess.run(["systemctl", "list-jobs", "--no-legend", unit],
                          capture_output=True, text=True, check=False)
    return bool(done.stdout.strip())


def _write(state: str, record: dict) -> None:
    temporary = f"{state}.tmp"
    with open(temporary, "w") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(temporary, state)


def _release(venv: str, stack: str) -> str | None:
    try:
        with open(f"{rules.stacks_dir(venv)}/{stack}/{rules.RELEASE_FILE}") as release:
            return json.load(release).get("sglang")
    except (OSError, ValueError):
        return None


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True)
    parser.add_argument("--venv-path", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--on-exit", action="store_true",
                        help="run as the unit's ExecStopPost=: its process just ended")
    parser.add_argument("--keep-failed", action="store_true",
                        help="upgrade_rollback is false: a failed stack on trial stays")
    parser.add_argument("--no-restart-status", type=int, action="append", default=[],
                        help="an exit status the unit is not restarted on "
                             "(RestartPreventExitStatus)")
    parser.add_argument("--start-once-stopped", action="store_true",
                        help="start the unit once its process stopped (the switch back's start "
                             "from ExecStopPost=, run apart by systemd-run)")
    return parser.parse_args(argv)


def steps(args: argparse.Namespace, now: float | None = None) -> list[Step]:
    """What the fallback does, one (name, step) each, in an order a kill after any one of them
    leaves for the next deploy run or the next fallback to finish. Empty: nothing to do (said
    why)."""
    record = read_record(args.state)
    if record is None:
        print(f"{args.unit}: no stack record ({args.state}): nothing to switch back")
        record = {}
    venv = args.venv_path.rstrip("/")
    current, stacks = linked(venv), complete_stacks(venv)
    now = time.time() if now is None else now
    rollback = not args.keep_failed
    if args.on_exit:
        result = os.environ.get("SERVICE_RESULT", "success")
        status = os.environ.get("EXIT_STATUS", "")
        prevented = status.isdigit() and int(status) in args.no_restart_status
        act = rules.at_exit(record, current, stacks, now, rollback, result, prevented)
        if act is rules.Act.LEAVE and result == "success":
            return []  # a clean exit or stop: nothing to say, each time
        if act is rules.Act.SWITCH_BACK and _asked_to_stop(args.unit):
            print(f"{args.unit} was stopped on request ({result}): its stack stays")
            return []
        words = (f"{args.unit} crashed on probation (Result={result}, "
                 f"{os.environ.get('EXIT_CODE', '?')} {os.environ.get('EXIT_STATUS', '?')}), its "
                 f"first crash since its verdict (on trial until "
                 f"{_utc(float(record.get('trial_until') or 0))}); the unit's ExecStopPost= "
                 "switched back to the previous stack at once")
    else:
        shown = _show(args.unit)
        status = shown.get("ExecMainStatus", "")
        prevented = status.isdigit() and int(status) in args.no_restart_status
        act = rules.at_start_limit(record, current, stacks, now, rollback, prevented)
        trial = " while on trial" if act is rules.Act.SWITCH_BACK else ""
        words = (f"{args.unit} failed for good{trial} (Result={shown.get('Result', '?')}, exit "
                 f"status {status or '?'}, after {shown.get('NRestarts', '?')} automatic "
                 "restarts: its start limit)")
        if act is rules.Act.RESTART and shown.get("ActiveState") != "failed":
            print(f"{args.unit} is {shown.get('ActiveState')}: no crash loop to restart")
            return []
        if act is rules.Act.RESTART:
            return _restart_steps(args, record, now, words, seconds(shown.get("RestartUSec", "")))
        words += "; systemd switched back to the previous stack (OnFailure=)" if trial else ""
    if act is not rules.Act.SWITCH_BACK:
        print(f"{args.unit}: nothing to switch back (link: {current}, record: trial "
              f"{record.get('trial')}, until {record.get('trial_until')}, previous "
              f"{record.get('previous')}; upgrade_rollback {rollback})")
        return []
    return _switch_back_steps(args, record, venv, now, words)


def _switch_back_steps(args: argparse.Namespace, record: dict, venv: str, now: float,
                       words: str) -> list[Step]:
    trial, previous = record["trial"], record["previous"]
    recorded, cleared = switched_back(record, trial, previous, _release(venv, trial), _utc(now),
                                      words)
    print(f"{words}: stack {trial} -> stack {previous}")

    def link_back() -> None:
        temporary = f"{venv}.switching"
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(rules.link_target(venv, previous), temporary)
        os.rename(temporary, venv)

    if args.on_exit:
        # The unit is still stopping (this is its ExecStopPost=): a start apart from it, once
        # it stopped, in place of the automatic restart's RestartSec.
        start = ["systemd-run", "--no-block", "--collect", "--quiet", sys.executable,
                 os.path.abspath(__file__), "--unit", args.unit, "--venv-path", args.venv_path,
                 "--state", args.state, "--start-once-stopped"]
    else:
        # --no-block: this runs as the server's OnFailure=; the start is the server's own job.
        start = ["systemctl", "restart", "--no-block", args.unit]
    return [
        ("record the failed set", lambda: _write(args.state, recorded)),
        ("link back", link_back),
        ("reset the start limit",
         lambda: subprocess.run(["systemctl", "reset-failed", args.unit], check=False)),
        ("queue the start", lambda: subprocess.run(start, check=True)),
        ("clear the trial", lambda: _write(args.state, cleared)),
    ]


def start_once_stopped(unit: str, within_s: float = STOPPED_WITHIN_S) -> str:
    """Start UNIT once its process stopped (its state out of ``STOPPING``): when it waits for
    its automatic restart, failed, or is inactive; one started meanwhile is left. What it did,
    in words."""
    end = time.monotonic() + within_s
    shown = _show(unit)
    while shown.get("SubState") in STOPPING and time.monotonic() < end:
        time.sleep(0.1)
        shown = _show(unit)
    if shown.get("SubState") != "auto-restart" and \
            shown.get("ActiveState") not in ("failed", "inactive"):
        return f"{unit} is {shown.get('ActiveState')}/{shown.get('SubState')}: not started"
    subprocess.run(["systemctl", "reset-failed", unit], check=False)
    subprocess.run(["systemctl", "restart", "--no-block", unit], check=True)
    return f"{unit} started (it was {shown.get('ActiveState')}/{shown.get('SubState')})"


def _restart_steps(args: argparse.Namespace, record: dict, now: float, words: str,
                   restart_s: float | None) -> list[Step]:
    """A crash loop outside a trial: recorded (the next run reports it), then the server
    started again once its pause ran, unless it was started (or stopped) meanwhile."""
    loop = rules.loop_after(record.get("crash_loop"), now, restart_s or 10.0)
    loop["why"] = words
    print(f"{words}; not on trial: started again in {loop['pause_s']:.0f}s (restart "
          f"{loop['restarts']} of a crash loop since {_utc(loop['since'])}; the pause doubles "
          f"at each start limit, up to {rules.MAX_PAUSE_S:.0f}s)")

    def pause() -> None:
        end = time.monotonic() + loop["pause_s"]
        while time.monotonic() < end and _show(args.unit).get("ActiveState") == "failed":
            time.sleep(min(PAUSE_SLICE_S, max(0.0, end - time.monotonic())))

    def start() -> None:
        state = _show(args.unit).get("ActiveState")
        if state != "failed":
            print(f"{args.unit} is {state}: not started again")
            return
        subprocess.run(["systemctl", "reset-failed", args.unit], check=False)
        subprocess.run(["systemctl", "start", "--no-block", args.unit], check=True)

    return [
        ("record the crash loop", lambda: _write(args.state, {**record, "crash_loop": loop})),
        ("pause", pause),
        ("start again", start),
    ]


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.start_once_stopped:
        print(start_once_stopped(args.unit))
        return 0
    for _name, step in steps(args):
        step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
