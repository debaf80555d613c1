"""The tuning search of one model's server (``make tune``): the plan, then, at execution, the
measured search against the deployed server (``tuning.deployed``), driven by
``tuning.drive`` (every try in the record, the server left on the best, the tuned file
written), and its table and plot beside the tuned file.

A model served by a multi-node group (``nodes``) is tuned as one, by its first node: each try
is written to every node's unit and restarts them together; the best goes to every node's
tuned file. Its other nodes upload the scripts their starts are followed with, and wait.

Replicas behind a gateway (issue 51) are tuned as one too, by the first of them in the run:
it is taken out of the gateway's rotation (drained, once the others serve) for the whole
search, so that its tries restart and are measured alone while the others serve; then given
back, and the best rolls to the others in turn, by the roll's own steps (out, drained, the
unit written and restarted, its start followed, a generation asked as the gateway asks it,
given back). A replica the best fails on goes back to its flags as found and stops the roll.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gevent

from pyinfra import host, logger
from pyinfra.api import OperationError
from pyinfra.context import ctx_host, state
from pyinfra.facts.files import FileContents
from pyinfra.operations import python

from pve_sglang import remote
from pve_sglang.config.gateway import GatewaySettings
from pve_sglang.config.settings import (BenchView, ContainerSettings, ModelView, ServerView,
                                        host_settings)
from pve_sglang.gateway.render import TurnArgv, turn_argv
from pve_sglang.gateway.roll import Turn, turn_line
from pve_sglang.operations.roll import (asked_as_the_gateway_asks, back_if_it_answers,
                                        give_back, take_out)
from pve_sglang.runtime.errors import PreflightError
from pve_sglang.tuning import record, report
from pve_sglang.tuning.deployed import Deployed, Node, installed_flags, refused_flags
from pve_sglang.facts.verify import StartTimes
from pve_sglang.server.startup_log import READY_LINE
from pve_sglang.server.unit_text import unit_name
from pve_sglang.tuning.drive import Drive, NotServing
from pve_sglang.tuning.plan import (
    is_moe,
    objective_concurrency,
    plan_lines,
    space_for,
    start_seconds,
)
from pve_sglang.tuning.space import start_of
from pve_sglang.tuning.tuned_file import read_tuned, write_tuned
from tasks.common import container_gpus, upload_script
from tasks.gateway import rolled_with_others
from tasks.verify import upload_prompts

#: The scripts a search runs in the container, as the verify phase uploads them (the server
#: metrics sampler beside the GPU sampler, its companion).
SCRIPTS = (remote.STARTUP_WATCH, remote.GPU_SAMPLER, remote.BENCH_RECORD, remote.FLAG_LISTER)

#: What a search needs of a node, asked with pyinfra's ``host`` that node: its settings as
#: found and the host's GPUs it has.
NodeView = Callable[[], tuple[ContainerSettings, list[dict]]]


@dataclass(frozen=True)
class Replicas:
    """The replicas behind one gateway, tuned as one: the GATEWAY's inventory name, the
    replicas' NAMES in the inventory's order, and each one's turn argv (the worker script's
    ``out``, ``in`` and ``check`` of it)."""

    gateway: str
    names: list[str]
    argv: dict[str, TurnArgv]

    @classmethod
    def of(cls, gateway: str, gs: GatewaySettings, names: list[str], check_s: int) -> Replicas:
        """The replicas NAMES behind GATEWAY (settings GS), CHECK_S each generation's bound."""
        return cls(gateway, names, {name: turn_argv(gs, name, check_s) for name in names})

    def tuner(self) -> str:
        """The replica the search runs on: the first of NAMES in this run."""
        return next(name for name in self.names
                    if state.is_host_in_limit(state.inventory.get_host(name)))


def replicas_behind(server: ServerView, check_s: int) -> Replicas | None:
    """The replicas behind the gateway that fronts pyinfra's ``host``
    (``gateway.rolled_with_others``), or None; CHECK_S each generation's bound
    (``generation_timeout_s``)."""
    rolled = rolled_with_others(server)
    if rolled is None:
        return None
    gw, gs, names = rolled
    return Replicas.of(gw.name, gs, names, check_s)


