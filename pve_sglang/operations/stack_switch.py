"""Stacks side by side (``pve_sglang.stack.switch_rules``): the failed-set check, the switch of the
``venv_path`` link, retention, and the verify phase's rollback of a failed upgrade."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.context import state as pyinfra_state

from pve_sglang.facts.one_read import Part
from pve_sglang.operations import container_reads
from pve_sglang.operations.verify import host_fails
from pve_sglang.remote import rollback_rules
from pve_sglang.runtime import cache
from pve_sglang.runtime.cache import Kind
from pve_sglang.server import unit_action
from pve_sglang.stack import switch_rules
from pve_sglang.stack.switch_rules import (
    Found, Move, RollbackVerdict, StacksAt, Unfinished, release_words,
)


def cannot_name(venv_path: str, error: ValueError) -> str:
    return (f"{host.name}: {venv_path}: {error}; move it away (the deploy deletes nothing it "
            "cannot name) and run again")


def read_stacks(stacks: StacksAt) -> dict:
    """The ``Stacks`` read of the container's STACKS, with the container's other reads, once
    per run stage until an operation here changes them."""
    return container_reads.read(Part.STACKS, *stacks.read_args())


def found_stacks(stacks: StacksAt) -> tuple[dict, Found]:
    """The ``Stacks`` read of STACKS (``read_stacks``) and its pure view (``Found``): what an
    operation here decides by, asked once at its start (at plan time and again when it runs)."""
    raw = read_stacks(stacks)
    return raw, switch_rules.found_of(stacks.venv_path, raw)


def record_command(service: str, record: dict) -> StringCommand:
    """Write the state record of SERVICE's stacks whole (a temporary file, then a rename)."""
    path = switch_rules.state_path(service)
    text = json.dumps(record, sort_keys=True)
    return StringCommand("mkdir -p", QuoteString(switch_rules.STATE_DIR), "&& printf '%s\\n'",
                         QuoteString(text), ">", QuoteString(f"{path}.tmp"), "&& mv -f",
                         QuoteString(f"{path}.tmp"), QuoteString(path))


def link_command(venv_path: str, stack_id: str) -> StringCommand:
    """Point ``venv_path`` at STACK_ID in one rename: a new link beside it, moved over it."""
    link = venv_path.rstrip("/")
    temporary = QuoteString(f"{link}.switching")
    return StringCommand("ln -sfn", QuoteString(switch_rules.link_target(venv_path, stack_id)),
                         temporary, "&& mv -T", temporary, QuoteString(link))


@operation()
def not_failed(stacks: StacksAt, wanted: str, release: str, retry: bool):
    """
    Stop before any change when the set of stack WANTED failed as an upgrade before and was
    rolled back (the state record says when and why), unless RETRY: a failed set is not tried
    again silently, run after run.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` link to the serving one,
      the service that names their state record, the lock file that names a venv made before
      stacks)
    + wanted: the stack id of the settings (the lock id)
    + release: the settings' set in words, e.g. ``sglang 0.5.10``
    + retry: ``retry_failed_stack``: try the failed set again

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.not_failed(name="The stack did not fail before",
                                stacks=StacksAt("/opt/sglang/venv", "sglang"),
                                wanted="68a87c7696509d54", release="sglang 0.5.10", retry=False)
    """
    raw, found = found_stacks(stacks)
    record = (raw.get("state") or {}).get("failed") or {}
    failed = switch_rules.refused(record, wanted, retry)
    if failed is not None:
        # Never "rolled back" while the link still names it (a plan before rollback_finished).
        linked = found.current == wanted
        back, kept = (("its rollback was cut short (the run switches back to the previous "
                       "stack first)", "nothing else is changed") if linked else
                      ("was rolled back", "nothing was changed"))
        raise OperationError(
            f"{host.name}: the set {release} (stack {wanted}) failed as an upgrade on "
            f"{failed.get('when')} and {back}: {failed.get('why')}; {kept}. Pin another release, or set retry_failed_stack: true (or --data "
            "retry_failed_stack=true) to try it again")
    if wanted in record:
        logger.warning(f"{host.name}: the set {release} (stack {wanted}) failed before "
                       f"({record[wanted].get('when')}): tried again (retry_failed_stack)")
    host.noop(f"the set {release} has not failed here")
    yield from ()


