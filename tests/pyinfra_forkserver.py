"""Run the real ``pyinfra`` CLI many times without paying its start-up each time.

Started once (``python tests/pyinfra_forkserver.py``), it imports the CLI and this project's
modules, then reads one JSON job per line on stdin (``argv``, ``env``, ``cwd``, ``stdout``,
``stderr``: file paths) and answers one JSON line ``{"rc": N}``. Each job runs in a forked child
exactly as the ``pyinfra`` console script does (``pyinfra_cli.main.main()`` with that argv,
environment and working directory, stdout and stderr sent to the files), so every run starts from
the same freshly imported state and nothing of one run leaks into the next.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Not this directory: the console script's sys.path has no tests/ in it.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [path for path in sys.path if os.path.abspath(path or ".") != HERE]

from pyinfra_cli.main import main  # noqa: E402 (patches the stdlib for gevent, as the CLI does)

import pve_sglang.hosts_file  # noqa: E402,F401 (imported once: pydantic, yaml, the connectors)

TIMEOUT_S = 120


def _child(job: dict) -> None:
    """Become ``pyinfra ARGV`` (never returns)."""
    code = 1
    try:
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        for fd, path in ((0, os.devnull), (1, job["stdout"]), (2, job["stderr"])):
            flags = os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            target = os.open(path, flags, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = list(job["argv"])
        try:
            main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(job: dict) -> int:
    pid = os.fork()
    if pid == 0:
        _child(job)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.01)


def serve() -> None:
    """Answer jobs until stdin closes."""
    for line in sys.stdin:
        if line.strip():
            rc = _run(json.loads(line))
            sys.stdout.write(json.dumps({"rc": rc}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    serve()
