"""A roll of the replicas behind a gateway (issue 51), fast: its order, its words and its
decisions on tables (``pve_sglang/gateway/roll.py``). The roll itself, with the real smg and
real units in LXC: ``tests/lxc/test_gateway_lxc.py``; its cost and what it saves: ``bench/gateway_roll.py``."""

from __future__ import annotations

import pytest

from pve_sglang.gateway import roll
from pve_sglang.remote import gateway_workers as gw


@pytest.mark.parametrize("names, size, turns", [
    (["a", "b", "c"], 1, [["a"], ["b"], ["c"]]),
    (["a", "b", "c"], 2, [["a", "b"], ["c"]]),
    (["a", "b", "c"], 3, [["a", "b", "c"]]),
    (["a", "b", "c"], 4, [["a", "b", "c"]]),
    (["a"], 1, [["a"]]),
    ([], 1, []),
])
def test_the_replicas_go_in_turns_of_the_batch_in_their_order(names, size, turns):
    assert roll.batches(names, size) == turns


def test_a_batch_under_one_is_refused():
    with pytest.raises(ValueError, match="at least 1, not 0"):
        roll.batches(["a"], 0)


@pytest.mark.parametrize("names, size, words", [
    (["a", "b", "c"], 1, "gw: a restart rolls over its 3 replicas, 1 at a time, in this order: "
                         "1. a; 2. b; 3. c"),
    (["a", "b", "c"], 2, "gw: a restart rolls over its 3 replicas, 2 at a time, in this order: "
                         "1. a, b; 2. c"),
    (["a", "b"], 1, "gw: a restart rolls over its 2 replicas, 1 at a time, in this order: "
                    "1. a; 2. b"),
    (["a"], 1, "gw: a is its only replica: a restart is plain (no other to serve meanwhile)"),
])
def test_the_plan_says_the_rolls_order(names, size, words):
    assert roll.order_words("gw", names, size) == words


@pytest.mark.parametrize("code, meaning", [
    (0, None),
    (gw.EXIT_CAPACITY, "capacity"),
    # The gateway does not answer, or its script is not there yet: its first deploy.
    (gw.EXIT_GATEWAY, "plain"), (gw.EXIT_USAGE, "plain"), (gw.EXIT_NOT_UP, "plain"), (1, "plain"),
])
def test_the_worker_scripts_answer_to_out_decides_the_turn(code, meaning):
    assert roll.out_refusal(code) == meaning


def test_the_exit_codes_are_the_worker_scripts():
    assert (roll.EXIT_USAGE, roll.EXIT_GATEWAY, roll.EXIT_NOT_UP, roll.EXIT_CAPACITY) == (
        gw.EXIT_USAGE, gw.EXIT_GATEWAY, gw.EXIT_NOT_UP, gw.EXIT_CAPACITY)


@pytest.mark.parametrize("turn, line", [
    (roll.Turn("@lxc/a", 1.25, 0, 8.04, "serving, given back"),
     "@lxc/a: drained in 1.2s, restarted and judged in 8.0s, serving, given back"),
    (roll.Turn("@lxc/a", 300.0, 1, 8.0, "serving"),
     "@lxc/a: drained in 300.0s (1 request in flight cut), restarted and judged in 8.0s, serving"),
    (roll.Turn("@lxc/a", 300.0, 2, 8.0, "serving"),
     "@lxc/a: drained in 300.0s (2 requests in flight cut), restarted and judged in 8.0s, serving"),
    (roll.Turn("@lxc/a", 5.1, 0, 2.0, "serving", 5.04),
     "@lxc/a: drained in 5.1s (out of the rotation in 5.0s), restarted and judged in 2.0s, "
     "serving"),
    (roll.Turn("@lxc/c"), "@lxc/c: drain -, restart -, not reached"),
])
def test_each_turn_names_its_drain_restart_and_verdict(turn, line):
    assert roll.turn_line(turn) == line


def test_a_roll_keeps_one_turn_per_replica():
    r = roll.Roll("gw", ["a", "b"])
    r.turn("a").verdict = "serving"
    assert r.turn("a").verdict == "serving" and list(r.turns) == ["a"]


@pytest.mark.parametrize("replicas, batch, at_once", [
    (1, 1, 1), (1, 5, 1),
    (2, 1, 1), (2, 2, 1),
    (3, 2, 2), (3, 3, 2), (3, 1000, 2),
    (4, 3, 3), (4, 4, 3),
])
def test_a_roll_never_restarts_every_replica_at_once(replicas, batch, at_once):
    assert roll.places(replicas, batch) == at_once