def forget() -> None:
    """A stack or the link changed: the next ask reads them again."""
    cache.forget(Kind.STACKS)


@operation()
def switch(stacks: StacksAt, unit: str, wanted: str, restart_on_change: bool,
           nodes: list[str] | None = None):
    """
    Point ``venv_path`` at stack WANTED, built beside the serving one, in one rename of a
    symlink; the server restarts once after it (``service_running``, told by this operation's
    change). With RESTART_ON_CHANGE false and the server running, the
    link stays: ``restart pending`` is reported, every run, until restarts are allowed. The
    state record says which stack is on trial and which one a failed start goes back to.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` setting, made a symlink to
      the current stack, the service that names their state record, the lock file that names a
      venv made before stacks)
    + unit: the server's systemd unit (its state says whether a switch restarts it)
    + wanted: the stack id of the settings (the lock id)
    + restart_on_change: false holds the switch back while the server runs
    + nodes: the ``nodes`` setting: a node of several switches only while every node of its
      group is still in the run (they switch in this one operation), else none does

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.switch(name="Switch to stack 68a87c7696509d54",
                            stacks=StacksAt("/opt/sglang/venv", "sglang"), unit="sglang.service",
                            wanted="68a87c7696509d54", restart_on_change=True)
    """
    # What the build before changed (a new stack's files) decides nothing here.
    raw, found = found_stacks(stacks)
    unit_state = container_reads.read(Part.UNIT, unit)
    serving = unit_state.get("active") in unit_action.RUNNING_STATES
    try:
        plan = switch_rules.decide_switch(found, wanted, restart_on_change, serving)
    except ValueError as error:
        raise OperationError(cannot_name(stacks.venv_path, error)) from None
    record = dict(raw.get("state") or {})
    if plan.move is Move.NONE:
        host.noop(f"{stacks.venv_path} is stack {wanted}")
        return
    if plan.move is Move.PENDING:
        if cache.once(Kind.RESTART_PENDING, f"{unit} stack"):
            logger.warning(
                f"{host.name}: {unit} restart pending: {release_words(raw, wanted)} is built "
                f"beside the serving {release_words(raw, plan.previous)}; restart_on_change is "
                "false: the switch and the restart happen on the first run that allows them")
        host.noop(f"switch to stack {wanted} pending (restart_on_change is false)")
        return
    # A node of several: each node's switch is this one operation, on every node at once;
    # one node dropped out of the run before it (a failed build) and none switches.
    missing = switch_rules.not_together(nodes, in_run(), plan.previous, wanted) if nodes else ()
    if missing:
        raise OperationError(_apart(missing, nodes or [], release_words(raw, wanted),
                                    "the serving stack is unchanged, the new one built beside"))
    # The record first: a run killed after it and before the rename switches again.
    record.update(previous=plan.previous, trial=wanted if plan.previous else None)
    record.pop("trial_until", None)  # a new trial: not judged yet
    yield record_command(stacks.service, record)
    yield link_command(stacks.venv_path, wanted)
    forget()


@operation()
def migrate(stacks: StacksAt, copies: dict[str, str]):
    """
    Move a venv of the time before stacks (a plain folder at VENV_PATH) into the stacks folder,
    named by its last complete install, without reinstalling, and link VENV_PATH to it, before
    anything is built: it is the serving stack (or the rollback target of this run's switch).
    Its lock files go in with it (COPIES), and its release file; it keeps its own time and the
    link gets it, so that no restart is due. The server keeps running (its files do not move
    on disk); only the two renames between them leave no path.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` setting, the service that
      names their state record, the lock file the deploy wrote for the plain venv, which names
      it)
    + copies: ``{file of the plain venv's install: its name in the stack}`` (its locks)

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.migrate(name="A venv made before stacks becomes one",
                             stacks=StacksAt("/opt/sglang/venv", "sglang", "/opt/sglang/stack.lock"),
                             copies={"/opt/sglang/stack.lock": "pve-sglang.lock"})
    """
    raw, found = found_stacks(stacks)
    venv_path = stacks.venv_path
    try:
        moved = switch_rules.migration(found)
    except ValueError as error:
        raise OperationError(cannot_name(venv_path, error)) from None
    if moved is None:
        host.noop(f"{venv_path} is not a venv of the time before stacks")
        return
    venv, folder = venv_path.rstrip("/"), switch_rules.stacks_dir(venv_path)
    target = switch_rules.stack_path(venv_path, moved)
    reference = QuoteString(f"{folder}/.{moved}.mtime")
    release = json.dumps({"lock": moved, "sglang": raw.get("plain_sglang")}, sort_keys=True)
    copied = [StringCommand("&& { [ ! -f", QuoteString(source), "] || cp -p",
                            QuoteString(source), QuoteString(f"{venv}/{name}"), "; }")
              for source, name in copies.items()]
    yield StringCommand(
        "mkdir -p", QuoteString(folder), "&& touch -r", QuoteString(venv), reference, *copied,
        "&& printf '%s\\n'", QuoteString(release), ">",
        QuoteString(f"{venv}/{switch_rules.RELEASE_FILE}"), "&& mv -T", QuoteString(venv),
        QuoteString(target), "&& touch -r", reference, QuoteString(target), "&&",
        link_command(venv_path, moved), "&& touch -h -r", reference, QuoteString(venv),
        "&& rm -f", reference)
    if cache.once(Kind.RESTART_REASON, ("stack_migration", moved)):  # plan or run, once
        logger.info(f"{host.name}: {venv_path} (a venv made before stacks) becomes stack "
                    f"{moved} in {folder}, not reinstalled")
    forget()


