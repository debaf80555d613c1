"""sglang_version alone picks the set: torch, flashinfer, the kernel package and the CUDA major
follow from the release's own wheel metadata (recorded from real wheels: tests/fixtures/releases/,
SOURCES.txt names each wheel and its sha256), and a pin of the user's is kept only where the
release allows it, else inventory stops (exit 2) naming both versions. A release not recorded,
fetched from the package index: tests/network/test_release_fetch.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from pve_sglang.config.settings import SettingsError, validate_container
from pve_sglang.project import load_defaults
from pve_sglang.stack import releases

FIXTURES = Path(__file__).parents[1] / "fixtures" / "releases"


def recorded(version: str) -> releases.ReleaseSet:
    return releases.release_set(version, *releases.requirement_lines(
        (FIXTURES / f"sglang-{version}.METADATA").read_text()))


# release -> torch, flashinfer-python, kernel package and its version, CUDA, Requires-Python
RECORDED_TABLE = {
    "0.5.9": ("2.9.1", "0.6.3", "sgl-kernel", "0.3.21", (12, 9), ">=3.10"),
    "0.5.10": ("2.9.1", "0.6.7.post2", "sglang-kernel", "0.4.1", (12, 9), ">=3.10"),
    "0.5.11": ("2.11.0", "0.6.8.post1", "sglang-kernel", "0.4.2", (13, 0), ">=3.10"),
    "0.5.13": ("2.11.0", "0.6.12", "sglang-kernel", "0.4.3", (13, 0), ">=3.10"),
    "0.5.17": ("2.11.0", "0.6.15.post1", "sglang-kernel", "0.4.5", (13, 0), ">=3.10"),
    "0.5.18": ("2.13.0", "0.6.17", "sglang-kernel", "0.4.6.post1", (13, 0), ">=3.10"),
    "0.5.21": ("2.13.0", "0.6.18", "sglang-kernel", "0.4.7", (13, 0), ">=3.10"),
    "0.5.22": ("2.14.1", "0.7.1", "sglang-kernel", "0.4.9", (13, 0), ">=3.11"),
    "0.5.23": ("2.14.1", "0.7.2", "sglang-kernel", "0.4.10", (13, 0), ">=3.11"),
}


@pytest.mark.parametrize("version", list(RECORDED_TABLE))
def test_recorded_release_metadata_gives_the_set(version):
    torch, flashinfer, kernel_package, kernel, cuda, python = RECORDED_TABLE[version]
    release = recorded(version)
    assert (release.torch, release.flashinfer) == (SpecifierSet(f"=={torch}"), SpecifierSet(f"=={flashinfer}"))
    assert (release.kernel_package, release.kernel) == (kernel_package, SpecifierSet(f"=={kernel}"))
    assert (release.cuda, release.requires_python) == (cuda, SpecifierSet(python))
    chosen = releases.choose(release, None, None, "3.11")
    assert (chosen.torch, chosen.flashinfer) == (torch, flashinfer)


def test_recorded_every_fixture_is_in_the_table():
    assert sorted(p.name for p in FIXTURES.glob("*.METADATA")) == sorted(
        f"sglang-{v}.METADATA" for v in RECORDED_TABLE)
    assert len(RECORDED_TABLE) >= 6


@pytest.mark.parametrize("record", sorted(releases.RECORDED.glob("sglang-*.txt")), ids=lambda p: p.name)
def test_recorded_repository_records_are_the_wheels_requirements(record):
    """group_data/releases/ holds the wheel's own lines, as the cache would after a fetch."""
    version = record.name[len("sglang-"):-len(".txt")]
    metadata = (FIXTURES / f"sglang-{version}.METADATA").read_text()
    source = record.read_text().splitlines()[0].split("requirements of ", 1)[1]
    assert record.read_text() == releases.record_text(version, source, metadata)
    assert releases.parse_record(version, record.read_text()) == recorded(version)


