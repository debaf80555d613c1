"""The settings table of ``docs/settings.md``, generated from ``group_data/all.py`` (names,
defaults, comments).

``python -m pve_sglang.config.settings_table`` writes it into ``docs/settings.md``, between its
markers (``--print`` prints it instead); a test checks the file carries it as generated.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from pve_sglang.project import GROUP_DATA, load_defaults, project_file
from pve_sglang.config.gateway import GATEWAY_FIELDS
from pve_sglang.config.monitoring import MONITORING_FIELDS
from pve_sglang.config.settings import HOST_FIELDS

BEGIN = "<!-- settings-table:begin -->"
END = "<!-- settings-table:end -->"
#: The document that carries the table, relative to the checkout's root.
DOC = "docs/settings.md"


def _comments_above(lines: list[str], lineno: int) -> str:
    """The ``#`` comment lines right above line LINENO (1-based), joined."""
    text: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].lstrip().startswith("#") and "---" not in lines[index]:
        text.insert(0, lines[index].lstrip()[1:].strip())
        index -= 1
    return " ".join(text)


def rows(path: Path | None = None) -> list[tuple[str, str, str, str]]:
    """(name, level, default, meaning) for each default of PATH (``group_data/all.py``), in order."""
    path = project_file(GROUP_DATA) if path is None else path
    source = path.read_text()
    lines = source.splitlines()
    result = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            default = ast.get_source_segment(source, node.value) or ""
            if isinstance(node.value, ast.Name):  # a constant from its home: its value
                value = load_defaults(path)[name]
                default = f'"{value}"' if isinstance(value, str) else repr(value)
            level = ("host" if name in HOST_FIELDS else
                     "gateway" if name in GATEWAY_FIELDS else
                     "monitoring" if name in MONITORING_FIELDS else "container")
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


def replace_table(text: str, table: str) -> str:
    """TEXT with its part from BEGIN to END (both markers included) replaced by TABLE."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"no {BEGIN} ... {END} in the text: the table has nowhere to go")
    return text[:begin] + table + text[end + len(END):]


def write(doc: Path | None = None) -> bool:
    """Write the table into DOC (the checkout's ``docs/settings.md``); True when it changed."""
    doc = project_file(DOC) if doc is None else doc
    text = doc.read_text()
    new = replace_table(text, markdown())
    if new != text:
        doc.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pve_sglang.config.settings_table",
                                     description=f"Write the settings table into {DOC}.")
    parser.add_argument("--print", action="store_true", help="print the table instead")
    if parser.parse_args(argv).print:
        print(markdown())
    else:
        print(f"{DOC}: {'table written' if write() else 'table already current'}")


if __name__ == "__main__":
    main()
