"""Read-only checks of a running GPU container: GPUs, CUDA, the server's health, a benchmark.

Checks are facts, not commands, so a verified, converged deploy reports no change.
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


class VisibleGpus(FactBase[list[str]]):
    """Returns ``nvidia-smi -L`` lines in the container (``[]`` without nvidia-smi or GPUs)."""

    @override
    def command(self) -> str:
        return "nvidia-smi -L 2>/dev/null || true"

    @staticmethod
    @override
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.startswith("GPU ")]


class HttpStatus(FactBase["int | None"]):
    """
    Returns the HTTP status of a GET of URL from inside the container (None: no answer), with
    the server's API key from ENV_FILE when it sets one.

    The key is read by the shell (not exported) and reaches curl on its standard input as a
    header (``-H @-``, printed by the shell's builtin ``printf``), so it is in no process's argv
    or environment, and the command itself holds only the variable's name.
    """

    @override
    def command(self, url: str, env_file: str) -> StringCommand:
        env = QuoteString(env_file)
        return StringCommand(
            "[ -r", env, "] && .", StringCommand(env, ";", _separator=""),
            'if [ -n "${SGLANG_API_KEY:-}" ]; then '
            "printf 'Authorization: Bearer %s\\n' \"$SGLANG_API_KEY\"; fi | "
            "curl -s -o /dev/null -m 10 -w '%{http_code}' -H @-",
            QuoteString(url), "|| true",
        )

    @override
    def process(self, output: list[str]) -> int | None:
        code = "".join(output).strip()
        return int(code) if code.isdigit() and code != "000" else None
