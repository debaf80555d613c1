"""The deployed server as a search's ``Server`` (``tuning.drive``): a try applied as the deploy
applies flags, measured with the deploy's own benchmark.

At execution, on each node of the model (one container, or every container of a multi-node
group, tuned as one: pyinfra's ``host`` switched to each in turn):

- ``apply`` renders the candidate's settings with the deploy's own ``server_files`` (the unit
  the container phase writes, byte for byte, so that a ``make deploy`` after the search finds
  nothing to change), writes the unit whole on every node (uploaded beside it, then renamed),
  reloads systemd, then restarts every node once; each start is followed through the startup
  watch (``verify.watch_start``: the journal, the hints, the stall), the first node's judged by
  the generation check (``verify.generation_answers``), and how it ended is the drive's
  ``ending_of`` words;
- ``measure`` runs the verify phase's benchmark in the first node at the objective's
  concurrency (or a try's ``tune_concurrency``: no restart for it), a share of its prompts,
  under the record wrapper, the GPU sampler and the server metrics sampler
  (``verify.benchmark_row``), within a time limit (``timeout``: a hung server ends the part):
  the row the strategy reads its signals from.

Before any restart, ``refused_flags`` checks the flags of every value of the space against the
container's installed release (``SglangServerFlags``, read from its own ``server_args.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from io import StringIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.context import ctx_host

from pve_sglang.config.settings import ContainerSettings, ServerView
from pve_sglang.server.addresses import base_url, client_address
from pve_sglang.facts.container import SglangServerFlags
from pve_sglang.operations import paths, verify
from pve_sglang.server.bench import bench_runs
from pve_sglang.server.command import check_flags, venv_python
from pve_sglang.server.unit_text import env_file_path, unit_name, unit_path
from pve_sglang.server.render import server_files
from pve_sglang.tuning.drive import Server, ending_of
from pve_sglang.tuning.space import Candidate


def tried(settings: ContainerSettings, candidate: Candidate) -> ContainerSettings:
    """SETTINGS with CANDIDATE's values, checked by the settings' own rules (as the tuned file's
    values are when the deploy reads them): the settings whole, as those rules read them."""
    return ContainerSettings.model_validate({**settings.model_dump(), **candidate})


def space_candidates(start: Candidate, space: dict[str, tuple]) -> list[Candidate]:
    """START with each value of each coordinate in turn: every flag spelling the space can
    render, one candidate per value (not the grid)."""
    return [dict(start, **{name: value}) for name, values in space.items() for value in values]


def refused_flags(name: str, settings: ContainerSettings, gpus: list[dict],
                  inventory: Inventory, start: Candidate, space: dict[str, tuple],
                  known: set[str]) -> list[str]:
    """Why each value of SPACE that container NAME's installed release (KNOWN: its flags)
    cannot take is refused: ``coordinate=value: the release's words``; [] when every value
    renders and parses. SETTINGS whole: each value is checked on them by their own rules
    (``tried``) before its server is rendered."""
    refused = []
    for candidate in space_candidates(start, space):
        moved = ", ".join(f"{k}={v!r}" for k, v in candidate.items() if start.get(k) != v)
        try:
            files = server_files(name, tried(settings, candidate).server, gpus, inventory)
            check_flags(list(files.argv), known)
        except ValueError as error:
            refused.append(f"{moved or 'the server as found'}: {error}")
    return refused


@dataclass
class Node:
    """A container serving the model: its pyinfra host, its settings as found (tuned file
    included) and the host's GPUs it has. A model served by a multi-node group has one a node,
    the first (rank 0) the one that answers HTTP requests and is measured."""

    host: Host
    settings: ContainerSettings
    gpus: list[dict]


@dataclass
class Deployed:
    """A model's deployed server, for the search: its nodes, the scripts uploaded in each (the
    verify phase's), and the concurrency measured."""

    nodes: list[Node]
    inventory: Inventory
    watch: str
    sampler: str
    recorder: str
    scraper: str | None
    level: int

    @property
    def first(self) -> Node:
        return self.nodes[0]

    def url(self, node: Node) -> str:
        return base_url(client_address(node.settings.server_host), node.settings.server_port)

    def server(self) -> Server:
        return Server(apply=self.apply, measure=self.measure)

    def apply(self, candidate: Candidate) -> str:
        """CANDIDATE's unit written on every node, then every node restarted once (a group's
        ranks start together); "" when the first serves, else how a start ended
        (``drive.ending_of``)."""
        tried_on = [(node, tried(node.settings, candidate)) for node in self.nodes]
        for node, cs in tried_on:
            with ctx_host.use(node.host):
                self._write_unit(node, cs.server)
        for node, cs in tried_on:
            with ctx_host.use(node.host):
                if not host.run_shell_command(StringCommand(
                        "systemctl", "restart", QuoteString(unit_name(cs.server))))[0]:
                    raise OperationError(f"{host.name}: make tune: could not restart "
                                         f"{unit_name(cs.server)} for {candidate}")
        for node, cs in tried_on:
            with ctx_host.use(node.host):
                try:
                    self.follow_start(node, cs.server, cs.startup_stall_s)
                except OperationError as failure:
                    words = str(failure)
                    logger.warning(f"{host.name}: make tune: {words.splitlines()[0]}")
                    return ending_of(words.splitlines(), stalled=" is stuck: " in words,
                                     answer=None)
        node, cs = tried_on[0]
        with ctx_host.use(node.host):
            try:
                verify.generation_answers(self.url(node), env_file_path(cs.server), self.watch, 48,
                                          cs.generation_timeout_s)
            except OperationError as failure:
                logger.warning(f"{host.name}: make tune: {failure}")
                return "degenerate" if "degenerate" in str(failure) else "start"
        return ""

    def follow_start(self, node: Node, server: ServerView, stall_s: int) -> None:
        """NODE's start of SERVER followed until it serves, as the verify phase follows it
        (``verify.watch_start``, with pyinfra's ``host`` NODE; STALL_S: ``startup_stall_s``);
        raises ``OperationError``."""
        verify.watch_start(unit_name(server), f"{self.url(node)}/health", env_file_path(server),
                           self.watch, server.health_timeout_s, stall_s)

    def _write_unit(self, node: Node, server: ServerView) -> None:
        """NODE's unit for SERVER, as the container phase renders it, written whole; systemd
        told."""
        path = unit_path(server)
        text = server_files(node.host.name, server, node.gpus, self.inventory).unit
        uploaded = host.put_file(StringIO(text), path,
                                 remote_temp_filename=host.get_temp_filename(path))
        paths.forget(path)
        if not (uploaded and host.run_shell_command(StringCommand(
                "chmod", "644", QuoteString(path), "&&", "systemctl", "daemon-reload"))[0]):
            raise OperationError(f"{host.name}: make tune: could not write {path}")

    def measure(self, length: float, limit_s: float, level: int) -> dict[str, Any]:
        """The benchmark at concurrency LEVEL (the objective's, or a try's ``tune_concurrency``)
        against the first node, LENGTH of its prompts, ended (its process group killed,
        coreutils' ``timeout``) after LIMIT_S: its row; without an objective where it failed or
        ran past the limit (a hung server)."""
        node = self.first
        cs = node.settings
        python = venv_python(cs.server)
        [argv] = bench_runs(cs.benchmark, python, client_address(cs.server_host), cs.sglang_version,
                            self.sampler, self.recorder, self.scraper, levels=[level],
                            share=length).values()
        limited = ["timeout", "--kill-after=30", f"{max(1, int(limit_s))}", *argv]
        with ctx_host.use(node.host):
            try:
                return verify.benchmark_row(level, limited, env_file_path(cs.server))
            except OperationError as failure:
                words = str(failure).splitlines()[0]
                if "status 124" in words or "status 137" in words:
                    words = f"the benchmark ran past its limit of {limit_s:.0f} s (hung?)"
                logger.warning(f"{host.name}: make tune: {words}")
                return {"concurrency": level}  # no objective: the part failed


def installed_flags(server: ServerView, lister: str) -> set[str]:
    """The flags the container's installed sglang knows (its own ``server_args.py``, read by
    the uploaded flag lister at LISTER)."""
    known = host.get_fact(SglangServerFlags, python=venv_python(server), script=lister)
    if known is None:
        raise OperationError(f"{host.name}: make tune: no sglang in {server.venv_path}: "
                             "run `make deploy` first")
    return known
