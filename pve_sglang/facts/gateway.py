"""Facts of a gateway's container: the smg venv's packages, the gateway's worker list."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang.remote import json_objects

#: One Python start: every installed distribution's version, as JSON.
_PACKAGES = ("import importlib.metadata as m, json; print(json.dumps({d.metadata['Name'].lower()"
             ".replace('_', '-'): d.version for d in m.distributions()}))")


class SmgVenvPackages(FactBase["dict[str, str] | None"]):
    """Returns ``{name: version}`` of the venv whose Python is PYTHON (names normalised as a
    lock writes them), or None where it has no Python yet."""

    @override
    def command(self, python: str) -> StringCommand:
        return StringCommand("if [ -x", QuoteString(python), "]; then", QuoteString(python),
                             "-c", QuoteString(_PACKAGES), "; fi")

    @override
    def process(self, output: list[str]) -> dict[str, str] | None:
        found = json_objects(output)
        return {str(k): str(v) for k, v in found[0].items()} if found else None

    @staticmethod
    @override
    def default() -> None:
        return None


class GatewayWorkers(FactBase[dict]):
    """Returns the gateway's workers as ``remote/gateway_workers.py status`` prints them
    (``{"workers": [{url, is_healthy, status}], "registered", "pending", "keys_current"}``), or
    ``{"error": ...}`` when the gateway does not answer. ARGV: the script's status command line
    (no secret: keys come from files). Also each worker's answer to one generation:
    ``check``'s command line (``{"workers": [{name, url, ok, why, ...}]}``)."""

    @override
    def command(self, argv: list[str]) -> StringCommand:
        return StringCommand(*(QuoteString(arg) for arg in argv), "|| true")

    @override
    def process(self, output: list[str]) -> dict:
        found = json_objects(output)
        return found[-1] if found else {"error": "no answer from the worker script"}

    @staticmethod
    @override
    def default() -> dict:
        return {"error": "no answer from the worker script"}
