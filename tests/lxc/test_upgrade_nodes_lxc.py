"""Upgrades of a model served by several nodes (``nodes``) in two real LXC containers (systemd,
journald) through pyinfra's CLI: the nodes switch in one run, each restarted once; a node whose
new release crashes at load rolls the whole group back (a TP group half on each release cannot
serve), every node serves the old release again and names the failure; the failed set is
refused on every node; a node does not switch without its group (``--limit``); a container
serving a model alone, in the same runs, finishes its own upgrade while the group fails.

The deploy is ``tests/deploys/upgrade.py`` (the container phase's own stack and server steps,
the verify phase's own server checks) on ``devtools/upgrade_site.py``'s group: two containers,
each with real venvs of real sglang wheels and the stand-in server under the deploy's own unit,
behaving as each container's ``cases.json`` says for the release its link names, and a third
such container outside the group (``group.solo``). One group for every case, in order (module
scope): each case starts from what the one before left.
"""

from __future__ import annotations

import re
import time

import pytest

from devtools.upgrade_site import make_group, stack_of
from pve_sglang.project import load_defaults

RELEASES = ("0.5.8", "0.5.9", "0.5.10")


@pytest.fixture(scope="module")
def group(lxc_env, sglang_wheel, pypi_wheel, tmp_path_factory):
    started = time.monotonic()
    made = make_group(lxc_env, tmp_path_factory.mktemp("nodes"),
                      [sglang_wheel(release) for release in RELEASES],
                      pypi_wheel("uv", load_defaults()["uv_version"]), solo=1)
    yield made
    print(f"\nnode upgrade tests: {time.monotonic() - started:.1f}s; deploys (s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in made.times.items()))
    made.destroy()


def words(release: str) -> str:
    return f"sglang {release} (stack {stack_of(release)})"


def operation_of(log: str, name: str) -> str:
    """The lines pyinfra prints for the operation NAME (from its start to the next one)."""
    found = re.search(rf"--> Starting operation: [^\n]*{re.escape(name)}[^\n]*\n(.*?)"
                      r"(?=--> Starting operation|\Z)", log, re.S)
    assert found, f"no operation {name!r} in:\n{log[-3000:]}"
    return found.group(1)


def test_first_deploy_of_the_nodes(group):
    done = group.deploy("0.5.8")
    assert done.returncode == 0, done.log[-5000:]
    for site in (*group.sites, *group.solo):
        assert site.link() == f"venv.stacks/{stack_of('0.5.8')}"
        assert site.serves() == "0.5.8"


def test_a_node_does_not_switch_without_its_group(group):
    first, second = group.sites
    pids = [site.pid() for site in group.sites]
    done = group.deploy("0.5.9", "--limit", first.box.inventory_name)
    assert done.returncode != 0
    assert (f"{first.box.inventory_name}: not switched to {words('0.5.9')}: node(s) "
            f"{second.box.inventory_name} of this model's group") in done.log, done.log[-5000:]
    assert "nothing was changed" in done.log
    assert [site.pid() for site in group.sites] == pids
    for site in group.sites:
        assert site.link() == f"venv.stacks/{stack_of('0.5.8')}"
        assert site.stacks() == {stack_of("0.5.8")}  # refused before the build
        assert site.serves() == "0.5.8"


def test_one_node_crashing_at_load_rolls_back_every_node(group):
    first, second = group.sites
    second.cases(**{"0_5_9": "crash-load"})
    starts = [site.starts() for site in group.sites]
    (solo,) = group.solo
    solo_starts = solo.starts()
    done = group.deploy("0.5.9")
    (group.root / "rollback.log").write_text(done.log)  # shown in docs and reports
    assert done.returncode != 0
    failed_on = (f"failed on node(s) {second.box.inventory_name} of the group "
                 f"({', '.join(group.nodes)})")
    for site in group.sites:
        # Every node names both releases and the failed node, and serves the old release again.
        assert (f"{site.box.inventory_name}: upgrade from {words('0.5.8')} to {words('0.5.9')} "
                f"{failed_on}; rolled back to {words('0.5.8')} on every node of the group, "
                "which serves again") in done.log, done.log[-6000:]
        assert site.link() == f"venv.stacks/{stack_of('0.5.8')}"
        assert site.serves() == "0.5.8"
        record = site.record()
        assert record["trial"] is None
        assert set(record["failed"]) == {stack_of("0.5.9")}
        assert f"node {second.box.inventory_name}: sglang.service" in \
            record["failed"][stack_of("0.5.9")]["why"]
    assert "HeaderTooLarge" in done.log  # the journal lines of the failed start
    # Each node: the new release once (switched together), the old one again (rolled back).
    assert [site.starts() for site in group.sites] == [n + 2 for n in starts]
    # Both switch back in the one judging operation, together: each starts its rollback before
    # either one's old release serves again.
    judged = operation_of(done.log, "are judged together")
    starting = [judged.find(f"{name}: upgrade to {words('0.5.9')} {failed_on}") for name in
                group.nodes]
    assert -1 not in starting and max(starting) < judged.find("rolled back:"), judged[:3000]
    # The group's failure is the group's: the container serving a model alone, in the same
    # run, switched, was judged and finished its trial (one restart).
    assert f"{solo.box.inventory_name}: the upgrade to {words('0.5.9')} serves" in done.log, \
        done.log[-6000:]
    assert solo.link() == f"venv.stacks/{stack_of('0.5.9')}"
    assert solo.serves() == "0.5.9" and solo.starts() == solo_starts + 1
    assert solo.record()["trial"] is None and solo.record()["failed"] == {}
    assert f"[{solo.box.inventory_name}] Skipped" in operation_of(done.log, "are judged together")


def test_the_failed_set_is_refused_on_every_node(group):
    pids = [site.pid() for site in group.sites]
    done = group.deploy("0.5.9")
    assert done.returncode != 0
    assert f"the set {words('0.5.9')} failed as an upgrade on" in done.log, done.log[-5000:]
    assert [site.pid() for site in group.sites] == pids


def test_good_upgrade_switches_every_node_together(group):
    group.sites[1].cases()
    starts = [site.starts() for site in group.sites]
    done = group.deploy("0.5.10")
    assert done.returncode == 0, done.log[-5000:]
    assert [site.starts() for site in group.sites] == [n + 1 for n in starts]
    # Both links change in one operation, and both servers restart in the next one: no node
    # is skipped (a skipped node would switch alone, later, or not at all).
    for step in ("in one rename", "enabled and running"):
        lines = operation_of(done.log, step)
        assert "Skipped" not in lines
        # pyinfra pads a name to the longest in the run ("pvs-node-9" beside "pvs-solo-10").
        assert all(re.search(rf"\[{re.escape(name)}\] +Success", lines)
                   for name in group.nodes), lines
    for site in group.sites:
        assert site.link() == f"venv.stacks/{stack_of('0.5.10')}"
        assert site.serves() == "0.5.10"
        assert site.record()["trial"] is None
        assert (f"{site.box.inventory_name}: the upgrade to {words('0.5.10')} serves"
                in done.log)
