"""Installed by ``gpu_serve.py`` as ``sitecustomize.py`` in the kit's venv on the device
machine: every process of that venv's Python (the server's ranks, the benchmark) appends each
top-level module it imports to ``/tmp/kit/imports/<pid>.txt``, once. What the start touched,
read back after it (``gpu_serve.imports``): the evidence for the kit's trim."""

import os
import sys

FOLDER = "/tmp/kit/imports"


class _Recorder:
    def __init__(self) -> None:
        self.seen: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in self.seen:
            self.seen.add(top)
            try:
                os.makedirs(FOLDER, exist_ok=True)
                with open(f"{FOLDER}/{os.getpid()}.txt", "a") as handle:
                    handle.write(top + "\n")
            except OSError:
                pass
        return None  # the import goes on as it would


sys.meta_path.insert(0, _Recorder())
