"""Facts of a model fetched by ``model_fetch.py`` (beside this module): its plan (what a fetch
would do) and a running fetch's progress lines. Both run the uploaded script with a Python that has
huggingface_hub; the token is read from the env file by the script, never on a command line.
"""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang.remote import json_objects


def fetch_args(repo: str, root: str, flat: bool, link: str | None, env_file: str | None,
               revision: str | None, accept_unhashed: bool = False) -> list:
    """The arguments ``plan`` and ``fetch`` share, each quoted."""
    args: list = ["--repo", QuoteString(repo), "--root", QuoteString(root)]
    if flat:
        args.append("--flat")
    if accept_unhashed:
        args.append("--accept-unhashed")
    if link:
        args += ["--link", QuoteString(link)]
    if env_file:
        args += ["--env-file", QuoteString(env_file)]
    if revision:
        args += ["--revision", QuoteString(revision)]
    return args


#: Exits 0 when the Python that runs it has huggingface_hub.
HAS_CLIENT = "import importlib.util, sys; sys.exit(importlib.util.find_spec('huggingface_hub') is None)"


class ModelPlan(FactBase["dict | None"]):
    """
    Returns ``model_fetch.py plan``'s object for REPO at REVISION under ROOT: the commit, the
    recorded and the hub's commit, the files and bytes missing, the free space, whether it is
    complete; or ``{"error": {"kind", "message"}}``; ``{"unavailable": "script"}`` when SCRIPT
    did not run (not there yet), ``{"unavailable": "client"}`` when neither PYTHON nor FALLBACK imports
    huggingface_hub (both: what a run installs later, read by a plan); None when the script
    printed nothing.
    """

    @override
    def command(self, python: str, script: str, repo: str, revision: str | None, root: str,
                flat: bool, link: str | None, env_file: str | None,
                fallback: str | None = None, accept_unhashed: bool = False) -> StringCommand:
        args = fetch_args(repo, root, flat, link, env_file, revision, accept_unhashed)
        parts: list = []
        for py in [python] + ([fallback] if fallback else []):
            # find_spec, not an import: the check costs a Python start, not the client's import.
            # No test of SCRIPT first: Python's own failure to open it says so (and a command
            # that reaches the plan is the one a check of its quoting runs).
            parts += ["elif" if parts else "if", QuoteString(py), "-c", QuoteString(HAS_CLIENT),
                      "2>/dev/null; then", QuoteString(py), QuoteString(script), "plan", *args,
                      "|| echo", QuoteString('{"unavailable": "script"}'), ";"]
        parts += ["else echo", QuoteString('{"unavailable": "client"}'), "; fi"]
        return StringCommand(*parts)

    @override
    def process(self, output: list[str]) -> dict | None:
        objects = json_objects(output)
        # The script's own answer first: a plan that exits 1 with its error is followed by
        # the command's "unavailable" line, which must not hide it.
        answers = [value for value in objects if "unavailable" not in value] or objects
        return answers[-1] if answers else None


class ModelFetchLog(FactBase[dict]):
    """
    Returns ``{"lines": [dict, ...], "offset": int, "running": bool}``: a fetch's log lines
    after byte OFFSET, followed for up to MAX_WAIT seconds (at once on its last line), by
    ``model_fetch.py watch``.
    """

    @override
    def command(self, python: str, script: str, log: str, offset: int, max_wait: int) -> StringCommand:
        return StringCommand(QuoteString(python), QuoteString(script), "watch", "--log",
                             QuoteString(log), "--offset", str(int(offset)), "--max-wait",
                             str(int(max_wait)))

    @override
    def process(self, output: list[str]) -> dict:
        result: dict = {"lines": [], "offset": None, "running": False}
        for value in json_objects(output):
            if "offset" in value and "running" in value:
                result.update(offset=value["offset"], running=value["running"])
            else:
                result["lines"].append(value)
        return result


#: Between the marker and the file list in ``ModelMarker``'s output.
FILES_FOLLOW = "--- pve-sglang: files ---"


class ModelMarker(FactBase[dict]):
    """Returns ``{"marker": dict | None, "sizes": {name: bytes}}``: the marker ``model_fetch.py``
    writes last into a verified model folder (``repo``, ``commit``, ``files``, ``bytes``,
    ``sizes``, ``verified_at``; None when PATH has none) and the size of each file under PATH
    (but the fetcher's ``.cache``), so that a file gone since the marker is seen."""

    @override
    def command(self, path: str, marker: str) -> StringCommand:
        root = QuoteString(path.rstrip("/") or "/")
        return StringCommand("cat", QuoteString(f"{path.rstrip('/')}/{marker}"), "2>/dev/null;",
                             "echo; echo", QuoteString(FILES_FOLLOW), "; cd", root,
                             "2>/dev/null && find . -path ./.cache -prune -o -type f -printf",
                             QuoteString("%s %P\\n"), "2>/dev/null || true")

    @override
    def process(self, output: list[str]) -> dict:
        cut = output.index(FILES_FOLLOW) if FILES_FOLLOW in output else len(output)
        try:
            marker = json.loads("\n".join(output[:cut]))
        except ValueError:
            marker = None
        sizes = {}
        for line in output[cut + 1:]:
            size, _, name = line.partition(" ")
            if size.isdigit() and name:
                sizes[name] = int(size)
        return {"marker": marker if isinstance(marker, dict) else None, "sizes": sizes}


class HubClientVersion(FactBase["str | None"]):
    """Returns the huggingface_hub version PYTHON imports, or None (no such Python, or no
    huggingface_hub in it)."""

    @override
    def command(self, python: str) -> StringCommand:
        return StringCommand("[ -x", QuoteString(python), "] &&", QuoteString(python), "-c",
                             QuoteString("import huggingface_hub as h; print(h.__version__)"),
                             "2>/dev/null || true")

    @override
    def process(self, output: list[str]) -> str | None:
        lines = [line.strip() for line in output if line.strip()]
        return lines[-1] if lines else None