@pytest.mark.parametrize("torch, flashinfer, python, error", [
    ("2.14.1", "0.7.2", "3.11", None),
    ("2.14.1+cu130", None, "3.11", None),  # a local build of the allowed version
    ("2.9.1", None, "3.11", "field 'torch_version' = '2.9.1': sglang 0.5.23 requires torch==2.14.1, "
                            "not 2.9.1; allowed: 2.14.1, or null to follow the release"),
    (None, "0.6.3", "3.11", "field 'flashinfer_version' = '0.6.3': sglang 0.5.23 requires "
                            "flashinfer-python==0.7.2, not 0.6.3"),
    (None, None, "3.10", "field 'stack_python' = '3.10': sglang 0.5.23 requires Python>=3.11"),
])
def test_recorded_pins_against_the_release(torch, flashinfer, python, error):
    release = recorded("0.5.23")
    if error is None:
        chosen = releases.choose(release, torch, flashinfer, python)
        assert chosen.torch == (torch or "2.14.1") and chosen.flashinfer == (flashinfer or "0.7.2")
    else:
        with pytest.raises(releases.ReleaseError) as caught:
            releases.choose(release, torch, flashinfer, python)
        assert error in str(caught.value)


def test_a_release_without_a_kernel_package_is_refused():
    with pytest.raises(releases.ReleaseError, match="name no kernel package"):
        releases.release_set("9.9", ">=3.10", ["torch==2.9.1", "flashinfer_python==0.6.3",
                                               "cuda-python==12.9"])


#: The rest of a set's requirements, for the unusual metadata rows below.
_PLAIN = ["torch==2.9.1", "flashinfer_python==0.6.3", "cuda-python==12.9"]


@pytest.mark.parametrize("requires, kernel_package", [
    # A release naming both kernel packages (the 0.5.10 rename half done): the first of
    # KERNEL_PACKAGES, whichever order the metadata lists them in.
    (_PLAIN + ["sgl-kernel==0.3.21", "sglang-kernel==0.4.1"], "sgl-kernel"),
    (_PLAIN + ["sglang-kernel==0.4.1", "sgl-kernel==0.3.21"], "sgl-kernel"),
    (_PLAIN + ["sglang-kernel==0.4.1"], "sglang-kernel"),
])
def test_unusual_metadata_the_kernel_package(requires, kernel_package):
    assert releases.release_set("9.9", ">=3.10", requires).kernel_package == kernel_package


def test_unusual_metadata_a_wildcard_pin_is_not_one_version():
    """``torch==2.9.*`` names no version: the set asks for a pin instead of installing '2.9.*'."""
    release = releases.release_set("9.9", ">=3.10", ["torch==2.9.*", *_PLAIN[1:],
                                                     "sgl-kernel==0.3.21"])
    with pytest.raises(releases.ReleaseError, match=r"requires torch==2\.9\.\*, not one version"):
        releases.choose(release, None, None)
    assert releases.choose(release, "2.9.1", None).torch == "2.9.1"


@pytest.mark.parametrize("spec, pin, allowed", [
    (">=2.9", "2.10.0rc1", True),    # a prerelease the range allows is the user's to pin
    ("==2.10.0rc1", "2.10.0rc1", True),
    (">=2.9,<2.10", "2.10.0rc1", False),
])
def test_unusual_metadata_a_prerelease_pin(spec, pin, allowed):
    release = releases.release_set("9.9", ">=3.10", [f"torch{spec}", *_PLAIN[1:],
                                                     "sgl-kernel==0.3.21"])
    if allowed:
        assert releases.choose(release, pin, None).torch == pin
    else:
        with pytest.raises(releases.ReleaseError, match=f"not {pin}"):
            releases.choose(release, pin, None)


def test_unusual_metadata_a_locked_runtime_of_another_cuda_major_is_not_the_toolkit():
    """A lock whose CUDA runtime is another major than the release's (a stray package): the
    release's own CUDA, not the stray one's."""
    release = recorded("0.5.9")  # CUDA 12.9
    assert releases.toolkit_version(release, None, {"nvidia-cuda-runtime": "13.0.96"}) == "12.9"
    assert releases.toolkit_version(recorded("0.5.23"), None,
                                    {"nvidia-cuda-runtime-cu12": "12.8.90"}) == "13.0"


def test_sglang_version_alone_picks_the_set_at_inventory_time():
    defaults = load_defaults()
    cs = validate_container("pve1", "105", {"sglang_version": "0.5.9"}, defaults)
    assert (cs.torch_version, cs.flashinfer_version) == ("2.9.1", "0.6.3")  # the tuned preset
    cs = validate_container("pve1", "105", {}, defaults)
    assert (cs.sglang_version, cs.torch_version, cs.flashinfer_version) == ("0.5.23", "2.14.1", "0.7.2")
    assert cs.cuda_toolkit_version is None  # follows the set (tasks/container.toolkit_of)


