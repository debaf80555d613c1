"""The tuned file: the best flags a search measured for one container, kept where the deploy
reads them.

``<tune_dir>/<host>-<container>.yml`` on the machine running pyinfra (``tune_dir`` relative to
the directory pyinfra runs in, as ``bench_history_dir``): a YAML mapping of the search's
settings (``space.COORDINATES``) to their values, under comments saying what was measured. The
hosts file places it under the container's own entry: the host's container settings < the
tuned file < the container's own entry < ``--data`` (``hosts_file._validated_container``), so
what the user wrote for that container always wins, and a ``make deploy`` right after a search
renders the flags the search left the server on.

The file is read back as untrusted input: a mapping, only the search's settings, each value
checked by its setting's own rule (``space.check_value``); anything else is a ``TunedFileError``
naming the file, the key and the value.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pve_sglang.tuning.space import COORDINATES, SpaceError, check_value


class TunedFileError(ValueError):
    """A tuned file that is not what the search writes: names the file, the key, the value."""


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip(".") or "_"


def tuned_path(tune_dir: str, host: str, container: str) -> Path:
    """Where the tuned file of CONTAINER (its vmid or name) on HOST (the hosts file's name) is."""
    return Path(tune_dir) / f"{_safe(host)}-{_safe(str(container))}.yml"


def read_tuned(path: Path) -> dict[str, Any]:
    """The settings of the tuned file at PATH, checked; {} where there is none."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise TunedFileError(f"tuned file {path}: cannot be read: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TunedFileError(f"tuned file {path}: not YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TunedFileError(f"tuned file {path}: a {type(data).__name__}; expected a mapping "
                             f"of settings ({', '.join(COORDINATES)}) to values")
    out = {}
    for name, value in data.items():
        try:
            out[name] = check_value(str(name), value)
        except SpaceError as error:
            why = str(error).removeprefix("tune_space: ")
            raise TunedFileError(f"tuned file {path}: {why}; write `make tune` again or "
                                 "remove the file") from None
    return out


def render_tuned(best: Mapping[str, Any], notes: list[str]) -> str:
    """The tuned file's text: NOTES as comments, then BEST as YAML (null: SGLang's own)."""
    for name, value in best.items():
        check_value(name, value)
    head = "".join(f"# {line}\n" for note in notes for line in note.splitlines())
    return head + yaml.safe_dump(dict(best), sort_keys=False, default_flow_style=False)


def write_tuned(path: Path, text: str) -> None:
    """Write TEXT to PATH whole or not at all (a kill mid-write leaves the old file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