def deployed_view() -> tuple[ContainerSettings, list[dict]]:
    """The node's settings (the hosts file's, its tuned file included) and GPUs."""
    cs = host_settings(ContainerSettings)
    return cs, container_gpus(cs.lxc)[1]


def tune_container(cs: ContainerSettings, pinned: frozenset[str],
                   gpu_host: tuple[str | None, list[dict]]) -> None:
    """``make tune`` for the container of pyinfra's ``host``, on its host's driver and GPUs
    (GPU_HOST): without a GPU there is nothing to measure, and nothing changes. The phase's
    entry point: CS whole, as its steps span the tuning, the server, the benchmark and the
    search's nodes (``deployed_view``)."""
    driver, _ = gpu_host
    print("\n".join(plan_lines(host.name, cs.tuning, None, pinned,
                               start_s=measured_start_s(cs.server) if driver else None)))
    if not driver:
        logger.warning(f"{host.name}: make tune: nothing measured: the host has no NVIDIA GPU, "
                       "so no server runs; nothing was changed (the plan is above)")
        return
    tune_steps(cs.server, cs.benchmark, pinned, deployed_view,
               replicas_behind(cs.server, cs.generation_timeout_s))


def tune_steps(server: ServerView, bench: BenchView, pinned: frozenset[str], view: NodeView,
               replicas: Replicas | None = None) -> None:
    """Upload the scripts the search runs; on a model's first node (or its only one; of
    REPLICAS behind a gateway, the first in the run), at execution, search (``search``).
    SERVER: its group (``nodes``); BENCH: the prompts the search's benchmark reads; PINNED:
    the search's settings the container's own entry sets (never moved); VIEW: what the
    search needs of each node."""
    group_in_limit(server)
    for script in SCRIPTS:
        upload_script(script, f"Upload {script} (make tune)")
    if server.nodes and server.nodes[0] != host.name:
        logger.info(f"{host.name}: make tune: tuned with its group, by its first node "
                    f"{server.nodes[0]}")
        return
    if replicas is not None:
        tuner = replicas.tuner()
        if tuner != host.name:
            logger.info(f"{host.name}: make tune: tuned with its replicas behind "
                        f"{replicas.gateway}, by {tuner}; the best then rolls to it in turn")
            return
        others = [name for name in replicas.names if name != host.name]
        logger.info(f"{host.name}: make tune: behind {replicas.gateway}: out of its rotation "
                    "for the search (drained once the others serve; its tries restart and are "
                    "measured alone), given back, then the best rolls to "
                    f"{', '.join(others)} in turn")
    upload_prompts(bench)
    tuned = Path(host.data.get("tuned_file"))
    python.call(name=f"Tuning search: {tuned.name} (a restart and a benchmark per try)",
                function=search, pinned=pinned, view=view, replicas=replicas)


def group_in_limit(server: ServerView) -> None:
    """A group's nodes restart together: a search of a node whose group is not whole in the run
    (``--limit``) stops before any change."""
    missing = [name for name in server.nodes
               if not state.is_host_in_limit(state.inventory.get_host(name))]
    if missing:
        raise PreflightError(
            f"{host.name}: make tune: nodes {server.nodes}: a multi-node group is tuned as one, and "
            f"{', '.join(missing)} is not in this run; allowed: --limit with every node of the "
            "group; nothing was changed")


def measured_start_s(server: ServerView) -> float | None:
    """The seconds the container's server took at its last start, from its journal; None
    where it shows none."""
    return start_seconds(host.get_fact(StartTimes, unit=unit_name(server), ready=READY_LINE))


def model_is_moe(model: ModelView) -> bool | None:
    """Whether the served model is MoE, from its config.json in the container; None where it
    cannot be read (the MoE backend then stays in the space)."""
    text = host.get_fact(FileContents, path=f"{model.model_path}/config.json")
    try:
        config = json.loads("\n".join(text or ()))
    except ValueError:
        return None
    return is_moe(config) if isinstance(config, dict) else None


