"""Owned lines in a config the user also edits: replaced in place, the rest untouched."""

from pve_sglang.container_config.owned_lines import owned_by_gpu_passthrough, owned_by_settings, reconcile_lines

OWNED = owned_by_gpu_passthrough({"nvidia-frontend": 195, "nvidia-uvm": 508, "nvidia-caps": 509})
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
    assert [line for line in main.splitlines() if OWNED(line)] == desired
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


# /proc/devices of the H200 machine (tests/fixtures/h200): every char major, NVIDIA's among them.
H200_MAJORS = {"mem": 1, "tty": 4, "/dev/tty": 5, "misc": 10, "ptm": 128, "pts": 136,
               "nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 238, "nvidia-nvswitch": 239,
               "nvidia-caps": 241, "hidraw": 243}


def test_only_nvidia_majors_are_owned_not_every_char_device():
    owned = owned_by_gpu_passthrough(H200_MAJORS)
    for major in (195, 238, 241):
        assert owned(f"lxc.cgroup2.devices.allow: c {major}:* rwm"), major
    for rule in ("c 10:200 rwm", "c 1:3 rwm", "c 4:* rwm", "c 5:2 rwm", "c 136:* rwm",
                 "c 226:* rwm", "c 239:* rwm", "a"):
        assert not owned(f"lxc.cgroup2.devices.allow: {rule}"), rule
        assert not owned(f"lxc.cgroup.devices.allow = {rule}"), rule


def test_a_list_of_majors_is_refused():
    import pytest
    with pytest.raises(TypeError, match="/proc/devices mapping"):
        owned_by_gpu_passthrough(H200_MAJORS.values())


def test_only_mounts_of_nvidia_nodes_are_owned():
    owned = owned_by_gpu_passthrough(H200_MAJORS)
    for entry in ("/dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
                  "/dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
                  "/dev/nvidia-caps/nvidia-cap1 dev/nvidia-caps/nvidia-cap1 none bind",
                  "/srv/standin/nvidiactl dev/nvidiactl none bind,optional,create=file"):
        assert owned(f"lxc.mount.entry: {entry}"), entry
    for entry in ("/dev/net/tun dev/net/tun none bind,create=file",
                  "/dev/dri dev/dri none bind,optional,create=dir",
                  "/srv/nvidia-models srv/models none bind,create=dir",
                  "/home/nvidia/data mnt/data none bind,create=dir"):
        assert not owned(f"lxc.mount.entry = {entry}"), entry
    assert not owned("#lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind")  # a description


def test_repeatable_settings_keys_own_only_their_own_line():
    settings = ["lxc.net.0.type = none", "lxc.apparmor.profile = unconfined",
                "lxc.mount.entry = /wheels opt/wheelhouse none bind,ro,create=dir 0 0",
                "lxc.cgroup2.devices.allow = c 10:200 rwm"]
    owned = owned_by_settings(settings)
    assert owned("lxc.apparmor.profile = generated")  # one value: the settings' replaces it
    assert owned("lxc.mount.entry =  /wheels  opt/wheelhouse none bind,ro,create=dir 0 0")
    for users in ("lxc.mount.entry = /dev/net/tun dev/net/tun none bind,create=file",
                  "lxc.cgroup2.devices.allow = c 226:* rwm", "lxc.idmap = u 0 100000 65536",
                  "lxc.include = /usr/share/lxc/config/common.conf", "lxc.cap.drop = sys_time",
                  "lxc.net.1.type = veth", "# lxc.apparmor.profile = x", ""):
        assert not owned(users), users


def test_interface_owned_only_when_settings_give_its_type():
    owned = owned_by_settings(["lxc.net.0.link = br1"])
    assert owned("lxc.net.0.link = lxcbr0")
    assert not owned("lxc.net.0.type = veth")  # the user's type stays
    assert not owned("lxc.net.0.hwaddr = 00:16:3e:00:00:01")


def test_user_lines_kept_byte_for_byte_with_crlf_tabs_and_trailing_blanks():
    owned = owned_by_gpu_passthrough(H200_MAJORS)
    content = ("arch: amd64\r\n\tcores:  8 \n#note%3A x\n"
               "lxc.cgroup2.devices.allow: c 10:200 rwm\n\n\n[snap]\narch: amd64\n")
    new = reconcile_lines(content, ["lxc.cgroup2.devices.allow: c 195:0 rwm"], owned)
    assert new == ("arch: amd64\r\n\tcores:  8 \n#note%3A x\n"
                   "lxc.cgroup2.devices.allow: c 10:200 rwm\n"
                   "lxc.cgroup2.devices.allow: c 195:0 rwm\n\n\n[snap]\narch: amd64\n")
    assert reconcile_lines(new, [], owned) == content
