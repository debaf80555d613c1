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
import importlib.metadata
import importlib.util
import io
import json
import os
import runpy
import sys
import sysconfig

#: In the venv while ``uv pip install`` runs (operations/stack.py): an install cut short.
INSTALL_MARKER = ".pve-sglang-install-incomplete"


def main(patch_script):
    packages, in_venv = {}, []
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        # The first on sys.path is the one imported: a venv's own copy before the shared layer.
        if name not in packages:
            packages[name] = dist.version
            if os.path.realpath(str(dist.locate_file(""))) == site:
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
