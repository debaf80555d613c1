"""Print, as one JSON object, the state of the venv whose Python runs this (one Python start).

    python -c "$(cat venv_state.py)" AUTOTUNE_PATCH_SCRIPT

``packages``: ``{name: version}`` of every installed distribution (the first on ``sys.path``:
the one imported); ``in_venv``: those of them in the venv's own site-packages (not the host's
shared layer, which a ``.pth`` adds); ``python``: its version
(``3.11``); ``incomplete``: an install was
cut short (``INSTALL_MARKER`` in the venv); ``patch``: what ``AUTOTUNE_PATCH_SCRIPT --check``
printed, run in-process (runpy), when sglang and the script are there. The ``SglangVenv`` fact
sends this file's text with ``python -c``: it is read before anything is uploaded.
"""

import contextlib
import importlib.util
import io
import json
import os
import re
import runpy
import sys
import sysconfig

#: In the venv while ``uv pip install`` runs (operations/venv.py): an install cut short.
INSTALL_MARKER = ".pve-sglang-install-incomplete"


def headers(path):
    """The ``Name: value`` headers of a core metadata file, names lowercased, the first of
    each: what ``email`` gives ``importlib.metadata`` of it. None when it cannot be read."""
    found: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the headers
                if line[0] in " \t":
                    continue  # a folded line: Name and Version never are
                key, colon, value = line.partition(":")
                if not colon:
                    break  # not a header: email ends the headers there too
                found.setdefault(key.lower(), value.lstrip(" \t").rstrip("\r\n"))
    except OSError:
        return None
    return found


def distributions():
    """``(name, version, directory)`` of each distribution in the order importlib.metadata
    finds them (sys.path, then each entry's ``*.dist-info`` / ``*.egg-info``, grouped by
    name), from their metadata headers: importing importlib.metadata would be a third of
    this script's start, in every container of every run."""
    for entry in sys.path:
        directory = entry or "."
        try:
            children = os.listdir(directory)
        except OSError:  # missing, or a file (a zip: no distributions in ours)
            continue
        groups: dict[str, list[str]] = {}
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                name = low.rpartition(".")[0].partition("-")[0]
                groups.setdefault(re.sub(r"[-_.]+", "_", name), []).append(child)
        for child in (c for group in groups.values() for c in group):
            meta = os.path.join(directory, child)
            if os.path.isdir(meta):
                found = headers(os.path.join(meta, "METADATA"))
                if found is None:
                    found = headers(os.path.join(meta, "PKG-INFO"))
            else:
                found = headers(meta)
            if found is not None:  # no metadata file: not a distribution (a cut install)
                yield found.get("name"), found.get("version"), directory


def main(patch_script):
    packages, in_venv = {}, []
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    for name, version, directory in distributions():
        # The first on sys.path is the one imported: a venv's own copy before the shared layer.
        if name not in packages:
            packages[name] = version
            if os.path.realpath(directory) == site:
                in_venv.append(name)
    out = {"packages": packages, "in_venv": in_venv,
           "incomplete": os.path.exists(os.path.join(sys.prefix, INSTALL_MARKER)),
           "python": "%d.%d" % sys.version_info[:2]}
    spec = importlib.util.find_spec("sglang")
    if spec and spec.submodule_search_locations and os.path.exists(patch_script):
        package = list(spec.submodule_search_locations)[0]
        buf = io.StringIO()
        sys.argv = [patch_script, "--check", package]
        try:
            with contextlib.redirect_stdout(buf):
                runpy.run_path(patch_script, run_name="__main__")
        except SystemExit:
            pass
        out["patch"] = buf.getvalue()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