def nodes_of(view: NodeView) -> list[Node]:
    """The model's nodes, its first first: this container, or every node of its group."""
    cs, _ = view()
    nodes = []
    for name in cs.nodes or [host.name]:
        node = state.inventory.get_host(name)
        with ctx_host.use(node):
            nodes.append(Node(node, *view()))
    return nodes


def search(pinned: frozenset[str], view: NodeView, replicas: Replicas | None = None) -> None:
    """At execution: the measured search of this model, from the server as it is found;
    behind a gateway (REPLICAS), out of its rotation, then the best rolled to the others."""
    nodes = nodes_of(view)
    first = nodes[0]
    cs = first.settings
    space = space_for(cs.tuning, model_is_moe(cs.model), pinned)
    found = start_of(cs.tuning, space)
    known = installed_flags(cs.server, remote.path(remote.FLAG_LISTER))
    refused = refused_flags(host.name, cs, first.gpus, state.inventory, found, space, known)
    if refused:
        raise OperationError(f"{host.name}: make tune: sglang {cs.sglang_version} refuses "
                             f"{len(refused)} value(s) of the space, before any restart:\n  "
                             + "\n  ".join(refused) + "\nchange tune_space")
    level = objective_concurrency(cs.tuning)
    deployed = Deployed(nodes, state.inventory, remote.path(remote.STARTUP_WATCH),
                        remote.path(remote.GPU_SAMPLER), remote.path(remote.BENCH_RECORD),
                        remote.path(remote.SERVER_METRICS) if cs.enable_metrics else None, level)
    gateway = out_for_the_search(replicas) if replicas else None
    # The search starts from a server that serves: each start followed as each try's is.
    for node in nodes:
        with ctx_host.use(node.host):
            deployed.follow_start(node, node.settings.server, node.settings.startup_stall_s)
    tuned = Path(first.host.data.get("tuned_file"))
    start_s = measured_start_s(cs.server)
    drive = Drive(space, found, cs.tune_budget_s, tuned, level, cs.tune_max_p99_ttft_ms,
                  cs.bench_low_power_pct,
                  start_s=Drive.start_s if start_s is None else start_s)
    stopped, serving = False, True
    try:
        with ctrl_c_stops(f"{host.name}: make tune"):
            drive.run(deployed.server())
    except KeyboardInterrupt:
        stopped = True
    except NotServing as error:
        serving = False
        raise OperationError(f"{host.name}: {error}" + (
            f"; left out of {replicas.gateway}'s rotation" if replicas else "")) from None
    finally:
        if replicas and gateway is not None and serving:
            back_after_the_search(replicas, gateway)
        # The group's other nodes read the same best from their own tuned files.
        for node in nodes[1:]:
            if tuned.exists():
                write_tuned(Path(node.host.data.get("tuned_file")), tuned.read_text())
        done = record.read_search(record.record_path(tuned))
        logger.info(f"{host.name}: make tune: every try\n" + report.summary_table(done))
        if done.tries:
            plot = tuned.with_suffix(".png")
            report.plot(done, plot, f"{host.name}: make tune")
            logger.info(f"{host.name}: make tune: best in {tuned}, plot {plot}")
    if stopped:
        raise OperationError(f"{host.name}: make tune: stopped with Ctrl-C; the server serves "
                             f"the best measured (in {tuned}); the next run goes on from the "
                             "record, each try measured once" + (
                                 ", then rolls the best to the other replicas" if replicas
                                 else ""))
    if replicas and gateway is not None:
        roll_best(replicas, gateway, deployed, view, tuned, space)


def out_for_the_search(replicas: Replicas):
    """Before the search's first restart: this replica out of its gateway's rotation, drained
    (the others serve meanwhile); the gateway's pyinfra host. Raises ``OperationError``, before
    any change, where the gateway cannot take it out (the others not healthy, or the gateway
    not serving)."""
    gateway = state.inventory.get_host(replicas.gateway)
    if not gateway.connected:
        gateway.connect(reason="make tune: its rotation", raise_exceptions=True)
    turn = Turn(host.name)
    refusal, why = take_out(gateway, replicas.argv[host.name], turn)
    if refusal is not None:
        raise OperationError(f"{host.name}: make tune: not tuned: {replicas.gateway} did not "
                             f"take it out of its rotation ({why}); a replica is tuned out of "
                             "the rotation, once the others serve; nothing was changed")
    logger.info(f"{host.name}: make tune: out of {replicas.gateway}'s rotation for the search, "
                f"drained in {turn.drain_s or 0:.1f}s ({turn.cut or 0} in flight cut)")
    return gateway


