"""
Where the deploy's own files come from: the checkout.

The project runs from a checkout of its repository (``pyinfra inventory.py deploy.py``, with
``pip install -e .`` for the connectors' entry points). Two kinds of its files are not Python
modules of the package and stay at the checkout's root, where pyinfra's layout puts them:

+ ``group_data/all.py``: the defaults. pyinfra loads ``group_data/`` next to the inventory; the
  settings models read the same file (``load_defaults``), so the defaults live once;
+ ``templates/``: the Jinja2 templates of the files the deploy writes (``sglang.service.j2``,
  ``sglang.env.j2``, ``nvidia-uvm.conf.j2``, ...), for ``server.unit_text`` and ``files.template``.

The library finds them through ``project_file`` alone. It resolves against the checkout that
holds this package (not the current directory), so pyinfra may be started from anywhere; an
installed copy of the package without its checkout (a wheel) fails with a message naming the
missing file.
"""

from __future__ import annotations

import ast
import os
import runpy
from pathlib import Path
from typing import Any

#: The checkout's root: the folder that holds ``pve_sglang/``, ``group_data/`` and ``templates/``.
ROOT = Path(__file__).resolve().parent.parent

#: The defaults, relative to ROOT.
GROUP_DATA = "group_data/all.py"
#: The templates' folder, relative to ROOT.
TEMPLATES = "templates"


def project_file(relative: str) -> Path:
    """The checkout's file or folder RELATIVE (``"templates/sglang.service.j2"``), as an absolute
    path. FileNotFoundError when it is not there: pve_sglang used outside its checkout."""
    path = ROOT / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{relative} is not in {ROOT}: pve_sglang reads its defaults (group_data/) and "
            "templates (templates/) from the checkout that holds the package; run the deploy "
            "from a checkout of the repository (pip install -e .), not from an installed wheel"
        )
    return path


def template(name: str) -> str:
    """The template NAME in ``templates/`` as a path string, for ``files.template(src=...)``."""
    return str(project_file(f"{TEMPLATES}/{name}"))


def load_defaults(path: Path | None = None) -> dict[str, Any]:
    """Read the defaults from PATH (the checkout's ``group_data/all.py``), as pyinfra itself does:
    what an import binds there (a version rule's constant) is no setting."""
    path = project_file(GROUP_DATA) if path is None else path
    imported = imported_names(path.read_text())
    return {k: v for k, v in runpy.run_path(str(path)).items()
            if not k.startswith("__") and k not in imported}


def imported_names(source: str) -> set[str]:
    """The names the imports of SOURCE bind."""
    return {(alias.asname or alias.name).split(".")[0] for node in ast.parse(source).body
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def cache_dir() -> Path:
    """This machine's pve-sglang cache: ``$PVE_SGLANG_CACHE``, else ``~/.cache/pve-sglang``."""
    if os.environ.get("PVE_SGLANG_CACHE"):
        return Path(os.environ["PVE_SGLANG_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pve-sglang"
