"""Tests for pve_sglang/remote/autotune_patch.py against files taken from the real sglang wheels.

The wheels come from the ``sglang_wheel`` fixture (network tier): fetched once into
<repo>/.cache/wheels and reused; a download that fails on every try fails the test run instead
of skipping it.
"""

from __future__ import annotations

import ast
import functools
import os
import py_compile
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pve_sglang.remote import autotune_patch  # noqa: E402

MODEL_RUNNER = "srt/model_executor/model_runner.py"
BASE_RUNNER = "srt/model_executor/runner/base_runner.py"
AUTOTUNE = "srt/model_executor/runner/flashinfer_autotune.py"

# version -> (candidate file holding the MoE list, 1-based line of its "[") ; None = no such list
PATCHABLE = {
    "0.5.7": (MODEL_RUNNER, 1687),
    "0.5.8": (MODEL_RUNNER, 1705),
    "0.5.9": (MODEL_RUNNER, 1838),
    "0.5.10": (MODEL_RUNNER, 2072),
    "0.5.11": (MODEL_RUNNER, 2395),
    "0.5.12": (MODEL_RUNNER, 2525),
    "0.5.12.post1": (MODEL_RUNNER, 2532),
}
UPSTREAM = {
    "0.5.13": (MODEL_RUNNER, 2436),
    "0.5.14": (BASE_RUNNER, 274),
    "0.5.15": (AUTOTUNE, 59),
    "0.5.16": (AUTOTUNE, 59),
    "0.5.23": (AUTOTUNE, 117),
}
REFUSED = ["0.5.6"]
TODO_LINE = "# TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed."
DISABLED_LINE = '# "flashinfer_cutlass",'
ROUTED_DISABLED = '# "flashinfer_trtllm_routed",'


def wheel_members(wheel: Path) -> dict[str, bytes]:
    """Return the version files and candidate files of WHEEL, keyed by path under sglang/."""
    wanted = {"version.py", "_version.py", *autotune_patch.CANDIDATES}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        return {name: archive.read(f"sglang/{name}") for name in wanted if f"sglang/{name}" in names}


@pytest.fixture(scope="module")
def members(sglang_wheel):
    """``members(version)``: the version files and candidate files of the real wheel."""
    return functools.lru_cache(maxsize=None)(lambda version: wheel_members(sglang_wheel(version)))


@pytest.fixture(scope="module")
def package(members):
    """``package(version, root)``: lay the wheel's needed files out as root/VERSION/sglang and
    return that package dir."""
    def lay_out(version: str, root: Path) -> Path:
        pkg = root / version / "sglang"
        for name, data in members(version).items():
            (pkg / name).parent.mkdir(parents=True, exist_ok=True)
            (pkg / name).write_bytes(data)
        return pkg

    return lay_out


