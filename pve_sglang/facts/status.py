"""``make status``'s one read of a container (``remote/status_read.py``, sent with its
companion as ``python -c``: nothing uploaded, nothing changed): one command per container."""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang import remote
from pve_sglang.facts.container import UnitState
from pve_sglang.runtime.pyinfra_private import joined

_PROGRAM = remote.piped(remote.STATUS_READ)


class ContainerStatus(FactBase[dict]):
    """
    Returns what ``remote/status_read.py`` prints for ARGS (a dict: its keys there), run by
    PYTHON (the sglang venv's, whose ``prometheus_client`` parses /metrics) or, where that is
    not there, the container's ``python3``; ``unit`` comes parsed as ``UnitState`` gives it.
    ``{"error": why}`` when no Python answered with one JSON object.
    """

    @override
    def command(self, python: str, args: dict) -> StringCommand:
        return joined("p=", QuoteString(python), '; [ -x "$p" ] || p=python3; "$p" -c ',
                      QuoteString(_PROGRAM), " ", QuoteString(json.dumps(args, sort_keys=True)),
                      " 2>&1; true")

    @staticmethod
    @override
    def default() -> dict:
        return {"error": "no answer"}

    @override
    def process(self, output: list[str]) -> dict:
        found = remote.json_objects(output)
        if not found:
            last = output[-1] if output else "no output"
            return {"error": f"the status read printed no JSON ({last[:200]})"}
        raw = found[-1]
        lines = unit if isinstance(unit := raw.get("unit"), list) else []
        return {**raw, "unit": UnitState().process([str(line) for line in lines])}
