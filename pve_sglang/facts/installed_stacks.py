"""The stacks installed in a container (``pve_sglang.stack.switch_rules``): what ``venv_path``
is, the complete stacks beside it, and the deploy's record of them, in one read."""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang.remote.venv_state import INSTALL_MARKER
from pve_sglang.runtime.pyinfra_private import joined
from pve_sglang.stack import switch_rules


class Stacks(FactBase[dict]):
    """
    Returns ``{"kind": "link"|"plain"|"missing"|"other", "target": the link's text,
    "plain_lock": the lock id of a plain venv's last complete install (its LOCK_FILE's digest),
    "plain_sglang": the sglang version a plain venv holds, "stacks": {id: {"mtime": seconds,
    **its release file}}, "state": the state record (``{}`` when none)}``.
    """

    @override
    def command(self, venv_path: str, lock_file: str, state: str) -> StringCommand:
        v, d = QuoteString(venv_path.rstrip("/")), QuoteString(switch_rules.stacks_dir(venv_path))
        lock, record = QuoteString(lock_file), QuoteString(state)
        marker, release = QuoteString(INSTALL_MARKER), QuoteString(switch_rules.RELEASE_FILE)
        return joined(
            "v=", v, "; d=", d, "; l=", lock, "; s=", record, "; m=", marker, "; r=", release,
            '; if [ -L "$v" ]; then printf \'link|%s\\n\' "$(readlink "$v")"; '
            'elif [ -d "$v" ]; then echo "plain|"; '
            'if [ -f "$v/pyvenv.cfg" ] && [ ! -e "$v/$m" ]; then '
            '[ ! -f "$l" ] || printf \'plainlock|%s\\n\' "$(sha256sum < "$l" | cut -c1-16)"; '
            'for p in "$v"/lib/python*/site-packages/sglang-*.dist-info; do '
            '[ -d "$p" ] && printf \'plainsglang|%s\\n\' "$(basename "$p" .dist-info)"; done; fi; '
            'elif [ -e "$v" ]; then echo "other|"; else echo "missing|"; fi; '
            'for p in "$d"/*; do [ -f "$p/$r" ] || continue; '
            'printf \'stack|%s|%s|%s\\n\' "$(basename "$p")" "$(stat -c %Y "$p")" '
            '"$(tr -d \'\\n\' < "$p/$r")"; done; '
            '[ ! -f "$s" ] || printf \'state|%s\\n\' "$(tr -d \'\\n\' < "$s")"; true',
        )

    @staticmethod
    @override
    def default() -> dict:
        return {"kind": "missing", "stacks": {}, "state": {}}

    @override
    def process(self, output: list[str]) -> dict:
        found: dict = {"kind": "missing", "target": None, "plain_lock": None,
                       "plain_sglang": None, "stacks": {}, "state": {}}
        for line in output:
            what, _, rest = line.rstrip("\n").partition("|")
            if what in ("link", "plain", "missing", "other"):
                found["kind"], found["target"] = what, rest or None
            elif what == "plainlock":
                found["plain_lock"] = rest
            elif what == "plainsglang":
                found["plain_sglang"] = rest.removeprefix("sglang-")
            elif what == "stack":
                name, _, rest = rest.partition("|")
                mtime, _, text = rest.partition("|")
                if switch_rules.STACK_NAME.match(name):
                    found["stacks"][name] = {**_json(text), "mtime": float(mtime or 0)}
            elif what == "state":
                found["state"] = _json(rest)
        return found


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
