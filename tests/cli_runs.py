"""The real ``pyinfra`` CLI for tests, run many times without paying its start-up each time.

``PyinfraCli`` sends each run to one ``pyinfra_forkserver.py`` (an interpreter that imported
the CLI once and forks a fresh child per run, exactly as the console script runs);
``PVE_SGLANG_TEST_CLI=subprocess`` starts the ``pyinfra`` console script for every run
instead. The suite's fixture ``pyinfra_cli`` (conftest) gives one per test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"


class PyinfraCli:
    """``cli(*args, env=...)``: ``pyinfra ARGS`` in the repository, as a CompletedProcess."""

    def __init__(self, tmp_dir: Path):
        self.tmp_dir = tmp_dir
        self.server = None
        if os.environ.get("PVE_SGLANG_TEST_CLI") != "subprocess":
            self.server = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("pyinfra_forkserver.py"))],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )

    def __call__(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        argv = ["pyinfra", *args]
        environ = {**os.environ, **(env or {})}
        if self.server is None:
            return subprocess.run([str(PYINFRA), *args], cwd=REPO, env=environ,
                                  capture_output=True, text=True, timeout=120)
        run_dir = Path(tempfile.mkdtemp(dir=self.tmp_dir))
        out, err = run_dir / "stdout", run_dir / "stderr"
        job = {"argv": argv, "env": environ, "cwd": str(REPO), "stdout": str(out),
               "stderr": str(err)}
        self.server.stdin.write(json.dumps(job) + "\n")
        self.server.stdin.flush()
        rc = json.loads(self.server.stdout.readline())["rc"]
        return subprocess.CompletedProcess(argv, rc, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

    def close(self) -> None:
        if self.server is not None:
            self.server.stdin.close()
            self.server.wait(timeout=30)


def changed(results: dict) -> list[str]:
    """The operations a run's JSON results (``--json``'s ``results``) say changed something."""
    return [op["name"] for op in results["results"]["operations"] if op["success"]]


def failed(results: dict) -> list[str]:
    """The operations a run's JSON results say failed."""
    return [op["name"] for op in results["results"]["operations"] if op["error"]]
