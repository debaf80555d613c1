"""A venv per sglang release in which its real argument parser imports, on this machine.

``sglang.srt.server_args`` imports torch (with NVIDIA's CUDA libraries, which load without a
GPU), transformers and a few small packages, but not sgl-kernel or flashinfer. The venv holds the
release's wheel (``--no-deps``) and those packages at the versions the release itself names
(its METADATA's ``Requires-Dist`` lines are the constraints), installed by uv for this
machine's Python (3.11, as the containers'). Built once, under a lock, and cached under
``PVE_SGLANG_TEST_CACHE`` as ``sglang-VERSION-parser-venv-KEY`` (about 5 to 7 GB each).

``IMPORTS`` was found by importing ``sglang.srt.server_args`` of 0.5.9, 0.5.14, 0.5.18 and 0.5.23
in a venv holding only the wheel, adding what each ImportError named, until it imported.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from cache_dir import TEST_CACHE, building, bytecode

from pve_sglang.stack.releases import requirement_lines
from wheels import retried

REPO = Path(__file__).resolve().parents[1]
CACHE = TEST_CACHE
#: What importing sglang.srt.server_args needs, beyond the wheel (with their own dependencies).
IMPORTS = (
    "torch", "torchvision", "transformers", "huggingface_hub", "safetensors", "openai",
    "partial_json_parser", "dill", "sentencepiece", "numpy", "orjson", "psutil", "pybase64",
    "requests", "packaging", "pillow", "starlette", "msgspec", "pydantic", "pyzmq", "tqdm",
    "IPython", "aiohttp", "xgrammar",
)


def metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def constraints(wheel: Path) -> list[str]:
    """The release's own requirements as uv constraints (no extras; optional ones left out)."""
    _, lines = requirement_lines(metadata(wheel))
    out = []
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker and "extra" in str(requirement.marker):
            continue
        if not requirement.specifier:
            continue
        marker = f"; {requirement.marker}" if requirement.marker else ""
        out.append(f"{requirement.name}{requirement.specifier}{marker}")
    return out


def _uv(*args: str, timeout: float = 1800) -> None:
    done = subprocess.run([sys.executable, "-m", "uv", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"uv {' '.join(args[:2])}: {done.stderr[-3000:]}")


def parser_venv(release: str, wheel: Path) -> Path:
    """The cached venv (its folder) holding sglang RELEASE and what its server_args imports."""
    pins = constraints(wheel)
    key = hashlib.sha256("\n".join((release, *IMPORTS, *pins)).encode()).hexdigest()[:12]
    folder = CACHE / f"sglang-{release}-parser-venv-{key}"
    with building(folder):  # one build at a time; the others then reuse it
        stamp = folder / ".pvs-complete"
        if not stamp.exists():
            _build(release, wheel, folder, pins)
            stamp.write_text(f"sglang {release}\n" + "\n".join(pins) + "\n")
        bytecode(folder)
    return folder


def _build(release: str, wheel: Path, folder: Path, pins: list[str]) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    constraint_file = CACHE / f".{folder.name}.constraints.txt"
    constraint_file.write_text("\n".join(pins) + "\n")
    python = str(folder / "bin" / "python")

    def build() -> None:
        _uv("venv", "-q", "--clear", "--python", sys.executable, str(folder))
        _uv("pip", "install", "-q", "--python", python, "-c", str(constraint_file), *IMPORTS)
        _uv("pip", "install", "-q", "--python", python, "--no-deps", str(wheel))

    try:
        retried(build, f"the server_args venv of sglang {release}")
    except RuntimeError as error:
        pytest.fail(str(error))


def flag_site(wheel: Path, root: Path) -> Path:
    """ROOT as a site-packages folder holding only the files of WHEEL that the flag lister
    (``remote/sglang_flags.py``, ``server.command.known_flags``) reads: its version files and
    its flags' sources."""
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name in ("sglang/srt/server_args.py", "sglang/_version.py", "sglang/version.py") or (
                    name.startswith("sglang/srt/arg_groups/") and name.endswith(".py")):
                archive.extract(name, root)
    return root
