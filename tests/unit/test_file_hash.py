"""A file's digest is written once (``remote/file_hash.py``): the wheel store's manifest, the
GPU kit's parts and the model fetcher's check all take it, and it gives what the real tools give
that check those digests elsewhere (``sha256sum -c`` on the wheel store's manifest, the hub's
git blob id, ``git hash-object``), at the edges of its block size."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from pve_sglang.remote import file_hash
from pve_sglang.remote.file_hash import CHUNK, file_digest

ROOT = Path(file_hash.__file__).resolve().parents[2]
#: The code that hashes a file: the deploy, its entry points and the device kit. The stand-ins
#: of tests/ (the stand-in hub) hash on their own on purpose: a second, independent reckoning.
HASHING_CODE = sorted({*ROOT.glob("pve_sglang/**/*.py"), *ROOT.glob("tasks/*.py"),
                       *ROOT.glob("*.py"), *ROOT.glob("tests/device/*.py"),
                       *ROOT.glob("devtools/**/*.py"), *ROOT.glob("bench/**/*.py")})

SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK]


@pytest.fixture(scope="module", params=SIZES, ids=lambda size: f"{size}B")
def sized(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sized") / "file.bin"
    pattern = bytes(range(251))  # a period that does not divide the block: blocks differ
    path.write_bytes((pattern * (request.param // len(pattern) + 1))[:request.param])
    return path


def test_the_sha256_is_what_sha256sum_checks_the_wheel_store_with(sized):
    done = subprocess.run(["sha256sum", str(sized)], capture_output=True, text=True, check=True)
    assert file_digest(sized) == done.stdout.split()[0]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_git_blob_id_is_what_git_hash_object_gives(sized):
    done = subprocess.run(["git", "hash-object", "--no-filters", str(sized)],
                          capture_output=True, text=True, check=True)
    assert file_digest(sized, git_blob=True) == done.stdout.strip()


def streamed_hashes(path: Path) -> list[int]:
    """The lines of PATH where a digest is made to be fed in blocks (``hashlib.sha256()`` with
    no data) or a git blob header is hashed: a file's digest reckoned again."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "hashlib"):
            continue
        header = ast.unparse(node.args[0]) if node.args else ""
        if not node.args or "blob " in header:
            lines.append(node.lineno)
    return lines


def test_no_other_module_hashes_a_file_again():
    found = {str(path.relative_to(ROOT)): streamed_hashes(path) for path in HASHING_CODE
             if path.name != "file_hash.py"}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_a_file_hashed_again_is_found(tmp_path):
    module = tmp_path / "again.py"
    module.write_text("import hashlib\n"
                      "def sha(path):\n    digest = hashlib.sha256()\n    return digest\n"
                      "def blob(size):\n    return hashlib.sha1(f'blob {size}\\0'.encode())\n"
                      "def text(value):\n    return hashlib.sha256(value.encode())\n")
    assert streamed_hashes(module) == [3, 6]
    assert HASHING_CODE and any(path.name == "wheel_fetch.py" for path in HASHING_CODE)
