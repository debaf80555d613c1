"""The venv state script (``remote/venv_state.py``) finds the distributions importlib.metadata
finds, in a real venv: its own site-packages, a shared layer added by a ``.pth`` file, dist-info
and egg-info (file and directory) metadata, folded headers and a body; the first on sys.path
wins. It reads the metadata headers itself (importing importlib.metadata is a third of its
start in every container of every run), so importlib.metadata is the reference here."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from pve_sglang import remote

SCRIPT = remote.source(remote.VENV_STATE).read_text()

# What the script reported when it used importlib.metadata itself.
REFERENCE = """
import importlib.metadata, json, os, sysconfig
site = os.path.realpath(sysconfig.get_paths()["purelib"])
packages, in_venv = {}, []
for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"]
    if name not in packages:
        packages[name] = dist.version
        if os.path.realpath(str(dist.locate_file(""))) == site:
            in_venv.append(name)
print(json.dumps({"packages": packages, "in_venv": in_venv}))
"""


def metadata(name: str, version: str, extra: str = "") -> str:
    return (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: a summary\n  folded onto a second line\n{extra}\nThe body: Name: nope\n")


@pytest.fixture(scope="module")
def layered_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv-state")
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    layer = root / "layer"

    def dist(where: Path, folder: str, text: str, file: str = "METADATA") -> None:
        (where / folder).mkdir(parents=True)
        (where / folder / file).write_text(text)

    dist(site, "Some.Pkg-1.0.dist-info", metadata("Some.Pkg", "1.0", "Author: x"))
    dist(site, "shared-2.0.dist-info", metadata("shared", "2.0"))
    dist(site, "old_style-0.3.egg-info", metadata("old-style", "0.3"), "PKG-INFO")
    (site / "egg_file-0.4.egg-info").write_text(metadata("egg_file", "0.4"))
    dist(layer, "shared-3.0.dist-info", metadata("shared", "3.0"))
    dist(layer, "layer_only-5.1.dist-info", metadata("Layer_Only", "5.1"))
    (site / "shared-layer.pth").write_text(f"{layer}\n")
    return python


def run(python: Path, *args: str) -> dict:
    done = subprocess.run([python, *args], capture_output=True, text=True, check=True,
                          cwd="/")
    return json.loads(done.stdout)


def test_the_script_finds_what_importlib_metadata_finds(layered_venv):
    state = run(layered_venv, "-c", SCRIPT, "/no/patch/script")
    reference = run(layered_venv, "-c", REFERENCE)
    assert state["packages"] == reference["packages"]
    assert state["in_venv"] == reference["in_venv"]


def test_the_venvs_own_copy_wins_over_the_shared_layer(layered_venv):
    state = run(layered_venv, "-c", SCRIPT, "/no/patch/script")
    assert state["packages"]["shared"] == "2.0"
    assert state["packages"]["Layer_Only"] == "5.1" and state["packages"]["Some.Pkg"] == "1.0"
    assert {"shared", "Some.Pkg", "old-style", "egg_file"} <= set(state["in_venv"])
    assert "Layer_Only" not in state["in_venv"]
    assert state["python"] == "%d.%d" % sys.version_info[:2] and state["incomplete"] is False


def test_a_dist_info_without_metadata_is_left_out(layered_venv, tmp_path):
    # What an install cut short can leave: importlib.metadata fails on it, the script skips it
    # (the lock check then names the package as missing).
    site = next(layered_venv.parent.parent.glob("lib/python*/site-packages"))
    cut = site / "cut-9.9.dist-info"
    cut.mkdir()
    try:
        state = run(layered_venv, "-c", SCRIPT, "/no/patch/script")
    finally:
        cut.rmdir()
    assert "cut" not in state["packages"] and state["packages"]["shared"] == "2.0"
