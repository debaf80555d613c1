"""The server launcher (pve_sglang/remote/sglang_launch.py) run as real processes on this machine.

The module it starts here is a small stand-in written by each test (sglang itself runs under the
launcher in tests/lxc/test_secrets_lxc.py); what is checked is the launcher's own promise: the key
reaches the module's ``sys.argv`` and no process's ``/proc/PID/cmdline``, every spelling of a
secret is masked in the output of every process, and it ends as its child ended.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pve_sglang import remote
from pve_sglang.remote.sglang_launch import EX_CONFIG, EX_USAGE, MAX_LINE, mask_text

LAUNCHER_SOURCE = remote.source(remote.LAUNCHER)

KEY = "sk-'q\"uo\\te$x%y"
TOKEN = "hf_TokenValue0123456789"
OPTIONS = ["--arg-from-env=--api-key=SGLANG_API_KEY", "--mask-env=HF_TOKEN"]


def spellings(secret: str) -> set[str]:
    return {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]}


def leaks(text: str) -> list[str]:
    return [s for secret in (KEY, TOKEN) for s in spellings(secret) if s in text]


def launch(tmp_path: Path, body: str, env: dict | None = None, options=OPTIONS, **kwargs):
    """Popen of the launcher running module ``standin`` (BODY) from TMP_PATH."""
    (tmp_path / "standin.py").write_text(body)
    environ = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1",
               "SGLANG_API_KEY": KEY, "HF_TOKEN": TOKEN, **(env or {})}
    environ = {k: v for k, v in environ.items() if v is not None}
    return subprocess.Popen(
        [sys.executable, str(LAUNCHER_SOURCE), *options, "-m", "standin", "--model-path", "/m"],
        env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs,
    )


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


PRINTS = '''
import json, logging, multiprocessing, os, sys
def spawned(argv):
    print("spawned", sys.argv[-2:], flush=True)
if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("argv", sys.argv[1:], flush=True)
    logging.getLogger("x").info("json %s", json.dumps({"api_key": sys.argv[-1]}))
    print("token", os.environ["HF_TOKEN"], "key in env:", "SGLANG_API_KEY" in os.environ, flush=True)
    print("x" * 70000 + sys.argv[-1] + "y" * 10, flush=True)  # one line longer than MAX_LINE
    process = multiprocessing.get_context("spawn").Process(target=spawned, args=(1,))
    process.start(); process.join()
    raise SystemExit(f"failing with {sys.argv[-1]!r}")
'''


def test_key_in_sys_argv_and_masked_everywhere(tmp_path):
    running = launch(tmp_path, PRINTS)
    out, err = running.communicate(timeout=120)
    assert running.returncode == 1  # SystemExit with a message: exit 1, passed on
    assert leaks(out + err) == []
    assert "argv ['--model-path', '/m', '--api-key', '<hidden SGLANG_API_KEY>']" in out
    assert "spawned ['--api-key', '<hidden SGLANG_API_KEY>']" in out  # through spawn's pipe
    assert 'json {"api_key": "<hidden SGLANG_API_KEY>"}' in err + out
    assert "token <hidden HF_TOKEN> key in env: False" in out
    long_line = next(line for line in out.splitlines() if line.startswith("xxx"))
    assert len(long_line) > MAX_LINE and long_line.endswith("<hidden SGLANG_API_KEY>yyyyyyyyyy")
    assert "failing with '<hidden SGLANG_API_KEY>'" in out + err


SLEEPS = '''
import hashlib, os, sys, time
open(os.environ["PIDFILE"], "w").write(f"{os.getpid()} {hashlib.sha256(sys.argv[-1].encode()).hexdigest()}")
time.sleep(120)
'''


def test_no_process_has_the_key_in_its_cmdline_and_sigterm_ends_it_cleanly(tmp_path):
    pidfile = tmp_path / "pid"
    running = launch(tmp_path, SLEEPS, env={"PIDFILE": str(pidfile)}, start_new_session=True)
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and running.poll() is None
        time.sleep(0.05)
    child, digest = pidfile.read_text().split()
    assert digest == hashlib.sha256(KEY.encode()).hexdigest()  # the module got the real key
    for pid in (running.pid, int(child)):
        assert leaks(cmdline(pid)) == [] and "--arg-from-env=--api-key=SGLANG_API_KEY" in cmdline(pid)
    # What systemd's KillMode=control-group does: SIGTERM to every process. The launcher waits
    # for its child and then ends by the same signal (a clean stop for systemd).
    os.killpg(running.pid, signal.SIGTERM)
    out, err = running.communicate(timeout=60)
    assert running.returncode == -signal.SIGTERM, err
    # Only the launcher got it: it ignores it and stays until the child ends.
    pidfile.write_text("")
    running = launch(tmp_path, SLEEPS, env={"PIDFILE": str(pidfile)})
    while not pidfile.read_text():
        time.sleep(0.05)
    running.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert running.poll() is None
    os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
    running.communicate(timeout=60)
    assert running.returncode == -signal.SIGKILL


def test_exit_code_passes_through(tmp_path):
    running = launch(tmp_path, "import sys\nprint('bye')\nsys.exit(3)\n")
    out, _ = running.communicate(timeout=60)
    assert (running.returncode, out) == (3, "bye\n")


def test_child_exit_with_a_grandchild_holding_the_output(tmp_path):
    """The launcher does not wait for EOF forever when a process the child left behind still
    holds the pipe (systemd stops the rest of the unit once the main process is gone)."""
    body = ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "print('child done', flush=True)\nsys.exit(5)\n")
    running = launch(tmp_path, body, start_new_session=True)
    try:
        out, _ = running.communicate(timeout=60)
    finally:
        os.killpg(running.pid, signal.SIGKILL)
    assert running.returncode == 5 and "child done" in out


@pytest.mark.parametrize("value", ["", None])
def test_empty_or_missing_key_refuses_to_start(tmp_path, value):
    running = launch(tmp_path, "print('started')\n", env={"SGLANG_API_KEY": value})
    out, err = running.communicate(timeout=60)
    assert running.returncode == EX_CONFIG and out == ""
    assert "SGLANG_API_KEY is empty or unset" in err and "refusing to start without --api-key" in err
    assert leaks(err) == []


@pytest.mark.parametrize("options", [
    ["--api-key=SGLANG_API_KEY"],
    ["--arg-from-env=SGLANG_API_KEY"],
    ["--arg-from-env=--api-key=not-a-name!"],
    ["--mask-env="],
])
def test_bad_launcher_options(tmp_path, options):
    running = launch(tmp_path, "print('started')\n", options=options)
    out, err = running.communicate(timeout=60)
    assert running.returncode == EX_USAGE and out == "" and "sglang_launch:" in err
    assert leaks(err) == []


def test_missing_module_is_a_usage_error(tmp_path):
    done = subprocess.run([sys.executable, str(LAUNCHER_SOURCE), *OPTIONS], capture_output=True,
                          text=True, env={"SGLANG_API_KEY": KEY, "PATH": "/usr/bin:/bin"})
    assert done.returncode == EX_USAGE and "missing -m MODULE" in done.stderr


def test_mask_text():
    text = f"Bearer {KEY} {KEY!r} {json.dumps(TOKEN)} plain"
    masked = mask_text(text, {"SGLANG_API_KEY": KEY, "HF_TOKEN": TOKEN})
    assert leaks(masked) == []
    assert masked == ("Bearer <hidden SGLANG_API_KEY> '<hidden SGLANG_API_KEY>' "
                      '"<hidden HF_TOKEN>" plain')
