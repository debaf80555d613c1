"""Read-only checks of a running GPU container: GPUs, CUDA, the server's health, a benchmark.

Checks are facts, not commands, so a verified, converged deploy reports no change.
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang.remote import json_objects
from pve_sglang.runtime.pyinfra_private import joined


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
            "[ -r", env, "] && .", joined(env, ";"),
            'if [ -n "${SGLANG_API_KEY:-}" ]; then '
            "printf 'Authorization: Bearer %s\\n' \"$SGLANG_API_KEY\"; fi | "
            "curl -s -o /dev/null -m 10 -w '%{http_code}' -H @-",
            QuoteString(url), "|| true",
        )

    @override
    def process(self, output: list[str]) -> int | None:
        code = "".join(output).strip()
        return int(code) if code.isdigit() and code != "000" else None


class StartupWatch(FactBase[dict]):
    """
    Returns ``{"lines": [(seconds, text), ...], "state": {...}, "cursor": str, "health": int |
    None, "now": seconds}``: the journal lines of UNIT since its start at START (microseconds)
    or after CURSOR, followed for up to MAX_WAIT seconds by ``remote/startup_watch.py watch``
    (SCRIPT), which returns at once when a line matches one of RETURN_ON, the unit stops
    running that start, or HEALTH_URL answers 200 (the key from ENV_FILE, read by the script).
    """

    @override
    def command(self, script: str, unit: str, start: int, cursor: str, health_url: str,
                env_file: str, max_wait: int, return_on: tuple[str, ...] = ()) -> StringCommand:
        args = ["python3", QuoteString(script), "watch", "--unit", QuoteString(unit),
                "--start", str(int(start)), "--max-wait", str(int(max_wait)),
                "--health-url", QuoteString(health_url), "--env-file", QuoteString(env_file)]
        if cursor:
            args += ["--cursor", QuoteString(cursor)]
        for pattern in return_on:
            args += ["--return-on", QuoteString(pattern)]
        return StringCommand(*args)

    @override
    def process(self, output: list[str]) -> dict:
        result: dict = {"lines": [], "state": {}, "cursor": "", "health": None, "now": None}
        for value in json_objects(output):
            if "m" in value:
                result["lines"].append((value.get("t", 0) / 1e6, str(value["m"])))
            elif "state" in value:
                result.update(state=value["state"] or {}, cursor=value.get("cursor") or "",
                              health=value.get("health"), now=(value.get("now") or 0) / 1e6)
        return result


class JournalTail(FactBase[list[str]]):
    """Returns the last LINES journal lines of UNIT (since SINCE, microseconds, when given)."""

    @override
    def command(self, unit: str, since: int | None = None, lines: int = 200) -> StringCommand:
        window = ["--since", f"@{since / 1e6:.6f}"] if since else ["-b"]
        return StringCommand("journalctl -u", QuoteString(unit), *window, "-n", str(int(lines)),
                             "-o cat --no-pager 2>/dev/null || true")

    @staticmethod
    @override
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        return list(output)


class StartTimes(FactBase[list[str]]):
    """Returns UNIT's journal lines (``journalctl -o short-unix``: the time first) that tell
    its starts: systemd's ``Started`` lines and the server's ready line (READY), the last
    LINES of them; [] where there is no journal (``tuning.plan.start_seconds`` reads them)."""

    @override
    def command(self, unit: str, ready: str, lines: int = 40) -> StringCommand:
        return StringCommand("journalctl -u", QuoteString(unit), "-o short-unix --no-pager",
                             "2>/dev/null | grep -F -e 'Started ' -e", QuoteString(ready),
                             "| tail -n", str(int(lines)), "|| true")

    @staticmethod
    @override
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        return list(output)


class GenerationCheck(FactBase["dict | None"]):
    """Returns one streamed chat completion from the server at URL, asked by
    ``remote/startup_watch.py generate`` (SCRIPT) with the key from ENV_FILE, the whole answer
    within TIMEOUT_S: ``{"status", "text", "tokens", "ttft_s", "elapsed_s", "logprobs", "model",
    "error", "timed_out"}``."""

    @override
    def command(self, script: str, url: str, env_file: str, max_tokens: int = 48,
                timeout_s: int = 60) -> StringCommand:
        return StringCommand("python3", QuoteString(script), "generate", "--url", QuoteString(url),
                             "--env-file", QuoteString(env_file), "--max-tokens", str(int(max_tokens)),
                             "--timeout", str(int(timeout_s)))

    @override
    def process(self, output: list[str]) -> dict | None:
        found = json_objects(output)
        return found[-1] if found else None
