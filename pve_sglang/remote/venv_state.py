"""Print, as one JSON object, the state of the venv whose Python runs this (one Python start).

    python -c "$(cat venv_state.py)" AUTOTUNE_PATCH_SCRIPT

``packages``: ``{name: version}`` of every installed distribution; ``python``: its version
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

#: In the venv while ``uv pip install`` runs (operations/stack.py): an install cut short.
INSTALL_MARKER = ".pve-sglang-install-incomplete"


def main(patch_script):
    out = {"packages": {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()},
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