def cli(*args: str, cwd: Path = REPO, script: str | None = None) -> tuple[int, str]:
    """Run the patcher as the deploy does and return (exit status, stdout)."""
    entry = [script] if script else ["-m", "pve_sglang.remote.autotune_patch"]
    done = subprocess.run([sys.executable, *entry, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


def snapshot(pkg: Path) -> dict[str, tuple[bytes, int]]:
    """Return every file under pkg with its bytes and mtime."""
    return {str(p.relative_to(pkg)): (p.read_bytes(), p.stat().st_mtime_ns) for p in pkg.rglob("*") if p.is_file()}


def moe_entries(source: str) -> list[str]:
    """Return the string entries of the MoE backend list in the autotune gate (parsed independently)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == "should_run_flashinfer_autotune":
            for inner in ast.walk(node):
                if isinstance(inner, ast.List) and any(
                    isinstance(e, ast.Constant) and e.value == "flashinfer_trtllm" for e in inner.elts
                ):
                    return [e.value for e in inner.elts]
    raise AssertionError("no MoE list found")


@pytest.mark.parametrize("version", list(PATCHABLE) + list(UPSTREAM))
def test_list_location(version: str, tmp_path: Path, package) -> None:
    """The list is found in the expected file at the expected line, with the wheel's version."""
    pkg = package(version, tmp_path)
    relative, line = {**PATCHABLE, **UPSTREAM}[version]
    path, span, _ = autotune_patch.locate(pkg)
    assert path == pkg / relative
    assert span is not None and span.start == line
    assert autotune_patch.read_version(pkg) == version


@pytest.mark.parametrize("version", list(PATCHABLE))
def test_patchable_release(version: str, tmp_path: Path, package) -> None:
    """check -> needs-patch, apply -> applied, then already-patched without touching anything."""
    pkg = package(version, tmp_path)
    target = pkg / PATCHABLE[version][0]
    original = target.read_bytes()
    target.chmod(0o640)
    cache = target.parent / "__pycache__"
    cache.mkdir()
    stale = cache / f"{target.stem}.cpython-311.pyc"
    sibling = cache / f"{target.stem}_kv_cache_mixin.cpython-311.pyc"
    stale.write_bytes(b"stale")
    sibling.write_bytes(b"other module")

    before = snapshot(pkg)
    assert cli("--check", str(pkg)) == (1, "needs-patch\n")
    assert snapshot(pkg) == before

    assert cli("--apply", str(pkg)) == (0, "applied\n")
    patched = target.read_bytes()
    backup = target.with_name(target.name + ".orig")
    assert backup.read_bytes() == original
    assert not stale.exists() and sibling.exists()
    assert target.stat().st_mode & 0o7777 == 0o640
    assert not list(target.parent.glob(f".{target.name}.*"))

    old_lines, new_lines = original.decode().splitlines(), patched.decode().splitlines()
    todo = [i for i, line in enumerate(old_lines) if line.strip() == TODO_LINE]
    assert len(todo) == 1
    indent = old_lines[todo[0]][: len(old_lines[todo[0]]) - len(old_lines[todo[0]].lstrip())]
    assert old_lines[todo[0] + 1] == indent + DISABLED_LINE
    assert new_lines == (
        old_lines[: todo[0]]
        + [indent + '"flashinfer_cutlass",  # pve-sglang: autotune enabled']
        + old_lines[todo[0] + 2 :]
    )
    py_compile.compile(str(target), cfile=str(tmp_path / "check.pyc"), doraise=True)
    entries = moe_entries(patched.decode())
    assert "flashinfer_cutlass" in entries
    assert "flashinfer_trtllm_routed" not in entries
    assert patched.decode().count(ROUTED_DISABLED) == original.decode().count(ROUTED_DISABLED)

    after = snapshot(pkg)
    assert cli("--check", str(pkg)) == (0, "already-patched\n")
    assert cli("--apply", str(pkg)) == (0, "already-patched\n")
    assert snapshot(pkg) == after


def test_routed_stays_commented(tmp_path: Path, package) -> None:
    """0.5.10 to 0.5.12.post1 comment out flashinfer_trtllm_routed too; it stays so."""
    for version in ("0.5.10", "0.5.12.post1"):
        pkg = package(version, tmp_path)
        target = pkg / MODEL_RUNNER
        assert ROUTED_DISABLED in target.read_text()
        assert cli("--apply", str(pkg)) == (0, "applied\n")
        assert ROUTED_DISABLED in target.read_text()
        assert "flashinfer_trtllm_routed" not in moe_entries(target.read_text())


@pytest.mark.parametrize("version", list(UPSTREAM))
def test_upstream_release(version: str, tmp_path: Path, package) -> None:
    """Releases that list flashinfer_cutlass themselves are reported and left alone."""
    pkg = package(version, tmp_path)
    before = snapshot(pkg)
    assert cli("--check", str(pkg)) == (0, "upstream-enabled\n")
    assert cli("--apply", str(pkg)) == (0, "upstream-enabled\n")
    assert snapshot(pkg) == before
    assert "flashinfer_cutlass" in moe_entries((pkg / UPSTREAM[version][0]).read_text())


@pytest.mark.parametrize("version", REFUSED)
@pytest.mark.parametrize("mode", ["--check", "--apply"])
def test_refused_release(version: str, mode: str, tmp_path: Path, package) -> None:
    """A release without the MoE list is unrecognised and nothing changes."""
    pkg = package(version, tmp_path)
    before = snapshot(pkg)
    status, out = cli(mode, str(pkg))
    assert status == 3
    assert out == f"unrecognised: {version} {pkg / MODEL_RUNNER}\n"
    assert snapshot(pkg) == before


def doctor(source: str, how: str) -> str:
    """Return the 0.5.8 model_runner.py source changed in one unexpected way."""
    pair = f"            {TODO_LINE}\n            {DISABLED_LINE}\n"
    assert source.count(pair) == 1
    if how == "todo-text":
        return source.replace(TODO_LINE, "# TODO: flashinfer_cutlass is broken.")
    if how == "other-backend":
        return source.replace(DISABLED_LINE, '# "flashinfer_cutlass_v2",')
    if how == "indent":
        return source.replace(pair, f"            {TODO_LINE}\n        {DISABLED_LINE}\n")
    if how == "twice":
        return source.replace(pair, pair + pair)
    if how == "outside-list":
        moved = source.replace(pair, "")
        gate = "        ]:\n            return False\n"
        assert moved.count(gate) == 1
        return moved.replace(gate, gate + pair)
    if how == "no-anchor":
        return source.replace('            "flashinfer_trtllm",\n            "flashinfer_mxfp4",\n', "")
    raise ValueError(how)


@pytest.mark.parametrize("how", ["todo-text", "other-backend", "indent", "twice", "outside-list", "no-anchor"])
def test_doctored_file_refused(how: str, tmp_path: Path, package) -> None:
    """A 0.5.8 file whose commented pair is not as expected is unrecognised and untouched."""
    pkg = package("0.5.8", tmp_path)
    target = pkg / MODEL_RUNNER
    doctored = doctor(target.read_text(), how)
    assert doctored != target.read_text()
    target.write_text(doctored)
    before = snapshot(pkg)
    for mode in ("--check", "--apply"):
        assert cli(mode, str(pkg)) == (3, f"unrecognised: 0.5.8 {target}\n")
    assert snapshot(pkg) == before


def test_missing_package_dir(tmp_path: Path) -> None:
    """A directory without sglang files is unrecognised, naming the candidates."""
    status, out = cli("--apply", str(tmp_path / "nothing"))
    assert status == 3
    assert out.startswith("unrecognised: unknown ") and out.count(",") == len(autotune_patch.CANDIDATES) - 1


def test_usage_error(tmp_path: Path) -> None:
    """Exactly one of --check and --apply is required."""
    assert cli(str(tmp_path))[0] == 2
    assert cli("--check", "--apply", str(tmp_path))[0] == 2


def test_runs_as_plain_file(tmp_path: Path, package) -> None:
    """The module works when uploaded alone and run as a file, outside the repo."""
    script = tmp_path / "autotune_patch.py"
    shutil.copy(REPO / "pve_sglang" / "remote" / "autotune_patch.py", script)
    pkg = package("0.5.12.post1", tmp_path)
    assert cli("--check", str(pkg), cwd=tmp_path, script=str(script)) == (1, "needs-patch\n")
    assert cli("--apply", str(pkg), cwd=tmp_path, script=str(script)) == (0, "applied\n")
    assert cli("--apply", str(pkg), cwd=tmp_path, script=str(script)) == (0, "already-patched\n")


def test_stale_backup_is_refreshed_once(tmp_path: Path, package) -> None:
    """A .orig left by an earlier install is replaced by the current original, then kept."""
    pkg = package("0.5.9", tmp_path)
    target = pkg / MODEL_RUNNER
    original = target.read_bytes()
    backup = target.with_name(target.name + ".orig")
    backup.write_bytes(b"from an older install\n")
    assert cli("--apply", str(pkg)) == (0, "applied\n")
    assert backup.read_bytes() == original
    stamp = backup.stat().st_mtime_ns
    assert cli("--apply", str(pkg)) == (0, "already-patched\n")
    assert backup.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("fail_backup", [False, True])
def test_failing_write_leaves_original(
    fail_backup: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], package,
) -> None:
    """If replacing the file (or writing the backup) fails, the original stays byte-identical."""
    pkg = package("0.5.8", tmp_path)
    target = pkg / MODEL_RUNNER
    before = snapshot(pkg)
    real_replace = os.replace

    def failing_replace(src: str, dst: str) -> None:
        if fail_backup or Path(dst) == target:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(autotune_patch.os, "replace", failing_replace)
    assert autotune_patch.main(["--apply", str(pkg)]) == 4
    assert capsys.readouterr().out.startswith(f"failed: 0.5.8 {target}: ")
    assert target.read_bytes() == before[MODEL_RUNNER][0]
    assert not list(target.parent.glob(f".{target.name}*"))
    assert target.with_name(target.name + ".orig").exists() != fail_backup

    monkeypatch.setattr(autotune_patch.os, "replace", real_replace)
    assert autotune_patch.main(["--apply", str(pkg)]) == 0
    assert capsys.readouterr().out == "applied\n"


NESTED_DEFS = '''
def should_run_flashinfer_autotune(): pass
class Runner:
    def _should_run_flashinfer_autotune(self):
        def should_run_flashinfer_autotune(): pass
    if True:
        async def should_run_flashinfer_autotune(): pass
    else:
        def _should_run_flashinfer_autotune(): pass
try:
    def should_run_flashinfer_autotune(): pass
except Exception:
    def should_run_flashinfer_autotune(): pass
else:
    def should_run_flashinfer_autotune(): pass
finally:
    with open(x) as f:
        for y in z:
            while y:
                def _should_run_flashinfer_autotune(): pass
match x:
    case 1:
        def should_run_flashinfer_autotune(): pass
f = lambda: should_run_flashinfer_autotune
'''


@pytest.mark.parametrize("version", [*PATCHABLE, *UPSTREAM, *REFUSED])
def test_the_autotune_functions_are_those_ast_walk_finds(version: str, members) -> None:
    """Only statements are visited for the gate's definitions: the same ones (each once) as
    walking every node, in each candidate file of the real wheels and at every nesting."""
    def by_walk(tree: ast.AST) -> list[ast.AST]:
        return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name in autotune_patch.FUNCTION_NAMES]

    sources = [data.decode() for name, data in members(version).items() if name in autotune_patch.CANDIDATES]
    if version == "0.5.6":
        sources.append(NESTED_DEFS)
    for source in sources:
        tree = ast.parse(source)
        found = autotune_patch.autotune_functions(tree)
        assert sorted(map(id, found)) == sorted(map(id, by_walk(tree)))
    if version == "0.5.6":
        assert len(autotune_patch.autotune_functions(ast.parse(NESTED_DEFS))) == 10
