"""Every pve-container version rule (``pve_sglang.pve_releases``), on tables: each rule at its
edges, each supported Proxmox VE release's answers, and the release folders of
tests/fixtures/pve agreeing with them (their sources: tests/fixtures/pve/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from fixtures.factutil import text
from pve_sglang.project import load_defaults
from pve_sglang.pve_releases import (
    DEVN_FROM,
    RELEASES,
    DeviceChange,
    cgroup_v1_gone,
    devn_restart,
    has_devn,
    has_keep_env,
    hotplugs_added_devn,
    mount_attributes_broken,
    parse_dpkg_version,
    pct_exec_words,
    release,
    template_arch,
    unprivileged_by_default,
    upstream,
)

PVE = Path(__file__).parents[1] / "fixtures" / "pve"


@pytest.mark.parametrize("debian, expected", [
    ("5.0.8", "5.0.8"), ("1:5.2.3-1", "5.2.3"), ("4.4-3", "4.4.3"), ("4.4-6", "4.4.6"),
    ("5.0.2-1+deb12u4", "5.0.2"), ("6.1.10", "6.1.10"), ("6.0.0~1", "6.0.0"),
])
def test_upstream_version(debian, expected):
    assert upstream(debian) == Version(expected)


def test_upstream_refuses_what_is_no_version():
    with pytest.raises(ValueError, match="not a pve-container version: 'newest'"):
        upstream("newest")


# Each rule at its edges: the last version without, the first with (debian/changelog).
@pytest.mark.parametrize("rule, without, with_", [
    (has_devn, "5.0.6", "5.0.7"),
    (has_keep_env, "5.0.8", "5.0.9"),
    (hotplugs_added_devn, "6.0.3", "6.0.4"),
    (unprivileged_by_default, "6.0.5", "6.0.6"),
    (cgroup_v1_gone, "5.2.6", "6.0.0"),
])
def test_rule_edges(rule, without, with_):
    assert rule(without) is False and rule(with_) is True
    assert rule(None) is False  # not installed, or unknown: the old behaviour
    assert rule("4.4-6") is False


@pytest.mark.parametrize("version, broken", [
    ("6.0.18", False), ("6.0.19", True), ("6.1.0", True), ("6.1.1", False), ("6.1.2", False),
    ("5.2.6", False), (None, False),
])
def test_mount_attributes_broken_from_6_0_19_fixed_in_6_1_1(version, broken):
    assert mount_attributes_broken(version) is broken


# What the deploy does on each release (the table of docs/proxmox-releases.md).
RELEASE_TABLE = {
    #        devN   keep-env hot-plug  unpriv  cgroup v1 gone
    "7.4": (False, False, False, False, False),
    "8.0": (False, False, False, False, False),
    "8.1": (True, False, False, False, False),
    "8.2": (True, True, False, False, False),
    "8.3": (True, True, False, False, False),
    "8.4": (True, True, False, False, False),
    "9.0": (True, True, True, True, True),
    "9.1": (True, True, True, True, True),
    "9.2": (True, True, True, True, True),
}


@pytest.mark.parametrize("name", list(RELEASE_TABLE))
def test_each_release(name):
    version = release(name).pve_container
    rules = (has_devn, has_keep_env, hotplugs_added_devn, unprivileged_by_default, cgroup_v1_gone)
    assert tuple(rule(version) for rule in rules) == RELEASE_TABLE[name]
    assert mount_attributes_broken(version) is False  # no release shipped the bug


def test_releases_are_the_recorded_folders_oldest_first():
    names = [r.name for r in RELEASES]
    assert names == sorted(names, key=Version)
    assert {"7.4", "8.0", "8.1", "8.2", "9.0", "9.2"} <= set(names)
    assert sorted(p.name for p in PVE.iterdir() if p.is_dir()) == sorted(names)
    with pytest.raises(KeyError, match="not a supported Proxmox VE release: '6.4'"):
        release("6.4")


@pytest.mark.parametrize("name", [r.name for r in RELEASES])
def test_recorded_format_release_folder_agrees_with_the_rules(name):
    """Each release's dpkg-query answer is its table version, and its pct exec takes
    --keep-env exactly when the rule says so (the option list from that release's pct.pm)."""
    version = parse_dpkg_version(text("pve", name, "dpkg_query_pve_container.txt").splitlines())
    assert version == release(name).pve_container
    options = text("pve", name, "pct_exec_options.txt").split()
    assert options == (["keep-env"] if has_keep_env(version) else [])


@pytest.mark.parametrize("name, version", [("8.4", "5.3.0"), ("9.1", "6.0.18"), ("9.2", "6.1.14")])
def test_recorded_pveversion_of_real_hosts(name, version):
    """``pveversion -v`` lines of real hosts (public pastes): the rules as for their release."""
    line = text("pve", name, "pveversion_v_pve-container.txt").strip()
    assert line == f"pve-container: {version}"
    assert has_keep_env(version) and has_devn(version)
    assert hotplugs_added_devn(version) is (name != "8.4")
    assert not mount_attributes_broken(version)


def test_devn_default_setting_is_the_rule():
    """The host setting ``pve_container_native_dev_min`` (a user may force raw lines) defaults
    to the rule's version."""
    assert load_defaults()["pve_container_native_dev_min"] == DEVN_FROM
    assert has_devn("5.0.8") and not has_devn("5.0.8", minimum="99")


def test_pct_exec_words():
    path = "/usr/bin:/bin"
    assert pct_exec_words(105, "5.0.9", path) == ["pct", "exec", "105", "--keep-env", "0", "--"]
    old = ["pct", "exec", "105", "--", "env", "-i", "PATH=/usr/bin:/bin", "container=lxc"]
    assert pct_exec_words(105, "5.0.8", path) == old
    assert pct_exec_words(105, None, path) == old


ADD = DeviceChange(added=("dev6",))
EDIT = DeviceChange(edited=("dev1",))
REMOVE = DeviceChange(removed=("dev0",))


@pytest.mark.parametrize("change, version, running, restart, why", [
    (DeviceChange(), "6.1.10", True, False, "unchanged"),
    (ADD, "6.1.10", False, False, "applied when the container starts"),
    (ADD, "6.1.10", True, False,
     "dev6 added: hot-plugged, no restart (pve-container 6.1.10 >= 6.0.4)"),
    (ADD, "6.0.4", True, False,
     "dev6 added: hot-plugged, no restart (pve-container 6.0.4 >= 6.0.4)"),
    (ADD, "6.0.3", True, True,
     "dev6 added: applied at a restart (pve-container 6.0.3 < 6.0.4 hot-plugs no device)"),
    (ADD, "5.2.6", True, True,
     "dev6 added: applied at a restart (pve-container 5.2.6 < 6.0.4 hot-plugs no device)"),
    (EDIT, "6.1.10", True, True, "dev1 edited: applied at a restart"),
    (REMOVE, "6.1.10", True, True, "dev0 removed: applied at a restart"),
    # A GPU swapped for another: its key removed, the new one's added; both named.
    (DeviceChange(added=("dev6",), removed=("dev0",)), "6.1.10", True, True,
     "dev6 added, dev0 removed: applied at a restart"),
    (DeviceChange(added=("dev6",), edited=("dev1",)), "5.0.8", True, True,
     "dev6 added, dev1 edited: applied at a restart"),
    (DeviceChange(edited=("dev1",), removed=("dev0", "dev2")), "6.1.10", True, True,
     "dev1 edited, dev0, dev2 removed: applied at a restart"),
    (REMOVE, "6.1.10", False, False, "applied when the container starts"),
])
def test_devn_restart(change, version, running, restart, why):
    decision = devn_restart(change, version, running)
    assert (decision.restart, decision.why) == (restart, why)


@pytest.mark.parametrize("name, column, arch", [
    ("debian-12-standard_12.7-1_amd64.tar.zst", None, "amd64"),
    ("debian-12-standard_12.7-1_amd64.tar.zst", "", "amd64"),
    ("debian-12-standard_12.7-1_amd64.tar.zst", "unknown", "amd64"),
    ("debian-13-standard_13.2-1_arm64.tar.zst", "arm64", "arm64"),
    ("alpine-3.20-default_20240908_amd64.tar.xz", None, "amd64"),
    ("devuan-5.0-standard_5.0_amd64.tar.gz", None, "amd64"),
    ("my-template_20240101.tar.gz", None, None),      # no architecture in the name
    ("my-template.tar.gz", "unknown", None),
    ("odd_name_amd64.tar.zst", "arm64", "arm64"),     # pveam's column wins
])
def test_template_arch(name, column, arch):
    assert template_arch(name, column) == arch
