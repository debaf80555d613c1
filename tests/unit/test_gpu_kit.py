"""The GPU kit's own rules (tests/device/gpu_kit.py): which wheel fits the device's Python, what
a trim leaves out of a wheel (and of its RECORD, so that pip installs it), how the wheels are
packed into parts under the carry, and where each carried version comes from. Wheels made here
for the test; the real set is checked by ``make gpu-kit-check``."""

from __future__ import annotations

import json
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from pve_sglang.remote.file_hash import file_digest

sys.path.insert(0, str(Path(__file__).parents[1] / "device"))
import gpu_kit  # noqa: E402
import gpu_serve  # noqa: E402


@pytest.mark.parametrize("filename, fits", [
    ("sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl", True),
    ("sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl", False),
    ("sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl", True),
    ("cryptography-51.0.1-cp312-abi3-manylinux_2_34_x86_64.whl", True),
    ("cryptography-51.0.1-cp313-abi3-manylinux_2_34_x86_64.whl", False),
    ("flashinfer_python-0.6.15.post1-py3-none-any.whl", True),
])
def test_a_wheel_fits_the_devices_python_by_its_tags(filename, fits):
    assert gpu_kit._fits(filename, "312") is fits


def wheel(path: Path, members: dict[str, bytes]) -> Path:
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in members.items())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in members.items():
            out.writestr(name, data)
        out.writestr("sglang_kernel-0.4.5.dist-info/RECORD", record)
    return path


def test_trim_leaves_out_the_named_kernels_and_their_record_lines(tmp_path):
    made = wheel(tmp_path / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl", {
        "sgl_kernel/__init__.py": b"x",
        "sgl_kernel/flash_ops.abi3.so": b"f" * 100,
        "sgl_kernel/sm90/common_ops.abi3.so": b"c" * 10,
        "sgl_kernel/sm100/common_ops.abi3.so": b"b" * 10,
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": b"i",
    })
    out, dropped = gpu_kit.trimmed(made, gpu_kit.TRIM["sglang-kernel"], tmp_path / "out")
    kept = zipfile.ZipFile(out).namelist()
    assert sorted(kept) == ["sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so",
                            "sglang_kernel-0.4.5.dist-info/RECORD"]
    record = zipfile.ZipFile(out).read("sglang_kernel-0.4.5.dist-info/RECORD").decode()
    assert [line.split(",")[0] for line in record.splitlines()] == [
        "sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so"]
    assert {d["member"] for d in dropped} == {
        "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so"}
    assert all(d["why"] for d in dropped)
    assert all(i.compress_type == zipfile.ZIP_STORED for i in zipfile.ZipFile(out).infolist())


def random_wheel(path: Path, size: int) -> Path:
    """A wheel of SIZE bytes that do not compress."""
    import os

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        out.writestr("pkg/blob.bin", os.urandom(size))
    return path


def test_pack_keeps_each_part_under_its_size_and_each_wheel_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_kit, "CACHE", tmp_path / "cache")
    mib = 2**20
    wheels = [random_wheel(tmp_path / f"w{n}-1-py3-none-any.whl", size)
              for n, size in enumerate([int(0.6 * mib), int(0.5 * mib), int(0.3 * mib),
                                        int(0.2 * mib)])]
    parts = gpu_kit.pack(wheels, tmp_path / "parts", part_mib=1.0)
    assert len(parts) == 2
    assert all(part["bytes"] <= mib for part in parts)
    names = sorted(n for part in parts for n in part["wheels"])
    assert names == sorted(w.name for w in wheels)
    for part in parts:
        with tarfile.open(tmp_path / "parts" / part["name"]) as tar:
            assert sorted(tar.getnames()) == part["wheels"]
        assert part["sha256"] == file_digest(tmp_path / "parts" / part["name"])


def test_pack_refuses_a_wheel_larger_than_a_part(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_kit, "CACHE", tmp_path / "cache")
    big = random_wheel(tmp_path / "big-1-py3-none-any.whl", int(1.1 * 2**20))
    with pytest.raises(SystemExit, match="big-1-py3-none-any.whl alone is 1.1 MiB"):
        gpu_kit.pack([big], tmp_path / "parts", part_mib=1.0)


def test_every_carried_package_has_its_version_from_the_lock_or_the_project():
    versions = gpu_kit.pins()
    assert versions["sglang"] == gpu_kit.RELEASE
    assert versions["sglang-kernel"] == "0.4.5"
    assert versions["flashinfer-python"] == "0.6.15.post1"
    assert versions["transformers"] == "5.12.1"
    assert versions["pyinfra"] == gpu_kit.PROJECT_PINS["pyinfra"]
    # What the image has travels only where the set takes another version of it.
    assert set(map(gpu_kit.norm, gpu_kit.CARRY)) & gpu_kit.IMAGE == set(gpu_kit.IMAGE_NOT_TAKEN)


def test_a_carried_name_without_a_version_is_refused(monkeypatch):
    monkeypatch.setattr(gpu_kit, "CARRY", (*gpu_kit.CARRY, "not-a-locked-package"))
    with pytest.raises(SystemExit, match="not-a-locked-package is in CARRY"):
        gpu_kit.pins()


def test_stage_keeps_the_parts_that_came_and_names_those_still_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_serve, "KEPT", tmp_path / "kept")
    kit = tmp_path / "kit"
    (kit / "parts").mkdir(parents=True)
    (kit / "parts" / "wheels-1.tar.xz").write_bytes(b"one")
    parts = [{"name": "wheels-1.tar.xz", "sha256": file_digest(kit / "parts" / "wheels-1.tar.xz"),
              "bytes": 3},
             {"name": "wheels-2.tar.xz", "sha256": "0" * 64, "bytes": 3}]
    (kit / "manifest.json").write_text(json.dumps({"parts": parts}))
    _, missing = gpu_serve.stage(kit)
    assert missing == ["wheels-2.tar.xz"]
    assert (tmp_path / "kept" / "parts" / "wheels-1.tar.xz").read_bytes() == b"one"
    # The next call carries only the second part: the first is still kept.
    (kit / "parts" / "wheels-1.tar.xz").unlink()
    (kit / "parts" / "wheels-2.tar.xz").write_bytes(b"two")
    parts[1]["sha256"] = file_digest(kit / "parts" / "wheels-2.tar.xz")
    (kit / "manifest.json").write_text(json.dumps({"parts": parts}))
    assert gpu_serve.stage(kit)[1] == []


def test_the_deploys_modules_gpu_serve_imports_are_those_the_check_imports():
    """gpu_serve runs on the device image's Python, which has neither pyinfra nor pydantic:
    every deploy module it imports must be one ``gpu-kit-check`` imports with only the set and
    the image's packages (the first real call failed on an import the check never made)."""
    import ast

    tree = ast.parse((Path(gpu_kit.__file__).parent / "gpu_serve.py").read_text())
    used = {node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pve_sglang.")}
    assert used, "no deploy module found: the AST walk is wrong"
    assert used <= set(gpu_kit.DRIVER_MODULES), sorted(used - set(gpu_kit.DRIVER_MODULES))
