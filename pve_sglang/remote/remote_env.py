"""Read a value from the env file the deploy writes (a systemd ``EnvironmentFile``, mode 0600):
the scripts that need a secret (``model_fetch.py``: ``HF_TOKEN``; ``startup_watch.py``:
``SGLANG_API_KEY``) read it here, so it never goes on a command line.

Stand-alone (stdlib only): uploaded beside the scripts that import it (``remote.COMPANIONS``).
"""

from __future__ import annotations

import re


def env_value(env_file: str | None, name: str) -> str | None:
    """NAME's value in a systemd EnvironmentFile written by the deploy (``NAME="value"``, with
    ``\\`` escapes), or None."""
    if not env_file:
        return None
    try:
        with open(env_file, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            return value or None
    return None
