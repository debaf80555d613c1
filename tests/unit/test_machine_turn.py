"""The machine's test turn (devtools/lxc_env.py ``machine_turn``): tests of several pytest
workers or runs share it, a test that restarts lxc-net has it alone, and a wait that does not
end names who holds it. Real processes and real flocks, in a folder of the test's."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools import lxc_env

REPO = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from devtools import lxc_env
with lxc_env.machine_turn({exclusive}, folder=Path({folder!r})):
    print("held", flush=True)
    time.sleep({seconds})
"""


def holder(folder: Path, exclusive: bool, seconds: float) -> subprocess.Popen:
    """Another process holding the turn for SECONDS (returns once it holds it)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD.format(
        repo=str(REPO), exclusive=exclusive, folder=str(folder), seconds=seconds)],
        stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_shared_turns_run_together_and_an_exclusive_one_waits_for_them(tmp_path):
    other = holder(tmp_path, exclusive=False, seconds=2)
    started = time.monotonic()
    with lxc_env.machine_turn(False, wait_s=1, folder=tmp_path):
        assert time.monotonic() - started < 1  # beside the other shared turn, at once
    with lxc_env.machine_turn(True, wait_s=30, folder=tmp_path):
        assert time.monotonic() - started > 1.5  # only once the shared one (2 s) has ended
    other.wait()


def test_a_shared_turn_waits_for_an_exclusive_one(tmp_path):
    other = holder(tmp_path, exclusive=True, seconds=2)
    started = time.monotonic()
    with lxc_env.machine_turn(False, wait_s=30, folder=tmp_path):
        assert time.monotonic() - started > 1.5  # only once the exclusive one (2 s) has ended
    other.wait()


def test_a_wait_that_does_not_end_names_who_holds_the_turn(tmp_path):
    other = holder(tmp_path, exclusive=False, seconds=30)
    try:
        with pytest.raises(lxc_env.LxcError) as caught:
            with lxc_env.machine_turn(True, wait_s=0.5, folder=tmp_path):
                pass
        assert f"{other.pid} {sys.executable}" in str(caught.value)
        assert "was not had in 0 s" in str(caught.value) or "was not had in 1 s" in str(caught.value)
    finally:
        other.kill()
        other.wait()
