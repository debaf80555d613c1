"""The README's settings table, generated from ``group_data/all.py`` (names, defaults, comments).

``python -m pve_sglang.config.settings_table`` prints it; a test checks README.md carries it as printed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pve_sglang.project import GROUP_DATA, project_file
from pve_sglang.config.settings import HOST_FIELDS

BEGIN = "<!-- settings-table:begin -->"
END = "<!-- settings-table:end -->"


def _comments_above(lines: list[str], lineno: int) -> str:
    """The ``#`` comment lines right above line LINENO (1-based), joined."""
    text = []
    index = lineno - 2
    while index >= 0 and lines[index].lstrip().startswith("#") and "---" not in lines[index]:
        text.insert(0, lines[index].lstrip()[1:].strip())
        index -= 1
    return " ".join(text)


def rows(path: Path | None = None) -> list[tuple[str, str, str, str]]:
    """(name, level, default, meaning) for each default of PATH (``group_data/all.py``), in order."""
    source = (project_file(GROUP_DATA) if path is None else path).read_text()
    lines = source.splitlines()
    result = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            default = ast.get_source_segment(source, node.value) or ""
            level = "host" if name in HOST_FIELDS else "container"
            meaning = _comments_above(lines, node.lineno)
            result.append((name, level, default, meaning))
    return result


def markdown(path: Path | None = None) -> str:
    """The table as Markdown, between its markers."""
    out = [BEGIN, "| setting | set on | default | meaning |", "| --- | --- | --- | --- |"]
    for name, level, default, meaning in rows(path):
        cell = default.replace("|", "\\|")
        out.append(f"| `{name}` | {level} | `{cell}` | {meaning.replace('|', '/')} |")
    out.append(END)
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