ABC = ["a", "b", "c"]


@pytest.mark.parametrize("names, restarting, batch, serving, planned", [
    # Each replica behind the gateway in turn, in the inventory's order, those that restart only.
    (ABC, {"a", "b", "c"}, 1, True, roll.Plan("roll", [["a"], ["b"], ["c"]])),
    (ABC, {"c", "a"}, 1, True, roll.Plan("roll", [["a"], ["c"]])),
    (ABC, {"b"}, 1, True, roll.Plan("roll", [["b"]])),
    (ABC, {"a", "b", "c"}, 2, True, roll.Plan("roll", [["a", "b"], ["c"]])),
    # A batch of every replica still leaves one serving.
    (ABC, {"a", "b", "c"}, 3, True, roll.Plan("roll", [["a", "b"], ["c"]])),
    (["a", "b"], {"a", "b"}, 2, True, roll.Plan("roll", [["a"], ["b"]])),
    # Nothing restarts: no roll.
    (ABC, set(), 1, True, roll.Plan("none", [])),
    # One replica: a plain restart, said so.
    (["a"], {"a"}, 1, True,
     roll.Plan("plain", [["a"]], "its only replica: no other serves meanwhile")),
    # The gateway does not serve yet (its first deploy): as without a gateway.
    (ABC, {"a", "b", "c"}, 1, False,
     roll.Plan("plain", [["a", "b", "c"]], "the gateway does not serve yet (its first deploy)")),
])
def test_the_roll_is_planned_from_what_restarts(names, restarting, batch, serving, planned):
    assert roll.plan(names, restarting, batch, serving) == planned


def test_the_plans_words_never_take_every_replica_at_once():
    assert roll.order_words("gw", ["a", "b"], 2) == (
        "gw: a restart rolls over its 2 replicas, 1 at a time, in this order: 1. a; 2. b")


@pytest.mark.parametrize("name, due, running, done, at_once, go", [
    # In the inventory's order, whatever order the hosts come in.
    ("a", {"a", "b", "c"}, set(), set(), 1, True),
    ("b", {"a", "b", "c"}, set(), set(), 1, False),
    ("c", {"a", "b", "c"}, set(), set(), 1, False),
    ("b", {"a", "b", "c"}, set(), {"a"}, 1, True),
    # One at a time: the next waits while one runs.
    ("b", {"a", "b", "c"}, {"a"}, set(), 1, False),
    # Two at a time: the next begins beside the one running, not a third.
    ("b", {"a", "b", "c"}, {"a"}, set(), 2, True),
    ("c", {"a", "b", "c"}, {"a", "b"}, set(), 2, False),
    ("c", {"a", "b", "c"}, {"b"}, {"a"}, 2, True),
    # A replica that does not restart holds no one back.
    ("b", {"b", "c"}, set(), set(), 1, True),
    ("c", {"a", "c"}, set(), {"a"}, 1, True),
])
def test_each_turn_begins_in_the_inventorys_order(name, due, running, done, at_once, go):
    assert roll.may_go(name, ABC, due, running, done, at_once) is go


def planned_words(workers: list[str]) -> list[str]:
    """The container phase's step words planned for ct105 (the H200 machine's recorded
    outputs), behind a gateway fronting WORKERS."""
    from harness import plan_deploy
    from pyinfra import host

    from pve_sglang.project import load_defaults
    from tasks import container
    from test_host_phase_recorded import container_answers, gpu_host_responses

    words: list[str] = []
    real = container.container_plan

    def recorded(*args):
        steps = real(*args)
        if host.name == "@fake/ct105":
            words.extend(w for w, _ in steps)
        return steps

    defaults = load_defaults()
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve"}
    gateway = {**defaults, "pct_vmid": 120, "pve_host": "@fake/pve1", "platform": "pve",
               "gateway_worker_list": [{"name": n, "url": f"http://{n}:30000", "has_key": False}
                                       for n in workers]}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(container, "container_plan", recorded)
        plan_deploy(container.container_phase,
                    hosts=[("pve1", {**defaults}), ("ct105", ct), ("gw", gateway)],
                    responses={**container_answers(None, None), **gpu_host_responses()},
                    groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"],
                            "gateways": ["gw"]})
    return words


