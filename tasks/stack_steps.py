"""The stack switch's steps that the container and verify phases share
(``pve_sglang/operations/stack_switch.py``): before any change, a rollback cut short is finished
and a switch that must not happen is refused; after the server's unit, and again after the
verify phase's verdict, the newest stacks are kept and the host's wheel store is told which locks
the container holds.

Called from deploy code (a ``@deploy`` function), with pyinfra's ``host`` the container.
"""

from __future__ import annotations

from collections.abc import Callable

from pve_sglang import remote
from pve_sglang.config.settings import ContainerSettings, ServerView, StackView
from pve_sglang.operations import stack_switch, verify, wheel_store
from pve_sglang.server.addresses import base_url, client_address
from pve_sglang.server.unit_text import env_file_path, unit_name
from tasks.common import store_user_key, upload_script


def follow_start(server: ServerView, stall_s: int) -> Callable[[], None]:
    """What follows the SERVER's start in its journal until it serves (``verify.watch_start``,
    the uploaded startup watch, asking /health where a client in the container reaches it;
    STALL_S: ``startup_stall_s``, which no view holds): the verify phase's rollback and one
    begun at the start of a run wait with it."""
    unit, env_file = unit_name(server), env_file_path(server)
    health = f"{base_url(client_address(server.server_host), server.server_port)}/health"
    watch = remote.path(remote.STARTUP_WATCH)
    return lambda: verify.watch_start(unit, health, env_file, watch, server.health_timeout_s,
                                      stall_s)


def before_switch(server: ServerView, wanted: str, retry: bool, stall_s: int) -> None:
    """A rollback a kill cut short is finished first, and a stack on trial found failed since
    its switch rolled back, each waiting until the previous release serves again (its start
    followed, ``follow_start``: STALL_S); then the run stops before any change when the
    settings' set failed as an upgrade here before (unless RETRY: ``retry_failed_stack``), or
    when a node of several (the SERVER's ``nodes``) would switch without every node of its
    group in the run. WANTED: the settings' stack id (``stack.identity``), which the phase
    looks up once."""
    watch, stacks = follow_start(server, stall_s), server.stacks_at
    release = f"sglang {server.sglang_version}"
    upload_script(remote.STARTUP_WATCH, "Upload the startup watch (a rollback waits with it)")
    stack_switch.rollback_finished(
        name="A rollback cut short by a kill is finished", stacks=stacks,
        unit=unit_name(server), rollback=server.upgrade_rollback, watch=watch)
    stack_switch.not_failed(
        name=f"The set {release} did not fail here before", stacks=stacks, wanted=wanted,
        release=release, retry=retry)
    if server.nodes:
        stack_switch.together(
            name=f"The nodes of the model ({', '.join(server.nodes)}) switch together",
            stacks=stacks, wanted=wanted, release=release, nodes=server.nodes)


def kept_words(stack: StackView, keep: int) -> str:
    """What ``kept`` does, in words (a step of the container phase, a check of the verify
    phase's): KEEP, ``stack_retention``, which no view holds; the STACK's wheel store."""
    return (f"keep the {keep} newest stacks (the serving one and its rollback "
            "target always)" + (f", then tell the wheel store {stack.wheel_store} which locks "
                                "the container holds" if stack.uses_wheel_store else ""))


def kept(cs: ContainerSettings, wanted: str, after_verdict: bool = False) -> None:
    """The stacks beyond the ``stack_retention`` newest removed (none while a stack is on trial:
    the verify phase removes them AFTER_VERDICT), then the container's record in its host's
    wheel store written from what is left: the host's store retention prunes by it. WANTED:
    the settings' stack id. CS whole: beside the stack's wheel store and the server's stacks it
    reads stack_retention and restart_on_change, which no view holds."""
    when, stacks = ", after the verdict" if after_verdict else "", cs.server.stacks_at
    stack_switch.retention(
        name=(f"Keep the {cs.stack_retention} newest stacks" + (
            when or " (the serving one and its rollback target always)")),
        stacks=stacks, wanted=wanted, keep=cs.stack_retention,
        restart_on_change=cs.restart_on_change)
    if cs.uses_wheel_store and cs.wheel_store is not None:
        wheel_store.holds(name=f"The wheel store {cs.wheel_store} knows the locks this "
                               f"container holds{when}", store=cs.wheel_store,
                          key=store_user_key(), stacks=stacks, wanted=wanted)
