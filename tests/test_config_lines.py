"""Owned lines in a config the user also edits: replaced in place, the rest untouched."""

from pve_sglang.config_lines import owned_by_gpu_passthrough, reconcile_lines
from pve_sglang.operations.lxc import owned_by_settings

OWNED = owned_by_gpu_passthrough([195, 508, 509])
USER_CONF = """arch: amd64
cores: 8
hostname: ct105
lxc.apparmor.profile: unconfined
lxc.cgroup2.devices.allow: c 226:* rwm
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file

[snap1]
arch: amd64
lxc.cgroup2.devices.allow: c 195:* rwm
"""


def test_owned_lines_replaced_in_place_user_lines_and_snapshots_kept():
    desired = [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 508:* rwm",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
    ]
    new = reconcile_lines(USER_CONF, desired, OWNED)
    main, snap = new.split("[snap1]")
    assert "lxc.cgroup2.devices.allow: c 226:* rwm" in main  # the user's DRI rule stays
    assert "lxc.apparmor.profile: unconfined" in main
    assert [l for l in main.splitlines() if OWNED(l)] == desired
    assert snap == "\narch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    assert reconcile_lines(new, desired, OWNED) == new  # converged: byte-identical


def test_no_owned_lines_yet_appends_at_end_of_main_section():
    content = "arch: amd64\ncores: 8\n\n[snap1]\narch: amd64\n"
    new = reconcile_lines(content, ["lxc.cgroup2.devices.allow: c 195:* rwm"], OWNED)
    assert new == ("arch: amd64\ncores: 8\nlxc.cgroup2.devices.allow: c 195:* rwm\n\n"
                   "[snap1]\narch: amd64\n")


def test_removing_gpus_deletes_only_owned_lines():
    new = reconcile_lines(USER_CONF, [], OWNED)
    assert "c 195:* rwm" not in new.split("[snap1]")[0]
    assert "c 226:* rwm" in new


def test_rules_for_other_majors_are_not_owned():
    assert not OWNED("lxc.cgroup2.devices.allow: c 226:* rwm")
    assert OWNED("lxc.cgroup.devices.allow = c 509:* rwm")
    assert OWNED("lxc.mount.entry = /tmp/x/nvidia0 dev/nvidia0 none bind,optional,create=file")
    assert not OWNED("lxc.mount.entry = /srv/data srv/data none bind,create=dir")


def test_settings_own_indexed_key_families():
    owned = owned_by_settings(["lxc.net.0.type = none"])
    assert owned("lxc.net.0.link = lxcbr0")
    assert owned("lxc.net.0.type = veth")
    assert not owned("lxc.net.1.type = veth")
    assert not owned("lxc.rootfs.path = dir:/var/lib/lxc/x/rootfs")
    content = "lxc.net.0.type = veth\nlxc.net.0.link = lxcbr0\nlxc.net.0.flags = up\nlxc.rootfs.path = dir:/r\n"
    assert reconcile_lines(content, ["lxc.net.0.type = none"], owned) == (
        "lxc.net.0.type = none\nlxc.rootfs.path = dir:/r\n"
    )