@pytest.mark.parametrize("workers, ending", [
    # Behind a gateway with another replica: in turn.
    (["@fake/ct105", "@fake/ct106"], ", enable it and (re)start it once, in turn behind "
     "@fake/gw: out of its rotation once the others are healthy in its view, drained (up to "
     "300s), restarted, judged (startup watch, a generation asked as the gateway asks it), "
     "given its traffic back"),
    # The only replica behind its gateway: plainly, said so.
    (["@fake/ct105"], ", enable it and (re)start it once (plainly: the only replica behind "
     "@fake/gw)"),
    # A gateway in front of others only: as without one.
    (["@fake/ct107", "@fake/ct106"], ", enable it and (re)start it once"),
])
def test_the_container_plan_says_how_its_restart_goes_behind_a_gateway(workers, ending):
    words = planned_words(workers)
    assert [w for w in words if "(re)start it once" in w][0].endswith(ending), words


SERVING = "serving, given back (listed healthy in 1.0s)"


@pytest.mark.parametrize("name, policy, stopped_at, verdict, back_to, what", [
    # No roll stopped, or it stopped at this one (its verify phase judges it).
    ("a", "back", None, SERVING, "sglang 0.5.17", "none"),
    ("b", "back", "b", "failed its judgement: HTTP 500", "sglang 0.5.17", "none"),
    # Not changed by this run (after the stop, or nothing to restart).
    ("c", "back", "b", "not restarted: the roll stopped at b", "sglang 0.5.17", "none"),
    ("c", "back", "b", None, "sglang 0.5.17", "none"),
    # Changed before the stop: kept, or sent back where an upgrade left a release to go to.
    ("a", "keep", "b", SERVING, "sglang 0.5.17", "keep"),
    ("a", "back", "b", SERVING, None, "keep"),
    ("a", "back", "b", SERVING, "sglang 0.5.17", "back"),
    # Changed but not given back (the gateway phase registers it): still the change it serves.
    ("a", "back", "b", "serving, but not given back: timeout", "sglang 0.5.17", "back"),
])
def test_after_a_stop_each_replica_keeps_its_change_or_goes_back(name, policy, stopped_at,
                                                                  verdict, back_to, what):
    asked: list[str] = []

    def target() -> str | None:
        asked.append(name)
        return back_to

    found, words, going_to = roll.after_a_stop(name, policy, stopped_at, verdict, target)
    assert found == what, words
    # The release is read only where the replica would go back, and named only then.
    assert bool(asked) == (what == "back" or (what == "keep" and policy == "back"))
    assert going_to == (back_to if what == "back" else None)
    if what == "keep":
        assert f"the roll stopped at {stopped_at}" in words
        assert ("gateway_roll_failure is keep" if policy == "keep" else "only an upgrade") in words
    if what == "back":
        assert words == f"goes back to {back_to}: the roll stopped at {stopped_at}"


@pytest.mark.parametrize("workers, policy, words", [
    # Behind a gateway with another replica: named, or sent back, where a roll stops.
    (["@fake/ct105", "@fake/ct106"], "keep", "where the roll behind @fake/gw stops at another "
     "replica: it keeps the change of this run, named (gateway_roll_failure)"),
    (["@fake/ct105", "@fake/ct106"], "back", "where the roll behind @fake/gw stops at another "
     "replica: an upgrade of this run goes back to the release it served, in turn "
     "(gateway_roll_failure)"),
    # Alone behind its gateway, or no gateway in front of it: no such check.
    (["@fake/ct105"], "back", None),
    (["@fake/ct107", "@fake/ct106"], "back", None),
])
def test_the_verify_phase_plans_what_a_replica_does_where_its_roll_stops(workers, policy, words):
    from harness import plan_deploy
    from pyinfra import host

    from pve_sglang.config.settings import ContainerSettings, host_settings
    from pve_sglang.project import load_defaults
    from tasks import verify

    found: list[str | None] = []

    def deploy() -> None:
        if host.name == "@fake/ct105":
            back = verify.back_check(host_settings(ContainerSettings).server, lambda: None)
            found.append(back[0] if back else None)

    defaults = load_defaults()
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve"}
    gateway = {**defaults, "pct_vmid": 120, "pve_host": "@fake/pve1", "platform": "pve",
               "gateway_roll_failure": policy,
               "gateway_worker_list": [{"name": n, "url": f"http://{n}:30000", "has_key": False}
                                       for n in workers]}
    plan_deploy(deploy, hosts=[("pve1", {**defaults}), ("ct105", ct), ("gw", gateway)],
                responses={}, groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"],
                                      "gateways": ["gw"]})
    assert found == [words]
