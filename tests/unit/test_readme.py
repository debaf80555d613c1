"""The user's documents stay true: docs/settings.md's table is group_data/all.py, README's set-up
is two commands, and every relative link between the documents resolves."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from pve_sglang.config import settings_table

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SETTINGS = (REPO / settings_table.DOC).read_text()
#: The documents a user or contributor reads, whose links must lead somewhere.
DOCUMENTS = sorted(
    [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "bench" / "README.md",
     REPO / "tests" / "fixtures" / "README.md", *(REPO / "docs").glob("*.md")]
)


def test_settings_table_matches_group_data():
    begin, end = SETTINGS.index(settings_table.BEGIN), SETTINGS.index(settings_table.END)
    assert SETTINGS[begin:end + len(settings_table.END)] == settings_table.markdown(), (
        f"{settings_table.DOC}'s settings table is stale: run `python -m pve_sglang.config.settings_table`"
    )


def test_every_default_has_a_description():
    assert [name for name, _, _, meaning in settings_table.rows() if not meaning] == []


def test_the_generator_writes_only_between_the_markers(tmp_path):
    doc = tmp_path / "settings.md"
    doc.write_text(f"before\n{settings_table.BEGIN}\nold table\n{settings_table.END}\nafter\n")
    assert settings_table.write(doc) is True
    assert doc.read_text() == f"before\n{settings_table.markdown()}\nafter\n"
    assert settings_table.write(doc) is False  # current: nothing to write


def test_the_generator_refuses_a_document_without_markers(tmp_path):
    doc = tmp_path / "settings.md"
    doc.write_text("no table here\n")
    with pytest.raises(ValueError, match="settings-table:begin"):
        settings_table.write(doc)
    assert doc.read_text() == "no table here\n"


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.strip().splitlines()]
    assert commands == ["make deploy", "make test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M), ci


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", m.group(1))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(document):
    broken = []
    for link in _links(document):
        target, _, anchor = link.partition("#")
        path = (document.parent / target).resolve() if target else document
        if not path.exists() or REPO not in path.parents and path != REPO:
            broken.append(f"{link}: no {path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(REPO)}")
    assert broken == []


def test_make_deploy_without_a_terminal_says_to_add_yes_and_runs_nothing(tmp_path):
    """pyinfra asks for Enter before it changes anything: with no terminal (a script, CI) that
    ended in an internal exception (EOFError). The Makefile says what to do, before pyinfra
    starts (a venv whose stamp is current, so make bootstraps nothing; a hosts file, so
    nothing is installed)."""
    cksum = subprocess.run(["cksum"], input=(REPO / "pyproject.toml").read_bytes(),
                           capture_output=True, check=True).stdout.split()[0].decode()
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / f".installed-{cksum}").touch()
    env = {**os.environ, "PVE_SGLANG_HOSTS": str(tmp_path / "hosts.yml")}
    done = subprocess.run(["make", "-s", "deploy", f"VENV={venv}"], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no terminal to confirm the changes on" in done.stderr and "ARGS=-y" in done.stderr
    assert "pyinfra" not in done.stdout  # nothing ran past the check