def back_after_the_search(replicas: Replicas, gateway) -> None:
    """After the search, the server on the best: a generation asked as the gateway asks it,
    then its traffic given back; where it fails, it stays out (said so)."""
    turn = Turn(host.name)
    out = back_if_it_answers(gateway, replicas.argv[host.name], turn)
    if out is not None:
        logger.error(f"{host.name}: make tune: left out of {replicas.gateway}'s rotation: {out}")
        return
    logger.info(f"{host.name}: make tune: {turn.verdict}")


def roll_best(replicas: Replicas, gateway, deployed: Deployed, view: NodeView, tuned: Path,
              space: dict[str, tuple]) -> None:
    """The search's best (TUNED) to the other replicas, one at a time, by the roll's steps:
    out (drained), the unit written and restarted (``Deployed.apply``: its start followed,
    its generation checked), a generation asked as the gateway asks it, its tuned file
    written, given back. A replica not in the run gets the tuned file (``make deploy`` rolls
    it there). One the best fails on is put back on its flags as found (its settings'
    values of SPACE), given back, and stops the roll (``OperationError`` naming it)."""
    best, text = read_tuned(tuned), tuned.read_text()
    for name in replicas.names:
        if name == host.name:
            continue
        other = state.inventory.get_host(name)
        if not state.is_host_in_limit(other):
            write_tuned(Path(other.data.get("tuned_file")), text)
            logger.warning(f"{name}: make tune: not in this run: its tuned file holds the best; "
                           "`make deploy` rolls it there in turn")
            continue
        with ctx_host.use(other):
            node = Node(other, *view())
        turn, argv = Turn(name), replicas.argv[name]
        refusal, why = take_out(gateway, argv, turn)
        if refusal is not None:
            raise OperationError(f"{name}: make tune: the best was not rolled to it: not taken "
                                 f"out: {why}; the roll stopped there")
        began = time.monotonic()
        one = dataclasses.replace(deployed, nodes=[node])
        ended = one.apply(best)
        if not ended:
            try:
                asked_as_the_gateway_asks(gateway, argv)
            except OperationError as failure:
                ended = str(failure)
        turn.restart_s = time.monotonic() - began
        if ended:
            back = one.apply(start_of(node.settings.tuning, space))
            if not back:
                give_back(gateway, argv, turn)
            raise OperationError(
                f"{name}: make tune: the best did not serve there ({ended}); "
                + ("put back on its flags as found and given back" if not back else
                   f"its flags as found did not start either ({back}); left out of "
                   f"{replicas.gateway}'s rotation")
                + "; the roll stopped there: the replicas after it keep their flags")
        write_tuned(Path(other.data.get("tuned_file")), text)
        give_back(gateway, argv, turn)
        logger.info(f"make tune: the best rolled to {turn_line(turn)}")


@contextmanager
def ctrl_c_stops(what: str) -> Iterator[None]:
    """Ctrl-C (SIGINT) during the block raises KeyboardInterrupt in this greenlet, where the
    drive puts the server on the best before the run ends: pyinfra's own handler would end the
    process at once, a kill (the next run finishes the search then). A second Ctrl-C is
    pyinfra's again."""
    me = gevent.getcurrent()
    previous = signal.getsignal(signal.SIGINT)

    def stop(signum, frame) -> None:
        signal.signal(signal.SIGINT, previous)
        logger.warning(f"{what}: Ctrl-C: putting the server on the best measured (Ctrl-C "
                       "again ends the run now; the next run would do it)")
        gevent.kill(me, KeyboardInterrupt)  # scheduled: raised in it when it next runs

    signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
