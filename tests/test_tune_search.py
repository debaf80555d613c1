"""The tuning search's pure parts on tables, and the whole search on three landscapes
(tests/landscapes/*.yaml) through a simulator of the server (tests/tune_sim.py: no server, no
GPU; the figures are the landscape's, with its noise).

On each landscape, over seeds 0-9 of the noise: the search's best is within 5% of the grid's
best in at least 9 of 10, in fewer tries than the grid has candidates (seed_moe: about 95 of
8,640; dense_kv_bound: about 60 of 2,700; graph_cap_coupled: about 65 of 960), a try that
fails is never the best, and a killed search replays its record and goes on.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

import tune_sim
from landscape import Landscape, LandscapeError
from pve_sglang.tuning import record
from pve_sglang.tuning import space as tuning_space
from pve_sglang.tuning.space import SpaceError, default_space, grid, user_space, valid
from pve_sglang.tuning.strategy import (
    Outcome,
    Proposal,
    Replayed,
    Search,
    Try,
    coordinate_order,
    keep,
    ruled_out,
)

LANDSCAPES = sorted((Path(__file__).parent / "landscapes").glob("*.yaml"))
SEEDS = range(10)


# --- the space ----------------------------------------------------------------------------


@pytest.mark.parametrize("release, moe, has_backend, policies", [
    ("0.5.9", True, True, (None, "lpm")),
    ("0.5.18", False, False, (None, "lpm")),
    ("0.5.22", True, True, (None, "lpm", "hrrn")),
    ("0.5.23", False, False, (None, "lpm", "hrrn")),
])
def test_default_space_per_release_and_model(release, moe, has_backend, policies):
    space = default_space(release, moe)
    assert ("moe_runner_backend" in space) is has_backend
    assert space["schedule_policy"] == policies
    assert space["max_running_requests"][0] is None  # SGLang's own first: the conservative end


@pytest.mark.parametrize("given, match", [
    ({"max_running_requests": [0]}, "max_running_requests value 0"),
    ({"mem_fraction_static": [1.2]}, "mem_fraction_static value 1.2"),
    ({"chunked_prefill_size": [-2]}, "chunked_prefill_size value -2"),
    ({"schedule_policy": ["fifo"]}, "schedule_policy value 'fifo'"),
    ({"schedule_policy": ["hrrn"]}, "'hrrn' came in sglang 0.5.22; this container runs 0.5.9"),
    ({"tp_size": [2]}, "'tp_size' is not a coordinate"),
    ({"disable_cuda_graph": []}, "lists no value"),
    ({"cuda_graph_max_bs": [True]}, "cuda_graph_max_bs value True"),
])
def test_user_space_refuses_naming_coordinate_and_value(given, match):
    with pytest.raises(SpaceError, match=match):
        user_space(given, "0.5.9")


def test_user_space_keeps_each_value_once_in_order():
    assert user_space({"max_running_requests": [None, 256, 256, 64]}, "0.5.23") == {
        "max_running_requests": (None, 256, 64)}


@pytest.mark.parametrize("candidate, meaningful", [
    ({"disable_cuda_graph": True, "cuda_graph_max_bs": None}, True),
    ({"disable_cuda_graph": True, "cuda_graph_max_bs": 256}, False),
    ({"disable_cuda_graph": False, "cuda_graph_max_bs": 256}, True),
    ({"max_running_requests": 64}, True),
])
def test_a_graph_batch_size_means_something_only_with_graphs(candidate, meaningful):
    assert valid(candidate) is meaningful


def test_grid_leaves_out_what_means_nothing():
    space = {"disable_cuda_graph": (True, False), "cuda_graph_max_bs": (None, 64, 256)}
    assert len(grid(space)) == 4  # graphs off once, graphs on with each size


# --- the strategy's decisions -------------------------------------------------------------


def row(level, running, queue, usage, power):
    return {"concurrency": level, "running_reqs_max": running, "running_reqs_mean": running,
            "queue_reqs_mean": queue, "token_usage_max": usage, "gpu_power_pct": power}


SPACE = default_space("0.5.23", moe=True)


@pytest.mark.parametrize("figures, first", [
    (row(256, 64, 192, 0.14, 80), ["max_running_requests"]),            # capped
    (row(256, 133, 123, 0.99, 80), ["mem_fraction_static", "chunked_prefill_size"]),  # KV full
    (row(256, 256, 40, 0.5, 35), ["disable_cuda_graph", "cuda_graph_max_bs",
                                  "moe_runner_backend"]),                # GPUs idle, queue
    (row(256, 64, 192, 0.14, 35), ["max_running_requests", "disable_cuda_graph"]),
    (row(256, 256, 0, 0.5, 90), ["max_running_requests", "mem_fraction_static"]),  # no signal
])
def test_the_figures_decide_the_next_coordinate(figures, first):
    assert coordinate_order(SPACE, figures, 60)[:len(first)] == first
    assert sorted(coordinate_order(SPACE, figures, 60)) == sorted(SPACE)


@pytest.mark.parametrize("failed, current, out", [
    ({0.94}, 0.85, {0.94}),             # the largest failed: nothing beyond
    ({0.9}, 0.85, {0.9, 0.92, 0.94}),   # out of memory at 0.9: 0.92 and 0.94 too
    ({0.8}, 0.88, {0.8}),               # below the current: only what is further down
    ({0.85}, 0.9, {0.8, 0.85}),
])
def test_a_failure_rules_out_the_values_beyond_it(failed, current, out):
    assert ruled_out((0.8, 0.85, 0.88, 0.9, 0.92, 0.94), failed, current) == out


def test_halving_keeps_the_better_half_and_those_within_the_noise():
    scores = {"a": 100.0, "b": 99.0, "c": 80.0, "d": 70.0}
    assert keep(scores, 90.0, 0.02, 1.0) == ["a", "b"]
    assert keep({"a": 100.0, "b": 98.5, "c": 98.0}, 90.0, 0.02, 1.0) == ["a", "b", "c"]
    # Far below the best: dropped even in the better half.
    assert keep({"a": 50.0, "b": 40.0}, 100.0, 0.02, 1.0) == []


# --- the landscapes -----------------------------------------------------------------------


def test_three_landscapes():
    assert [p.stem for p in LANDSCAPES] == ["dense_kv_bound", "graph_cap_coupled", "seed_moe"]


def test_a_landscape_that_does_not_say_what_it_must_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((LANDSCAPES[0]).read_text() + "\nfailures: [{when: {tp_size: 2}, ends: boom}]\n")
    with pytest.raises(LandscapeError, match="ends: one of"):
        Landscape.read(bad)


@pytest.fixture(scope="module")
def searches():
    """Per landscape: the grid's best, and the search of each seed."""
    out = {}
    for path in LANDSCAPES:
        landscape = Landscape.read(path)
        out[path.stem] = (landscape, tune_sim.best_of(landscape),
                          [tune_sim.search(landscape, seed=seed) for seed in SEEDS])
    return out


