"""The pure parts of the deploy-cost benchmark (devtools.deploy_cost): pyinfra's JSON,
command counting, statistics, the report; and bench/deploy_cost.py redrawing saved results.

No containers and no timing asserts: the benchmark itself is ``make bench``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.deploy_cost.counting import (
    overlap,
    parse_run_json,
    restart_commands,
    stage_seconds,
    summarise_commands,
)
from devtools.deploy_cost.fleet import hosts_file
from devtools.deploy_cost.plot import plot
from devtools.deploy_cost.report import build_report, print_table, spread

REPO = Path(__file__).resolve().parents[2]


def _op(name, success=(), no_change=(), error=()):
    return {"op_hash": name, "name": name, "names": [name], "args": [], "hosts": 1,
            "success": list(success), "error": list(error), "no_change": list(no_change)}


def test_parse_run_json_counts_changes_and_skips_leading_text():
    doc = {
        "plan": [{"op_hash": "a"}, {"op_hash": "b"}],
        "results": {
            "operations": [
                _op("Create container", success=["@local"]),
                _op("Proxmox hosts done", no_change=["@local", "@lxc/c1"]),
                _op("Base packages", error=["@lxc/c1"]),
            ],
            "totals": {},
            "failed_hosts": ["@lxc/c1"],
        },
    }
    result = parse_run_json("some log line\n" + json.dumps(doc))
    assert result["changes"] == 1
    assert result["changed"] == ["@local: Create container"]
    assert result["no_change"] == 2
    assert result["errors"] == 1
    assert result["failed"] == ["@lxc/c1: Base packages"]
    assert result["failed_hosts"] == ["@lxc/c1"]
    assert result["planned"] == 2


def test_parse_run_json_without_a_document():
    with pytest.raises(ValueError):
        parse_run_json("--> pyinfra error: No hosts remaining!")


def _cmd(kind, name, command="true", host="@lxc/c1", op=None, args="", stage="Execute",
         start=0.0, seconds=0.01):
    return {"host": host, "kind": kind, "name": name, "args": args, "op": op, "stage": stage,
            "start_s": start, "seconds": seconds, "rc": 0, "command": command}


def test_restart_commands_ignore_facts():
    commands = [
        _cmd("fact", "SystemdStatus", "systemctl show sglang.service -p ActiveState"),
        _cmd("fact", "Command", "systemctl restart looks-like-it-but-is-a-fact"),
        _cmd("op", "sglang.service running", "systemctl restart sglang.service"),
        _cmd("op", "Container running", "lxc-stop -P /x -n c1 -t 120 && lxc-start -P /x -n c1"),
        _cmd("op", "Container 105 running", "pct reboot 105"),
        _cmd("op", "Reload systemd units", "systemctl daemon-reload"),
        _cmd("op", "Enable at boot", "systemctl enable sglang.service"),
    ]
    assert restart_commands(commands) == [
        "systemctl restart sglang.service",
        "lxc-stop -P /x -n c1 -t 120 && lxc-start -P /x -n c1",
        "pct reboot 105",
    ]


def test_summarise_commands_groups_and_finds_repeats():
    commands = [
        _cmd("connector", "container state (lxc-info)", host="@lxc/c1", stage="Prepare"),
        _cmd("fact", "NvidiaDriverVersion", host="@local", stage="Prepare"),
        _cmd("fact", "NvidiaDriverVersion", host="@local", stage="Prepare"),
        _cmd("fact", "File", args="path=/a", op="Upload a", seconds=0.02),
        _cmd("fact", "Sha1File", args="path=/a", op="Upload a", seconds=0.03),
        _cmd("fact", "File", args="path=/b", op="Upload b"),
    ]
    summary = summarise_commands(commands)
    assert summary["commands"] == 6
    assert summary["by_kind"] == {"connector": 1, "fact": 5}
    assert summary["by_stage"] == {"Prepare": 3, "Execute": 3}
    assert summary["by_host"] == {"@lxc/c1": 4, "@local": 2}
    facts = {row["name"]: row["commands"] for row in summary["by_fact"]}
    assert facts == {"File": 2, "NvidiaDriverVersion": 2, "Sha1File": 1}
    ops = {row["name"]: row["commands"] for row in summary["by_operation"]}
    assert ops == {"Upload a": 2, "Upload b": 1, "(outside operations) NvidiaDriverVersion": 2,
                   "(outside operations) container state (lxc-info)": 1}
    assert summary["repeated_facts"] == [
        {"host": "@local", "fact": "NvidiaDriverVersion", "args": "", "times": 2}
    ]


def test_stage_seconds_and_overlap():
    stages = [["Connect", 0.5], ["Prepare", 0.6], ["Execute", 1.0], ["Disconnect", 3.0],
              ["End", 3.1]]
    assert stage_seconds(stages) == {
        "Startup": 0.5, "Connect": 0.1, "Prepare": 0.4, "Execute": 2.0, "Disconnect": 0.1,
    }
    # Two commands at once, then one alone: 3 command-seconds in 2 busy seconds.
    commands = [_cmd("fact", "A", start=0.0, seconds=1.0), _cmd("fact", "B", start=0.0, seconds=1.0),
                _cmd("fact", "C", start=1.0, seconds=1.0)]
    assert overlap(commands, "Execute") == 1.5
    assert overlap(commands, "Prepare") == 0.0


def test_spread():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0,
                                              "range_pct": 100.0, "n": 3}


def test_hosts_file_is_valid_for_the_deploy(tmp_path):
    from pve_sglang.hosts_file import build_groups, read_hosts_file

    path = tmp_path / "hosts.yml"
    hosts_file(path, tmp_path / "lxc", tmp_path / "rootfs.tar.zst", tmp_path / "wh",
                     ["b-1", "b-2"])
    pve_hosts, containers = build_groups(read_hosts_file(path))
    assert [name for name, _ in pve_hosts] == ["@local"]
    assert [name for name, _ in containers] == ["@lxc/b-1", "@lxc/b-2"]
    data = dict(containers)["@lxc/b-1"]
    assert data["stack_install"] == "sglang-no-deps"
    assert data["wheelhouse"] == "/opt/wheelhouse"
    assert data["lxc_path"] == str(tmp_path / "lxc")


def _run(n, wall, changes=0):
    commands = [_cmd("fact", "File", host=f"@lxc/c{i}", op="Upload", args=f"path=/{i}")
                for i in range(n) for _ in range(3)]
    commands.append(_cmd("connector", "container state (lxc-info)", stage="Prepare"))
    return {
        "containers": n, "wall_s": wall, "cpu_s": wall * 0.9, "cpu_pyinfra_s": wall * 0.4,
        "cpu_commands_s": wall * 0.5, "load_before": 1.0, "command_seconds": 0.1,
        "changes": changes, "no_change": 10, "operations": 10, "changed": [],
        "commands": len(commands),
        "commands_by_kind": {"fact": 3 * n, "connector": 1}, "restart_commands": [],
        "stage_s": {"Startup": 0.5, "Prepare": 0.2, "Execute": wall - 0.8, "Exit": 0.1},
        "prepare_overlap": 1.0, "execute_overlap": 1.0, "_commands": commands,
    }


def test_report_table_and_plot_from_synthetic_runs(tmp_path, capsys):
    first = {n: _run(n, 10.0 * n, changes=5 * n) for n in (1, 2, 4)}
    noop = {n: [_run(n, w * n) for w in (1.0, 1.2, 1.1)] for n in (1, 2, 4)}
    report = build_report(first, noop, {1: True, 2: True, 4: True},
                                {"machine": "test", "reps": 3, "git_commit": "abc"})
    assert report["noop"]["1"]["wall_s"]["median"] == 1.1
    assert report["noop"]["4"]["stage_s_median_run"]["Execute"] == pytest.approx(4 * 1.1 - 0.8)
    assert report["ratios"]["noop_4_over_1"] == 4.0
    assert report["ratios"]["noop_over_first_1"] == 0.11
    goals = report["goals"]
    assert goals["noop_commands_1"]["met"] and goals["noop_changes"]["met"]
    assert goals["noop_restarts"]["met"] and not goals["noop_4_over_1"]["met"]
    assert '"_commands"' not in json.dumps(report)  # the raw command lists stay out
    plot(report, tmp_path / "cost.png")
    assert (tmp_path / "cost.png").stat().st_size > 10_000
    print_table(report)
    assert "MISSED" in capsys.readouterr().out


def test_replot_redraws_saved_results(tmp_path):
    """The command line, end to end without containers: --replot redraws the figure and the table."""
    saved = tmp_path / "deploy_cost.json"
    saved.write_text((REPO / "bench" / "results" / "deploy_cost.json").read_text())
    result = subprocess.run([sys.executable, str(REPO / "bench" / "deploy_cost.py"), "--replot",
                             str(saved)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "goal noop_commands_1" in result.stdout
    assert (tmp_path / "deploy_cost.png").stat().st_size > 10_000
