"""Benchmark record: run SGLang's serving benchmark with its JSONL record in a private file,
print the record's results, remove the file.

    python3 bench_record.py -- COMMAND [ARG...]

COMMAND (``python -m sglang.bench_serving ...``) gets ``--output-file PATH`` appended. Without
it the benchmark appends its record to ``sglang_MMDD_<prompts>_<in>_<out>.jsonl`` in its working
directory, world-readable (0.5.9 ``bench_serving.py`` and 0.5.23 ``benchmark/serving.py``
alike), and the record holds ``server_info``: the server's ``/get_server_info`` (``/server_info``)
answer, the whole ServerArgs, ``api_key`` included. PATH is a file made 0600 in a directory made
0700 (``tempfile``), removed with it once COMMAND has ended, whatever happened (COMMAND failed,
this script was interrupted or terminated); a directory a killed run left (its process gone) is
removed by the next run.

COMMAND's output passes through as it is; when it has ended, one more line follows:
``BENCH_RECORD_JSON {...}``, the record's numbers and a few of its strings (``kept``), never
``server_info`` nor any other nested value. No such line when COMMAND wrote no record. The exit
status is COMMAND's.

Standard library only: the deploy uploads this file as it is and runs it with the container's
Python; the deploy's side imports ``kept`` from it, and reads the record line with
``remote.marked_json``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

RECORD_PREFIX = "BENCH_RECORD_JSON "
OUTPUT_FLAG = "--output-file"
#: Prefix of the private directories, followed by the pid of the run that made it.
DIR_PREFIX = "pvs-bench-record-"
#: The record's strings that are kept (arguments of the run); every other value kept is a number.
KEPT_STRINGS = ("backend", "dataset_name", "request_rate", "tag")


def kept(record: dict) -> dict:
    """RECORD's top-level numbers and ``KEPT_STRINGS``: what the deploy reads, and nothing that
    can hold a secret (``server_info`` is a mapping; so are future blocks such as
    ``cache_report``)."""
    out = {}
    for key, value in record.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) or value is None or (
                key in KEPT_STRINGS and isinstance(value, str)):
            out[key] = value
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(tmp: str) -> None:
    """Remove the record directories in TMP whose run is gone (a killed run's)."""
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        pid = name[len(DIR_PREFIX):].split("-", 1)[0]
        if name.startswith(DIR_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def _read(path: str) -> dict | None:
    """The last record in PATH (the benchmark appends one line per run)."""
    try:
        with open(path) as handle:
            lines = [line for line in handle.read().splitlines() if line.strip()]
    except OSError:
        return None
    if not lines:
        return None
    try:
        record = json.loads(lines[-1])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _stop(_signum, _frame):
    raise SystemExit(128 + _signum)


def run(command: list[str], out=None, tmp: str | None = None) -> int:
    """Run COMMAND with a private record file (see the module's docstring); its exit status."""
    out = out or sys.stdout
    tmp = tmp or tempfile.gettempdir()
    sweep(tmp)
    folder = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=tmp)  # 0700
    proc = None
    try:
        path = os.path.join(folder, "record.jsonl")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, _stop)
        out.flush()
        try:
            proc = subprocess.Popen([*command, OUTPUT_FLAG, path])
        except OSError as error:
            out.write(f"bench_record: cannot run {command[0]}: {error.strerror or error}\n")
            return 127
        rc = proc.wait()
        record = _read(path)
        if record is not None:
            out.write(RECORD_PREFIX + json.dumps(kept(record)) + "\n")
            out.flush()
        return rc
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[1:] if args[:1] == ["--"] else args
    if not command:
        sys.stderr.write("usage: bench_record.py -- COMMAND [ARG...]\n")
        return 2
    return run(command)


if __name__ == "__main__":
    sys.exit(main())