@pytest.mark.parametrize("name", [p.stem for p in LANDSCAPES])
def test_the_search_finds_the_best_within_5_percent_in_fewer_tries_than_the_grid(name, searches):
    landscape, (best, best_value), runs = searches[name]
    reached = [tune_sim.reached(landscape, run) for run in runs]
    assert sum(r is not None for r in reached) >= 9, [landscape.objective(r.best) for r in runs]
    grid_tries = len(grid(landscape.space))
    assert max(len(run.tries) for run in runs) < grid_tries / 5
    assert statistics.median(r[0] for r in reached if r) < grid_tries / 10
    for run in runs:
        assert run.stopped.startswith("no candidate left")


@pytest.mark.parametrize("name", [p.stem for p in LANDSCAPES])
def test_a_failed_try_is_recorded_and_never_the_best(name, searches):
    landscape, _, runs = searches[name]
    for run in runs:
        failed = [t for t in run.tries if not t.outcome.ok]
        assert failed, "each landscape has failures the search meets"
        assert {t.outcome.ended for t in failed} <= {"oom", "start", "stall", "degenerate",
                                                     "constraint"}
        assert landscape.failure(run.best) is None and landscape.objective(run.best)
        for _, candidate, _ in run.bests:
            assert landscape.objective(candidate) is not None


def test_the_budget_stops_the_search_with_the_best_so_far():
    landscape = Landscape.read(LANDSCAPES[-1])
    run = Search(landscape.space, landscape.start, budget_s=6 * 3600).run(
        tune_sim.Simulated(landscape))
    assert run.stopped.startswith("budget") and run.spent_s >= 6 * 3600
    assert landscape.objective(run.best) > landscape.objective(landscape.start)


def test_a_killed_search_replays_its_record_and_goes_on():
    landscape = Landscape.read(LANDSCAPES[-1])
    live = tune_sim.Simulated(landscape, seed=3)

    class Killed(Exception):
        pass

    def dies_after_30(proposal: Proposal) -> Outcome:
        if len(killed.tries) >= 30:
            raise Killed
        return live(proposal)

    killed = Search(landscape.space, landscape.start, budget_s=1e9)
    with pytest.raises(Killed):
        killed.run(dies_after_30)
    measured = []

    def counted(proposal: Proposal) -> Outcome:
        measured.append(proposal)
        return live(proposal)

    replay = Replayed(list(killed.tries), counted)
    again = Search(landscape.space, landscape.start, budget_s=1e9).run(replay)
    assert replay.replayed == 30
    assert [t.proposal for t in again.tries[:30]] == [t.proposal for t in killed.tries]
    assert measured and measured[0] == again.tries[30].proposal  # no try measured twice
    assert again.stopped.startswith("no candidate left")
    assert landscape.objective(again.best) >= 0.95 * tune_sim.best_of(landscape)[1]


