"""pve_sglang/remote/bench_record.py as the container runs it: a real process running a real
command that writes its record as sglang's benchmark does (``open(args.output_file, "a")``,
one ``json.dumps`` line with ``server_info`` and the key in it; 0.5.9 ``bench_serving.py``,
0.5.23 ``benchmark/serving.py``). The real benchmarks of both releases run under it in a real
container in tests/lxc/test_secrets_lxc.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pve_sglang.remote import BENCH_RECORD, marked_json, source
from pve_sglang.remote.bench_record import DIR_PREFIX, RECORD_PREFIX

KEY = "sk-rec'o\"rd$KEY"
# What the benchmark does at its end (argparse's --output-file), and what this test checks of
# the file while it exists: its mode and its folder's, printed before the write.
BENCH = r'''
import json, os, stat, sys, time
path = sys.argv[sys.argv.index("--output-file") + 1]
print("STAT", oct(stat.S_IMODE(os.stat(path).st_mode)),
      oct(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)), path, flush=True)
if os.environ.get("HANG"):
    time.sleep(60)
if os.environ.get("WRITE", "1") == "1":
    record = {"backend": "sglang", "completed": 8, "output_throughput": 245.66,
              "server_info": {"api_key": os.environ["OPENAI_API_KEY"], "tp_size": 1}}
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")
sys.exit(int(os.environ.get("RC", "0")))
'''


def run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    command = [sys.executable, str(source(BENCH_RECORD)), "--", sys.executable, "-c", BENCH]
    return subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(tmp_path), "OPENAI_API_KEY": KEY,
                               **env})


def stat_line(out: str) -> list[str]:
    return next(line for line in out.splitlines() if line.startswith("STAT ")).split()[1:]


def test_record_goes_to_a_private_file_removed_after(tmp_path):
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    file_mode, dir_mode, path = stat_line(done.stdout)
    assert (file_mode, dir_mode) == ("0o600", "0o700")
    assert Path(path).parent.parent == tmp_path and Path(path).parent.name.startswith(DIR_PREFIX)
    assert not Path(path).exists() and list(tmp_path.iterdir()) == []
    assert marked_json(RECORD_PREFIX, done.stdout) == {"backend": "sglang", "completed": 8,
                                         "output_throughput": 245.66}
    assert done.stdout.splitlines()[-1].startswith(RECORD_PREFIX)
    assert "api_key" not in done.stdout + done.stderr and "sk-rec" not in done.stdout


def test_exit_status_passes_and_no_record_no_line(tmp_path):
    done = run(tmp_path, RC="3", WRITE="0")
    assert done.returncode == 3
    assert marked_json(RECORD_PREFIX, done.stdout) is None and list(tmp_path.iterdir()) == []
    failed = run(tmp_path, RC="1")  # a record written, then a failure: still read, still removed
    assert failed.returncode == 1 and marked_json(RECORD_PREFIX, failed.stdout)["completed"] == 8
    assert list(tmp_path.iterdir()) == []


def test_terminated_run_removes_its_file_and_stops_the_benchmark(tmp_path):
    command = [sys.executable, str(source(BENCH_RECORD)), "--", sys.executable, "-c", BENCH]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path), "OPENAI_API_KEY": KEY,
                                 "HANG": "1"})
    line = proc.stdout.readline()
    assert line.startswith("STAT ")
    path = Path(line.split()[3])
    assert path.exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert not path.parent.exists()
    # The benchmark went with it.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and b"HANG" in _environs():
        time.sleep(0.1)
    assert list(tmp_path.iterdir()) == []


def _environs() -> bytes:
    """The environments of this machine's processes that run the stand-in benchmark."""
    found = b""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"--output-file" in (proc / "cmdline").read_bytes():
                found += (proc / "environ").read_bytes()
        except OSError:
            pass
    return found


def test_a_killed_runs_folder_is_removed_by_the_next_run(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f"{DIR_PREFIX}{dead}-abc"
    stale.mkdir(mode=0o700)
    (stale / "record.jsonl").write_text(json.dumps({"server_info": {"api_key": KEY}}) + "\n")
    alive = tmp_path / f"{DIR_PREFIX}{os.getpid()}-xyz"  # a run going on: left alone
    alive.mkdir()
    other = tmp_path / "unrelated"
    other.mkdir()
    done = run(tmp_path)
    assert done.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "unrelated"])


def test_usage_without_a_command():
    done = subprocess.run([sys.executable, str(source(BENCH_RECORD)), "--"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "usage" in done.stderr