@operation()
def retention(stacks: StacksAt, wanted: str, keep: int, restart_on_change: bool):
    """
    Remove the stacks beyond the KEEP newest, never the serving one, the rollback target or
    WANTED; a set recorded as failed never counts among the newest. Only folders named by a
    lock id in the deploy's stacks folder, each a stack (its release file). Nothing is removed
    while a stack is on trial or this run switches: the verify phase removes them after the
    verdict (the same operation, once the trial ended). Planned, and shown by ``--dry``, as any
    change.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` setting, the service that
      names their state record, the lock file that names a venv made before stacks)
    + wanted: the stack of the settings (serving after this run's switch)
    + keep: ``stack_retention``
    + restart_on_change: false: the switch waits, the serving stack stays the current one

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.retention(name="Keep the 2 newest stacks",
                               stacks=StacksAt("/opt/sglang/venv", "sglang"),
                               wanted="68a87c7696509d54", keep=2, restart_on_change=True)
    """
    # Read again after a switch of this run (it forgets): a stack built in this run and not
    # read yet is kept (the wanted one always is).
    raw, found = found_stacks(stacks)
    current = found.named
    serving, rollback = switch_rules.after_switch(current, found.previous, wanted, restart_on_change)
    if switch_rules.retention_waits(found.trial, current, serving):
        host.noop(f"stacks beyond {keep} are removed after the verdict on stack {serving}")
        return
    mtimes = {name: info.get("mtime", 0.0) for name, info in (raw.get("stacks") or {}).items()}
    failed = tuple((raw.get("state") or {}).get("failed") or {})
    gone = switch_rules.to_remove(mtimes, keep, serving, rollback, wanted, failed)
    if not gone:
        host.noop(f"{len(mtimes)} stacks, {keep} kept")
        return
    if cache.once(Kind.RESTART_REASON, ("stack_retention", tuple(gone))):  # plan or run, once
        logger.info(f"{host.name}: stack_retention {keep}: removing "
                    + ", ".join(release_words(raw, name) for name in gone))
    for name in gone:
        yield StringCommand("rm -rf", QuoteString(switch_rules.stack_path(stacks.venv_path, name)))
    forget()


def judged(failure: OperationError, stacks: StacksAt, unit: str, rollback: bool,
           watch: Callable[[], None], nodes: list[str] | None = None) -> OperationError | None:
    """At execution, after the verify phase found the server failing (FAILURE): when the stack
    it runs is on trial (an upgrade of this run, or of a run killed before its judgement),
    record the failed set, switch the link back to the previous stack, restart the server and
    follow its start with WATCH; the error to raise names both releases. Otherwise FAILURE.
    A node of several (NODES) is not judged alone: its failure is kept for its group's
    judgement (``group_judged``) and None returned (the host goes on to it)."""
    if nodes:
        cache.memo(Kind.NODE_FAILURE).setdefault("failure", failure)
        logger.warning(f"{host.name}: {_first_line(failure)}: judged with the other nodes of "
                       f"the group ({', '.join(nodes)})")
        return None
    forget()
    raw, found = found_stacks(stacks)
    verdict = switch_rules.rollback_verdict(True, found.trial, found.current, found.previous,
                                            found.stacks, rollback)
    return _concluded(verdict, failure, _first_line(failure), raw, found, stacks, unit, watch)


