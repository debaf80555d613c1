"""README.md stays true: its settings table is group_data/all.py, its set-up is two commands."""

import re
from pathlib import Path

from pve_sglang.config import settings_table

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_settings_table_matches_group_data():
    begin, end = README.index(settings_table.BEGIN), README.index(settings_table.END)
    assert README[begin:end + len(settings_table.END)] == settings_table.markdown(), (
        "README's settings table is stale: paste `python -m pve_sglang.config.settings_table`"
    )


def test_every_default_has_a_description():
    assert [name for name, _, _, meaning in settings_table.rows() if not meaning] == []


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.strip().splitlines()]
    assert commands == ["make deploy", "make test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M), ci
