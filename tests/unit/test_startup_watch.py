"""The startup watch's pure parts on tables (``remote/startup_watch.py``: systemd's time, whether
the unit still runs the start followed, a journal message); the watch itself follows a real
unit in ``tests/lxc/test_startup_watch_lxc.py``."""

from __future__ import annotations

import time

import pytest

from pve_sglang.remote.startup_watch import message, micros, running

#: ``systemctl --timestamp=us+utc show``'s ExecMainStartTimestamp of a recorded unit, and the
#: microseconds the UnitState fact reads from it (tests/unit/test_operations_stack.py).
STAMP, STARTED = "Wed 2026-12-02 21:09:32.618391 UTC", 1796245772_618391


@pytest.fixture
def another_local_zone():
    """The process's local time far from UTC, as on a container whose zone is not UTC."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", "Asia/Kolkata")
        time.tzset()
        yield
    time.tzset()


@pytest.mark.parametrize("stamp, expected", [
    (STAMP, STARTED),
    ("Wed 2026-12-02 21:09:32.000000 UTC", STARTED - 618391),
    # fewer than three words: no time
    ("Wed 2026-12-02", None),
    ("", None),
    ("n/a", None),
    # a systemd without --timestamp=us+utc: whole seconds in local time, not read
    ("Wed 2026-12-02 22:09:32 CET", None),
])
def test_micros_reads_systemds_utc_time(stamp, expected, another_local_zone):
    assert micros(stamp) == expected


@pytest.mark.parametrize("state, start, expected", [
    ({"ActiveState": "active", "started": STARTED}, STARTED, True),
    # started again since (another ExecMainStartTimestamp): not the start being followed
    ({"ActiveState": "active", "started": STARTED + 1}, STARTED, False),
    ({"ActiveState": "active", "started": None}, STARTED, False),
    # no start to compare with: active is enough
    ({"ActiveState": "active", "started": STARTED + 1}, None, True),
    ({"ActiveState": "activating", "started": STARTED}, STARTED, False),
    ({"ActiveState": "deactivating", "started": STARTED}, STARTED, False),
    ({"ActiveState": "failed", "started": STARTED}, STARTED, False),
    ({}, None, False),
])
def test_running_means_active_in_the_same_start(state, start, expected):
    assert running(state, start) is expected


@pytest.mark.parametrize("entry, text", [
    ({"MESSAGE": "Load weight begin."}, "Load weight begin."),
    # journald's JSON gives a line that is not UTF-8 as its bytes
    ({"MESSAGE": list("Load".encode())}, "Load"),
    ({"MESSAGE": [0xFF, 0x41]}, "\ufffdA"),
    ({}, ""),
])
def test_message_of_a_journal_entry(entry, text):
    assert message(entry) == text