def node_failure(name: str) -> OperationError | None:
    """The failed start or answer of node NAME in this run (``judged``), or None."""
    node = pyinfra_state.inventory.get_host(name)
    return cache.memo(Kind.NODE_FAILURE, of=node).get("failure") if node else None


def in_run() -> set[str]:
    """The hosts this run deploys now: connected, within ``--limit``, none failed yet."""
    return {h.name for h in pyinfra_state.active_hosts}


@operation()
def together(stacks: StacksAt, wanted: str, release: str, nodes: list[str]):
    """
    Stop before any change when this run would switch a node of a model served by several
    (NODES) to another stack while a node of the group is not in the run (``--limit``, or a
    connection that failed): the nodes of a TP group switch together, or not at all.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` link to the serving one,
      the service that names their state record, the lock file that names a venv made before
      stacks)
    + wanted: the stack id of the settings (the lock id)
    + release: the settings' set in words, e.g. ``sglang 0.5.10``
    + nodes: the ``nodes`` setting: the inventory names of the group, this one among them

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.together(name="Every node of the model is in the run",
                              stacks=StacksAt("/opt/sglang/venv", "sglang"),
                              wanted="68a87c7696509d54", release="sglang 0.5.10",
                              nodes=["ct101", "ct102"])
    """
    _, found = found_stacks(stacks)
    current = found.named
    missing = switch_rules.not_together(nodes, in_run(), current, wanted)
    if missing:
        raise OperationError(_apart(missing, nodes, f"{release} (stack {wanted})"))
    host.noop(f"the nodes {', '.join(nodes)} are in the run")
    yield from ()


def _apart(missing: tuple[str, ...], nodes: list[str], release: str,
           left: str = "nothing was changed") -> str:
    return (f"{host.name}: not switched to {release}: node(s) {', '.join(missing)} of this "
            f"model's group ({', '.join(nodes)}, the nodes setting) not in this run (--limit, "
            "a failed connection, or a failure earlier in the run); the nodes of one TP group "
            f"switch together: deploy every node of the group at once; {left}")


@operation()
def group_judged(stacks: StacksAt, unit: str, rollback: bool, nodes: list[str],
                 watch: Callable[[], None]):
    """
    Judge the nodes of a model served by several (NODES) together, once each node's start and
    answer was judged (``judged`` keeps a node's failure): all good, nothing to do (the trial
    ends next); a node failed, or left the run, and every node whose stack is on trial records
    the set as failed, switches back to the previous stack and restarts, in this one operation
    on every node at once (a TP group's ranks start together); each follows its start with
    WATCH until the old release serves again, then fails naming both releases and the failed
    node(s). Checked once the deploy has run.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` setting, the service that
      names their state record, the lock file that names a venv made before stacks)
    + unit: the server's systemd unit
    + rollback: ``upgrade_rollback``
    + nodes: the ``nodes`` setting: the inventory names of the group, this one among them
    + watch: follows the server's start until it serves (``verify.watch_start``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.group_judged(name="The nodes of the model are judged together",
                                  stacks=StacksAt("/opt/sglang/venv", "sglang"),
                                  unit="sglang.service", rollback=True, nodes=["ct101", "ct102"],
                                  watch=lambda: None)
    """
    if not pyinfra_state.is_executing:
        host.noop("the nodes of a model are judged together once each was")
        return
    active = in_run()
    passed = {name: None if name not in active else node_failure(name) is None
              for name in nodes}
    failed = switch_rules.group_failed(passed)
    if not failed:
        host.noop(f"every node of the group ({', '.join(nodes)}) serves")
        return
    why = "; ".join(f"node {name}: " + (_first_line(error) if passed[name] is False
                                        and (error := node_failure(name)) is not None
                                        else "left the run before its judgement")
                    for name in failed)
    own = node_failure(host.name)
    failure = own or OperationError(f"the group fails: {why}")
    forget()
    raw, found = found_stacks(stacks)
    verdict = switch_rules.rollback_verdict(True, found.trial, found.current, found.previous,
                                            found.stacks, rollback)
    yield from host_fails(_concluded(verdict, failure, why[:300], raw, found, stacks, unit,
                                     watch, group=(nodes, failed)))