@pytest.mark.parametrize("sglang, pin, error", [
    ("0.5.23", "12.8", "field 'cuda_toolkit_version' = '12.8': sglang 0.5.23 runs CUDA 13 "
                       "(cuda-python>=13.0), not CUDA 12; allowed: a 13.x toolkit, or null to "
                       "follow the release"),
    ("0.5.9", "13.0", "field 'cuda_toolkit_version' = '13.0': sglang 0.5.9 runs CUDA 12 "
                      "(cuda-python==12.9), not CUDA 13; allowed: a 12.x toolkit"),
    ("0.5.23", "13.1", None),
    ("0.5.9", "12.6", None),
])
def test_a_toolkit_pin_of_another_cuda_major_stops_inventory_naming_both(sglang, pin, error):
    data = {"sglang_version": sglang, "cuda_toolkit_version": pin}
    if error is None:
        assert validate_container("pve1", "105", data, load_defaults()).cuda_toolkit_version == pin
        return
    with pytest.raises(SettingsError) as caught:
        validate_container("pve1", "105", data, load_defaults())
    assert f"host pve1, container 105: {error}" in str(caught.value)


@pytest.mark.parametrize("locked, toolkit", [
    ({"nvidia-cuda-runtime-cu12": "12.8.90"}, "12.8"),  # torch 2.9.1's PyPI build (0.5.9)
    ({"nvidia-cuda-runtime": "13.0.96"}, "13.0"),  # torch 2.14.1's (0.5.23)
    ({}, None),  # no runtime in the set: the release's own CUDA (cuda-python's)
])
def test_the_toolkit_is_the_cuda_of_the_locked_torch(locked, toolkit):
    release = recorded("0.5.23") if "nvidia-cuda-runtime-cu12" not in locked else recorded("0.5.9")
    assert releases.toolkit_version(release, None, locked) == (toolkit or release.cuda_text)
    assert releases.toolkit_version(release, "13.1", locked) == "13.1"  # a pin wins


@pytest.mark.parametrize("host, python", [
    ({"platform": "lxc", "lxc_release": "trixie"}, "3.13"),
    ({"platform": "lxc", "lxc_release": "bookworm"}, "3.11"),
    ({"platform": "lxc"}, "3.11"),  # the default lxc_release
    ({"platform": "pve", "template": "debian-13-standard"}, "3.13"),  # Proxmox VE 9's template
    ({"platform": "pve", "template": "debian-13-standard_13.1-2_amd64.tar.zst"}, "3.13"),
    ({"platform": "pve"}, "3.11"),  # the default debian-12-standard
    ({"platform": "pve", "template": "debian-13-standard", "stack_python": "3.11"}, "3.11"),
])
def test_stack_python_follows_the_release_the_container_is_created_from(tmp_path, host, python):
    from pve_sglang.hosts_file import build_groups

    key = {"pve": {"vmid": 105}, "lxc": {"name": "ct1"}}[host["platform"]]
    entry = {"ssh_hostname": "192.0.2.10", **host, "containers": [{**key, "gpus": [0]}]}
    if "stack_python" in entry:
        entry["containers"][0]["stack_python"] = entry.pop("stack_python")
    _, containers = build_groups({"h1": entry})
    [(_, data)] = containers
    assert data["stack_python"] == python


def test_a_pin_the_release_does_not_allow_stops_inventory_naming_host_field_and_both_versions():
    with pytest.raises(SettingsError) as caught:
        validate_container("pve1", "105", {"sglang_version": "0.5.23", "torch_version": "2.9.1"},
                           load_defaults())
    assert str(caught.value) == (
        "host pve1, container 105: field 'torch_version' = '2.9.1': sglang 0.5.23 requires "
        "torch==2.14.1, not 2.9.1; allowed: 2.14.1, or null to follow the release")


def test_a_pin_the_release_does_not_allow_exits_2_at_inventory_time(tmp_path):
    """Through pyinfra's CLI, as a user runs it: the hosts file's pin against 0.5.23's."""
    import os
    import subprocess
    import sys

    import yaml

    hosts = tmp_path / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"pve1": {
        "ssh_hostname": "192.0.2.10", "platform": "pve",
        "containers": [{"vmid": 105, "gpus": [0], "sglang_version": "0.5.23",
                        "torch_version": "2.9.1"}]}}))
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "inventory.py",
                           "debug-inventory"], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PVE_SGLANG_HOSTS": str(hosts)}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("host pve1, container 105: field 'torch_version' = '2.9.1': sglang 0.5.23 requires "
            "torch==2.14.1, not 2.9.1") in done.stderr and "Traceback" not in done.stderr
