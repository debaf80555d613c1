"""Read a value from the env file the deploy writes (a systemd ``EnvironmentFile``, mode 0600):
the scripts that need a secret (``model_fetch.py``: ``HF_TOKEN``; ``startup_watch.py``:
``SGLANG_API_KEY``) read it here, so it never goes on a command line.

Stand-alone (stdlib only): uploaded beside the scripts that import it (``remote.COMPANIONS``).
"""

from __future__ import annotations

import re


def env_values(text: str) -> dict[str, str]:
    """Each ``NAME="value"`` of an EnvironmentFile's TEXT (``\\`` escapes undone; the first of
    a name that stands twice)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            values.setdefault(key, value)
    return values


def env_value(env_file: str | None, name: str) -> str | None:
    """NAME's value in a systemd EnvironmentFile written by the deploy (``NAME="value"``, with
    ``\\`` escapes), or None."""
    if not env_file:
        return None
    try:
        with open(env_file, encoding="utf-8") as handle:
            return env_values(handle.read()).get(name) or None
    except OSError:
        return None