def back_target(stacks: StacksAt) -> str | None:
    """At execution: the release the server goes back to with its roll
    (``operations.roll.back_with_the_roll``): the previous stack's, where the stack it runs is
    on trial (an upgrade of this run); None where there is none (a change of a flag or of the
    tuned file keeps no earlier set)."""
    forget()
    raw, found = found_stacks(stacks)
    if found.trial is None or found.previous is None:
        return None
    return release_words(raw, found.previous)


def sent_back(why: str, stacks: StacksAt, unit: str, watch: Callable[[], None]) -> None:
    """At execution: the server that serves an upgrade of this run sent back to the previous
    stack because its roll stopped elsewhere (WHY): the new set recorded as failed here too, the
    link back, the restart, its start followed with WATCH (raises ``OperationError`` when the
    old release does not serve either)."""
    forget()
    raw, found = found_stacks(stacks)
    if found.trial is None or found.previous is None:
        raise OperationError(f"{host.name}: no previous stack to go back to")
    record = failed_record(raw, found, why)
    for command in rollback_commands(stacks, unit, record, found.previous):
        _run(command)
    forget()
    watch()


def failed_record(raw: dict, found: Found, why: str) -> dict:
    """The stacks' record (RAW's) with the set the server runs (FOUND's current) recorded as
    failed, when and WHY: a rollback writes it first."""
    record = dict(raw.get("state") or {})
    failed = dict(record.get("failed") or {})
    failed[found.current] = {"sglang": (raw["stacks"].get(found.current) or {}).get("sglang"),
                             "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                             "why": why}
    record["failed"] = failed
    return record


def _first_line(failure: OperationError) -> str:
    return str(failure).split("\n", 1)[0][:300]


def _concluded(verdict: RollbackVerdict, failure: OperationError, why: str, raw: dict, found: Found,
               stacks: StacksAt, unit: str, watch: Callable[[], None],
               group: tuple[list[str], tuple[str, ...]] | None = None) -> OperationError:
    """Act on VERDICT for the failed server (FAILURE, WHY its first line): record the failed
    set and switch back (``RollbackVerdict.ROLL_BACK``), or say why not; the error to raise. GROUP:
    the group's nodes and the failed ones, for a node of several."""
    if verdict is RollbackVerdict.NOT_AN_UPGRADE:
        if group:  # no stack on trial here: nothing to go back to, the group fails as it is
            own = f"\n{failure}" if node_failure(host.name) is failure else ""
            return _told(f"the group ({', '.join(group[0])}) does not serve: {why}", own, group)
        return failure
    new, old = release_words(raw, found.current), release_words(raw, found.previous)
    record = failed_record(raw, found, why)
    details = f"\n{failure}"
    on = (f" on node(s) {', '.join(group[1])} of the group ({', '.join(group[0])})"
          if group else "")
    every = " on every node of the group" if group else ""
    if verdict is not RollbackVerdict.ROLL_BACK:
        reason = {RollbackVerdict.KEEP_FAILED: "upgrade_rollback is false: the failed release is "
                                               "kept for debugging",
                  RollbackVerdict.NO_TARGET: "no previous stack to go back to"}[verdict]
        _run(record_command(stacks.service, record))
        back = (f"; to go back: ln -sfn {switch_rules.link_target(stacks.venv_path, found.previous)} "
                f"{stacks.venv_path} && systemctl restart {unit}{every}") if found.previous else ""
        logger.error(f"{host.name}: UPGRADE FAILED, NOT ROLLED BACK: {new} does not serve"
                     f"{on} ({reason}){back}")
        return OperationError(f"upgrade from {old} to {new} failed{on}, not rolled back: "
                              f"{reason}{back}{details}")
    logger.warning(f"{host.name}: upgrade to {new} failed{on} ({why}): rolling back to {old}"
                   f"{every}")
    assert found.previous is not None, "ROLL_BACK: there is a stack to go back to (has_target)"
    for command in rollback_commands(stacks, unit, record, found.previous):
        _run(command)
    forget()
    try:
        watch()
    except OperationError as again:
        return _told(f"upgrade from {old} to {new} failed{on} and was rolled back, but "
                     f"{old} does not serve either", f":\n{again}{details}", group)
    logger.warning(f"{host.name}: rolled back: {old} serves again")
    return _told(f"upgrade from {old} to {new} failed{on}; rolled back to {old}{every}, which "
                 f"serves again. {new} is recorded as failed: the next run with it stops before "
                 "any change unless retry_failed_stack is true.", details, group)


def restart_command(unit: str) -> StringCommand:
    """Start UNIT afresh: its start limit reset (a crash loop may have used it up)."""
    return StringCommand("systemctl reset-failed", QuoteString(unit), "; systemctl restart",
                         QuoteString(unit))


def restart_unless_newer(unit: str, venv_path: str) -> StringCommand:
    """Restart UNIT unless it runs a process started after the ``venv_path`` link last changed
    (a rollback killed before its restart, or a crash loop that used up its start limit).
    Both times in nanoseconds: a rollback restarts within the second of its link's change,
    and whole seconds read that start as older than the link (a second, needless restart)."""
    quoted = QuoteString(unit)
    return StringCommand(
        "started=$({ systemctl --timestamp=us+utc show -p ExecMainStartTimestamp --value", quoted,
        "|| systemctl show -p ExecMainStartTimestamp --value", quoted, "; } 2>/dev/null);",
        "{ [ \"$(systemctl is-active", quoted, ")\" = active ] && [ -n \"$started\" ] &&",
        "[ \"$(date -d \"$started\" +%s%N)\" -gt \"$(stat -c %.9Y",
        QuoteString(venv_path.rstrip("/")), "| tr -d .)\" ]; } || {", restart_command(unit),
        "; }")


def rollback_commands(stacks: StacksAt, unit: str, record: dict,
                      previous: str) -> list[StringCommand]:
    """
    The rollback, in an order a kill at any point of leaves for the next run to finish
    (``switch_rules.unfinished_rollback``, ``rollback_finished``): RECORD with the failed set,
    the trial and its target kept; the link back to PREVIOUS in one rename; the restart; the
    trial cleared last.
    """
    cleared = {key: value for key, value in record.items() if key != "trial_until"}
    cleared.update(trial=None, previous=None)
    return [record_command(stacks.service, record), link_command(stacks.venv_path, previous),
            restart_command(unit), record_command(stacks.service, cleared)]


@operation()
def rollback_finished(stacks: StacksAt, unit: str, rollback: bool = True,
                      watch: Callable[[], None] | None = None):
    """
    Finish a rollback a kill cut short, before anything else: the failed set is recorded and
    the link still names it (switch back to the previous stack and restart it), or the link
    went back and the record still holds the trial (clear it; the restart follows from the
    link's change, ``since``). The model serves the previous release again, and the next check
    (``not_failed``) reads a failed set that was rolled back, truly. Then: a switch back that
    systemd made on its own (``remote/stack_fallback.py``, the unit's ``ExecStopPost=`` and
    ``OnFailure=``) is reported, and a stack on trial whose server restarted on its own since
    the switch, or failed for good, before its verdict or within its probation
    (``switch_rules.failed_on_probation``) is a failed upgrade: recorded and rolled back here,
    as the verify phase would. A crash loop the server's fallback keeps restarting is reported.
    A rollback begun here is followed with WATCH until the previous release serves again, as
    the verify phase's rollback is.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` link to the serving one,
      the service that names their state record, the lock file that names a venv made before
      stacks)
    + unit: the server's systemd unit
    + rollback: ``upgrade_rollback`` (false: a failure on probation is recorded, not rolled back)
    + watch: follows the server's start until it serves (``verify.watch_start``); None: the
      run does not wait for it

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.rollback_finished(name="A rollback cut short is finished",
                                       stacks=StacksAt("/opt/sglang/venv", "sglang"),
                                       unit="sglang.service")
    """
    raw, found = found_stacks(stacks)
    record = dict(raw.get("state") or {})
    _report_crash_loop(unit, raw, found, record)
    step = switch_rules.unfinished_rollback(found, tuple(record.get("failed") or {}))
    if step is None:
        yield from _after_trial(stacks, unit, rollback, raw, found, record, watch)
        return
    failed, old = release_words(raw, found.trial), release_words(raw, found.previous)
    # systemd's own switch back cut short: its note is reported here, once.
    fell = record.get("fell_back")
    which = "systemd's switch back" if fell else "the rollback"
    if step is Unfinished.SWITCH_BACK:
        assert found.previous is not None, "SWITCH_BACK: there is a stack to go back to (has_target)"
        logger.warning(f"{host.name}: {which} of the failed upgrade to {failed} was cut "
                       f"short: switching back to {old} and restarting it")
        yield link_command(stacks.venv_path, found.previous)
        yield restart_command(unit)
    else:
        logger.warning(f"{host.name}: {which} from {failed} to {old} ended before its "
                       "record did: its trial is cleared")
        yield restart_unless_newer(unit, stacks.venv_path)
    if fell:
        logger.warning(f"{host.name}: {unit} of {failed} failed on trial; systemd switched back "
                       f"to {old} on {fell.get('when')} without a deploy run: {fell.get('why')}")
    # As the whole rollback leaves it: no trial, no probation's end, no note left to report.
    cleared = {key: value for key, value in record.items()
               if key not in ("trial_until", "fell_back")}
    yield record_command(stacks.service, {**cleared, "trial": None, "previous": None})
    forget()
    yield from _serving_again(watch, failed, old)


def _serving_again(watch: Callable[[], None] | None, failed: str, old: str):
    """At execution, once a rollback begun at the start of a run restarted the previous
    release: follow its start with WATCH until it serves, as the verify phase's rollback does;
    the host fails, naming both releases, when it does not."""
    if watch is None:
        return

    def serving(state, host) -> bool:  # pyinfra passes both to a FunctionCommand naming them
        try:
            watch()
        except OperationError as again:
            host.log_styled(f"{host.name}: the failed upgrade to {failed} was rolled back, but "
                            f"{old} does not serve either:\n{again}", fg="red",
                            log_func=logger.error)
            return False
        logger.warning(f"{host.name}: rolled back: {old} serves again")
        return True

    yield FunctionCommand(serving, (), {})


def _report_crash_loop(unit: str, raw: dict, found: Found, record: dict) -> None:
    """The crash loop the server's fallback keeps restarting (the record's ``crash_loop``,
    cleared by the next good verdict), reported once a run."""
    loop = record.get("crash_loop")
    if not loop or not cache.once(Kind.UNIT_LOOPING, f"{unit} crash loop"):
        return
    count = int(loop.get("restarts") or 0)
    logger.warning(
        f"{host.name}: {unit} of {release_words(raw, found.named)} crash-loops: "
        f"{loop.get('why')}; not on trial, so its fallback (remote/stack_fallback.py) starts it "
        f"again after each start limit, {count} time{'s' if count != 1 else ''} since "
        f"{_utc(loop.get('since'))}, the last after a pause of {loop.get('pause_s')}s (it "
        f"doubles, up to {rollback_rules.MAX_PAUSE_S:.0f}s): the model is down most of that "
        f"time; see journalctl -u {unit}")


def _after_trial(stacks: StacksAt, unit: str, rollback: bool, raw: dict, found: Found,
                 record: dict, watch: Callable[[], None] | None):
    """``rollback_finished``'s other part: systemd's own switch back reported (and its note
    cleared), or a stack on trial that failed since its switch rolled back."""
    fell = record.get("fell_back")
    if fell:
        logger.warning(
            f"{host.name}: {unit} of {release_words(raw, fell.get('from'))} failed on trial; "
            f"systemd switched back to {release_words(raw, fell.get('to'))} on "
            f"{fell.get('when')} without a deploy run: {fell.get('why')}")
        record = {key: value for key, value in record.items() if key != "fell_back"}
        yield record_command(stacks.service, record)
        forget()
        return
    if found.trial is None or found.trial != found.current:
        host.noop("no rollback cut short, no stack on trial")
        return
    unit_state = container_reads.read(Part.UNIT, unit)
    try:
        restarts = int(unit_state.get("restarts") or 0)
    except ValueError:
        restarts = 0
    now = time.time()
    why = switch_rules.failed_on_probation(found.trial, found.current, record.get("trial_until"),
                                           now, restarts, unit_state.get("active"))
    if why is None:
        host.noop("no rollback cut short")
        return
    verdict = switch_rules.failure_verdict(record, found.current, found.stacks, now, rollback)
    new, old = release_words(raw, found.current), release_words(raw, found.previous)
    failed = dict(record.get("failed") or {})
    failed[found.current] = {"sglang": (raw["stacks"].get(found.current) or {}).get("sglang"),
                             "when": _utc(now), "why": why}
    record = {**record, "failed": failed}
    if verdict is not RollbackVerdict.ROLL_BACK:
        logger.error(f"{host.name}: UPGRADE FAILED, NOT ROLLED BACK: {new}: {why} ("
                     + ("upgrade_rollback is false" if verdict is RollbackVerdict.KEEP_FAILED
                        else "no previous stack to go back to") + ")")
        yield record_command(stacks.service, record)
        forget()
        return
    logger.warning(f"{host.name}: the upgrade to {new} failed: {why}; rolling back to {old}")
    assert found.previous is not None, "ROLL_BACK: there is a stack to go back to (has_target)"
    yield from rollback_commands(stacks, unit, record, found.previous)
    forget()
    yield from _serving_again(watch, new, old)


def _told(summary: str, details: str, group: object) -> OperationError:
    """The error of a failed upgrade. A node of several logs its SUMMARY as well: the nodes
    fail in one operation and pyinfra ends the run with one node's error."""
    if group:
        logger.error(f"{host.name}: {summary}")
    return OperationError(f"{summary}{details}")


def _run(command: StringCommand) -> None:
    ok, output = host.run_shell_command(command)
    if not ok:
        raise OperationError(f"{command.get_raw_value()}: {output.stderr or output.stdout}")


@operation()
def trial_passed(stacks: StacksAt, probation_s: int = 0):
    """
    End the trial of the stack the server runs once the verify phase found it serving and
    answering, and it served PROBATION_S since its first good verdict: it is no longer rolled
    back, and its set is no longer recorded as failed. Until then it stays on trial
    (``trial_until`` in the record): a crash loop switches it back (the unit's ``OnFailure=``),
    and a run that finds it restarted on its own rolls it back (``rollback_finished``).
    Checked once the deploy has run.

    + stacks: the container's stacks (``StacksAt``: the ``venv_path`` setting, the service that
      names their state record, the lock file that names a venv made before stacks)
    + probation_s: ``upgrade_probation_s`` (0: the trial ends at the verdict)

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack_switch
        from pve_sglang.stack.switch_rules import StacksAt

        stack_switch.trial_passed(name="The upgrade serves",
                                  stacks=StacksAt("/opt/sglang/venv", "sglang"))
    """
    if not pyinfra_state.is_executing:
        host.noop("an upgrade's trial ends once the server answered")
        return
    # The container phase's read, after its switch (which forgets) if any.
    raw, found = found_stacks(stacks)
    record = dict(raw.get("state") or {})
    failed = dict(record.get("failed") or {})
    # It serves and answers: a crash loop its fallback restarted is over.
    loop = record.pop("crash_loop", None)
    if loop:
        logger.info(f"{host.name}: {release_words(raw, found.named)} serves again: its crash loop "
                    f"({loop.get('restarts')} starts by its fallback since "
                    f"{_utc(loop.get('since'))}) is over")
    if found.trial is None and found.current not in failed:
        if loop:
            yield record_command(stacks.service, record)
            forget()
            return
        host.noop("no stack on trial")
        return
    now = time.time()
    until = record.get("trial_until")
    step = switch_rules.probation(found.trial, found.current, until, now, probation_s)
    if step is switch_rules.Probation.START:
        until = now + probation_s
        logger.info(f"{host.name}: the upgrade to {release_words(raw, found.current)} serves; on "
                    f"trial until {_utc(until)} (upgrade_probation_s {probation_s}): its first "
                    f"crash before then switches back to {release_words(raw, found.previous)}")
        # A set retried (retry_failed_stack) and judged good is no longer recorded as failed:
        # a failure on probation records it again (and a later run must not read a trial in
        # the failed sets as a rollback cut short).
        failed.pop(found.current, None)
        yield record_command(stacks.service, {**record, "failed": failed, "trial_until": until})
        forget()
        return
    if step is switch_rules.Probation.WAIT:
        if loop:
            yield record_command(stacks.service, record)
            forget()
            return
        host.noop(f"{release_words(raw, found.current)} serves, on trial until {_utc(until)}")
        return
    record.pop("trial_until", None)
    logger.info(f"{host.name}: the upgrade to {release_words(raw, found.current)} serves; "
                f"{release_words(raw, found.previous)} stays as the rollback target")
    failed.pop(found.current, None)
    record.update(trial=None, failed=failed)
    yield record_command(stacks.service, record)
    forget()


def _utc(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch or 0))
