"""The server unit's decision (``server.unit_action.decide``), case by case: a table."""

from __future__ import annotations

import pytest

from pve_sglang.server.unit_action import Action, UnitPlan, decide

BASE = dict(active="active", sub="running", enabled="enabled", stale=False, start=True,
            changed=False, pending=[], restart_on_change=True)
CHANGED = "this run changed what it runs"

CASES = [
    ("running, unchanged: nothing", {}, UnitPlan(Action.NOTHING, False, None)),
    ("activating counts as running", dict(active="activating", sub="start"),
     UnitPlan(Action.NOTHING, False, None)),
    ("reloading counts as running", dict(active="reloading"), UnitPlan(Action.NOTHING, False, None)),
    ("running, changed: restart", dict(changed=True), UnitPlan(Action.RESTART, False, None, CHANGED)),
    ("running, stale unit: reload and restart", dict(stale=True),
     UnitPlan(Action.RESTART, True, None, CHANGED)),
    ("running, a killed run's change: restart, saying what",
     dict(pending=["the unit file", "the environment file"]),
     UnitPlan(Action.RESTART, False, None,
              "the unit file, the environment file changed after the server started")),
    ("changed wins over pending in the reason", dict(changed=True, pending=["the unit file"]),
     UnitPlan(Action.RESTART, False, None, CHANGED)),
    ("restart_on_change false: changed stays pending", dict(changed=True, restart_on_change=False),
     UnitPlan(Action.PENDING, False, None, CHANGED)),
    ("restart_on_change false: a killed run's change stays pending",
     dict(pending=["the unit file"], restart_on_change=False),
     UnitPlan(Action.PENDING, False, None, "the unit file changed after the server started")),
    ("restart_on_change false, unchanged: nothing", dict(restart_on_change=False),
     UnitPlan(Action.NOTHING, False, None)),
    ("down: start", dict(active="inactive", sub="dead"), UnitPlan(Action.START, False, None)),
    ("down, changed does not matter: start", dict(active="inactive", sub="dead", changed=True),
     UnitPlan(Action.START, False, None)),
    ("down, not enabled: enable and start", dict(active="inactive", sub="dead", enabled="disabled"),
     UnitPlan(Action.START, False, "enable")),
    ("down, stale, restart_on_change false: reload and start",
     dict(active="inactive", sub="dead", stale=True, restart_on_change=False),
     UnitPlan(Action.START, True, None)),
    ("no GPU, down and enabled: disable, leave down", dict(active="inactive", sub="dead", start=False),
     UnitPlan(Action.LEAVE_DOWN, False, "disable")),
    ("no GPU, down and disabled: leave down", dict(active="inactive", start=False, enabled="disabled"),
     UnitPlan(Action.LEAVE_DOWN, False, None)),
    ("no GPU, running: restart on change like any", dict(start=False, enabled="disabled", changed=True),
     UnitPlan(Action.RESTART, False, None, CHANGED)),
    ("failed: recover", dict(active="failed", sub="failed"), UnitPlan(Action.RECOVER, False, None)),
    ("between automatic restarts: recover", dict(active="activating", sub="auto-restart"),
     UnitPlan(Action.RECOVER, False, None)),
    ("failed and stale: reload, recover", dict(active="failed", sub="failed", stale=True),
     UnitPlan(Action.RECOVER, True, None)),
    ("failed, not enabled: enable, recover", dict(active="failed", enabled="disabled"),
     UnitPlan(Action.RECOVER, False, "enable")),
    ("failed, no GPU: disable, recover (stops it)", dict(active="failed", start=False),
     UnitPlan(Action.RECOVER, False, "disable")),
    ("failed with restart_on_change false: still recover", dict(active="failed", restart_on_change=False),
     UnitPlan(Action.RECOVER, False, None)),
]


@pytest.mark.parametrize("case, given, expected", CASES, ids=[case for case, _, _ in CASES])
def test_decide(case, given, expected):
    assert decide(**{**BASE, **given}) == expected


def test_every_action_has_a_row():
    assert {expected.action for _, _, expected in CASES} == set(Action)
