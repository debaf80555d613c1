"""Print the ``--flag`` spellings the installed sglang release accepts, without importing it.

Run by the container's venv Python (uploaded to ``remote.path(FLAG_LISTER)``)::

    python sglang_flags.py [SGLANG_PACKAGE_DIR]

It prints ``version V`` and then the release's flags, one a line (``server.command.
parse_flags_output`` reads them). Without SGLANG_PACKAGE_DIR it finds the sglang of the Python
that runs it. The flags are read statically (``ast``) from ``sglang/srt/server_args.py`` and
``sglang/srt/arg_groups/**/*.py``: importing sglang needs torch and CUDA. Standard library only:
``server.command.known_flags`` imports these functions for the same answer on this machine.
"""

import ast
import re
import sys
from pathlib import Path


def _call_name(node):
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _is_namespace(cls, registered=()):
    """A class whose annotated fields become flags: passed to add_cli_args_from_dataclass
    (0.5.13-0.5.16 ServerArgs) or an ``arg_groups/fields`` namespace that sets ``_NS_PATH``."""
    if cls.name in registered:
        return True
    for stmt in cls.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in targets):
            return True
    return False


def _with_negations(names, action):
    """argparse.BooleanOptionalAction adds ``--no-NAME`` for every ``--NAME``."""
    attr = action.attr if isinstance(action, ast.Attribute) else getattr(action, "id", None)
    if attr != "BooleanOptionalAction":
        return set(names)
    return set(names) | {"--no-" + name[2:] for name in names if name.startswith("--")}


def _field_flags(stmt):
    """CLI spellings of one ``name: A[T, "help" | Arg(...)]`` field, as arg_utils derives them."""
    annotation = stmt.annotation
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if not isinstance(annotation, ast.Subscript):
        return set()
    base = annotation.value
    base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
    if base_name not in ("A", "Annotated"):
        return set()
    parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    default = "--" + stmt.target.id.replace("_", "-")
    for part in parts[1:]:
        if isinstance(part, ast.Call) and _call_name(part) == "Arg":
            keywords = {kw.arg: kw.value for kw in part.keywords if kw.arg}
            no_cli = keywords.get("no_cli")
            if isinstance(no_cli, ast.Constant) and no_cli.value is True:
                return set()
            cli_name = keywords.get("cli_name")
            names = {cli_name.value if isinstance(cli_name, ast.Constant) and cli_name.value else default}
            aliases = keywords.get("aliases")
            if isinstance(aliases, (ast.List, ast.Tuple)):
                names |= {e.value for e in aliases.elts if isinstance(e, ast.Constant)}
            return _with_negations(names, keywords.get("action"))
        if isinstance(part, (ast.JoinedStr, ast.BinOp)) or (
            isinstance(part, ast.Constant) and isinstance(part.value, str)
        ):
            return {default}
    return set()


def flags_in_source(text):
    """``--flag`` spellings a source file registers: add_argument() calls and namespace fields."""
    flags = set()
    tree = ast.parse(text)
    registered = {
        node.args[1].id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _call_name(node) == "add_cli_args_from_dataclass"
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) == "add_argument":
            names = {
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--")
            }
            action = next((kw.value for kw in node.keywords if kw.arg == "action"), None)
            flags |= _with_negations(names, action)
        elif isinstance(node, ast.ClassDef) and _is_namespace(node, registered):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    flags |= _field_flags(stmt)
    return flags


def _sglang_dir(package_dir):
    package_dir = Path(package_dir)
    for candidate in (package_dir, package_dir / "sglang"):
        if (candidate / "srt" / "server_args.py").is_file():
            return candidate
    raise FileNotFoundError(f"no sglang/srt/server_args.py under {package_dir}")


def _release_of(sglang_dir):
    pattern = r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]"
    for name in ("_version.py", "version.py"):  # version.py holds the literal up to 0.5.6
        version_file = sglang_dir / name
        if version_file.is_file():
            text = version_file.read_text()
            match = re.search(pattern, text, re.M)
            if match and "import __version__" not in text:
                return match.group(1)
    for metadata in sorted(sglang_dir.parent.glob("sglang-*.dist-info/METADATA")):
        match = re.search(r"^Version:\s*(\S+)", metadata.read_text(errors="replace"), re.M)
        if match:
            return match.group(1)
    return "unknown"


def flag_sources(sglang_dir):
    """The files of the release in SGLANG_DIR whose flags are read, in order."""
    srt = sglang_dir / "srt"
    return [srt / "server_args.py"] + sorted((srt / "arg_groups").rglob("*.py"))


def release_flags(package_dir):
    """The release in ``package_dir`` (the ``sglang`` package or the folder holding it): its
    version and its set of ``--flag`` spellings (``--help`` included)."""
    sglang_dir = _sglang_dir(package_dir)
    flags = {"--help"}
    for path in flag_sources(sglang_dir):
        flags |= flags_in_source(path.read_text())
    return _release_of(sglang_dir), flags


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args:
        package_dir = args[0]
    else:
        import importlib.util

        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("sglang is not installed for " + sys.executable)
        package_dir = list(spec.submodule_search_locations)[0]
    version, flags = release_flags(package_dir)
    print("version " + version)
    for flag in sorted(flags):
        print(flag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