def test_coordinates_of_the_space_are_those_of_the_settings():
    from pve_sglang.config.settings import ContainerSettings

    assert set(tuning_space.COORDINATES) <= set(ContainerSettings.model_fields)


# --- the record of tries ------------------------------------------------------------------


def recorded_search(landscape, path, seed, die_after=None, replay=None) -> Search:
    """A search whose every try goes to the record at PATH as it ends; killed (KeyboardInterrupt,
    as Ctrl-C) after DIE_AFTER tries; replaying REPLAY first."""
    live = tune_sim.Simulated(landscape, seed=seed)
    made = []

    def measure(proposal: Proposal) -> Outcome:
        if die_after is not None and len(made) >= die_after:
            raise KeyboardInterrupt
        outcome = live(proposal)
        made.append(proposal)
        record.add(path, Try(proposal, outcome))
        return outcome

    search = Search(landscape.space, landscape.start, budget_s=1e9)
    if replay is None:
        record.begin(path, landscape.start)
        return search.run(measure)
    return search.run(Replayed(replay.tries, measure))


def test_a_killed_search_keeps_its_record_and_the_next_run_ends_it(tmp_path):
    landscape = Landscape.read(LANDSCAPES[1])
    path = record.record_path(tmp_path / "pve1-105.yml")
    assert path.name == "pve1-105.tries.jsonl"
    with pytest.raises(KeyboardInterrupt):
        recorded_search(landscape, path, seed=1, die_after=25)
    killed = record.read(path)
    assert killed.found == landscape.start and len(killed.tries) == 25 and killed.ended is None
    # A kill mid-line leaves a torn line: the reading stops there, the tries before it kept.
    with open(path, "a") as handle:
        handle.write('{"event": "try", "candidate": {"max_running')
    torn = record.read(path)
    assert len(torn.tries) == 25 and "line 27 not read" in torn.cut
    path.write_text("\n".join(path.read_text().splitlines()[:26]) + "\n")
    again = recorded_search(landscape, path, seed=1, replay=killed)
    record.end(path, again.best, again.best_score, again.stopped)
    done = record.read(path)
    assert done.ended["stopped"].startswith("no candidate left") and not done.cut
    assert [t.proposal for t in done.tries[:25]] == [t.proposal for t in killed.tries]
    assert len(done.tries) == len(again.tries)  # each try measured once, over both runs
    assert landscape.objective(again.best) >= 0.95 * tune_sim.best_of(landscape)[1]


@pytest.mark.parametrize("line, why", [
    ('{"event": "try", "candidate": {"schedule_policy": "$(touch F)"}, "length": 1, '
     '"ended": "measured", "objective": 1, "cost_s": 1}', "schedule_policy value '$(touch F)'"),
    ('{"event": "try", "candidate": {}, "length": 2, "ended": "measured", "cost_s": 1}',
     "length 2"),
    ('{"event": "try", "candidate": {}, "length": 1, "ended": "reboot", "cost_s": 1}',
     "ended 'reboot'"),
    ('{"event": "found", "candidate": {}}', "a 'found' line here"),
    ('[1, 2]', "a None line here"),
])
def test_a_record_line_not_as_the_search_writes_it_ends_the_reading(tmp_path, line, why):
    path = tmp_path / "r.tries.jsonl"
    record.begin(path, {"max_running_requests": 64})
    with open(path, "a") as handle:
        handle.write(line + "\n")
    read = record.read(path)
    assert read.found == {"max_running_requests": 64} and read.tries == []
    assert "line 2 not read" in read.cut and why in read.cut


def test_the_table_and_the_plot_of_every_try(tmp_path):
    from pve_sglang.tuning.report import plot, summary_table

    landscape = Landscape.read(LANDSCAPES[1])
    path = tmp_path / "pve1-105.tries.jsonl"
    run = recorded_search(landscape, path, seed=2)
    record.end(path, run.best, run.best_score, run.stopped)
    read = record.read(path)
    table = summary_table(read).splitlines()
    assert len([line for line in table if line.startswith("| ")]) == len(run.tries) + 2
    assert table[2].startswith("| 1 | (none) | 1 | measured | ")
    assert any("| oom |" in line or "| start |" in line or "| stall |" in line for line in table)
    assert table[-1].startswith("best: ") and "no candidate left" in table[-1]
    plot(read, tmp_path / "tries.png", "graph_cap_coupled")
    assert (tmp_path / "tries.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
