"""GPU passthrough config (pve_sglang/gpu/passthrough.py): the generated lines (applied to a real LXC
container: tests/lxc/test_passthrough_lxc.py).
"""

from __future__ import annotations

import pytest

from pve_sglang.gpu import passthrough
from pve_sglang.facts.nvidia import CharDeviceMajors
from pve_sglang.gpu.passthrough import device_minors, pve_dev_entries, raw_lxc_lines

MAJORS = {"nvidia-frontend": 195, "nvidia-uvm": 508, "nvidia-caps": 509}
ALL_NODES = [
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidia2",
    "/dev/nvidia3",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap2",
]

PROC_DEVICES = """\
Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
 10 misc
195 nvidia-frontend
236 nvidia-nvlink
508 nvidia-uvm
509 nvidia-caps
510 nvidia-caps-imex-channels

Block devices:
  7 loop
  9 md
508 nvidia-uvm
"""


# Parsing /proc/devices


def test_char_device_majors_character_section_only():
    majors = CharDeviceMajors().process(PROC_DEVICES.splitlines())
    assert majors["nvidia-frontend"] == 195
    assert majors["nvidia-uvm"] == 508
    assert majors["nvidia-caps"] == 509
    assert majors["tty"] == 4
    assert "loop" not in majors and "md" not in majors


def test_frontend_major_names():
    assert passthrough.frontend_major({"nvidia-frontend": 195}) == 195
    assert passthrough.frontend_major({"nvidia": 195}) == 195
    with pytest.raises(ValueError, match="nvidia-frontend"):
        passthrough.frontend_major({"nvidia-uvm": 508})


# nvidia-smi's index -> device minor (the N of /dev/nvidiaN)

#: The NvidiaGpuMinors rows of a host in the public reports' shape: GPU 0 is /dev/nvidia2.
A100_MINORS = [{"index": 0, "bus_id": "00000000:07:00.0", "minor": 2},
               {"index": 1, "bus_id": "00000000:0F:00.0", "minor": 1},
               {"index": 2, "bus_id": "00000000:47:00.0", "minor": 0}]


def test_device_minors_follow_the_bus_id_not_the_index():
    assert device_minors([0], A100_MINORS) == [2]
    assert device_minors([2, 0, 1], A100_MINORS) == [0, 2, 1]
    assert device_minors([], A100_MINORS) == []


def test_device_minors_refuse_what_they_cannot_tell():
    unknown = [{**A100_MINORS[0], "minor": None}, *A100_MINORS[1:]]
    with pytest.raises(ValueError, match=r"GPU 0 \(PCI bus 00000000:07:00\.0\): no "
                       r"/proc/driver/nvidia/gpus/BUS/information names its device minor"):
        device_minors([1, 0], unknown)
    assert device_minors([1], unknown) == [1]  # a GPU not asked for is not needed
    with pytest.raises(ValueError, match=r"^GPU 3: no /proc"):
        device_minors([3], A100_MINORS)
    twice = [*A100_MINORS[:2], {**A100_MINORS[2], "minor": 2}]
    with pytest.raises(ValueError, match="GPUs 0 and 2 are both given device minor 2"):
        device_minors([0, 2], twice)


def test_a_gpu_node_missing_is_named_with_its_minor():
    with pytest.raises(ValueError, match=r"/dev/nvidia2 \(device minor 2\) is missing "
                       r"\(`nvidia-modprobe -c 2` creates it\)"):
        pve_dev_entries([2], ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"])


# devN entries (pve-container >= 5.0.7)


def test_pve_dev_entries_all_shared_nodes_and_options():
    assert pve_dev_entries([0, 2], ALL_NODES, mode="0666", uid=0, gid=44, start=10) == {
        "dev10": "/dev/nvidia0,mode=0666,uid=0,gid=44",
        "dev11": "/dev/nvidia2,mode=0666,uid=0,gid=44",
        "dev12": "/dev/nvidiactl,mode=0666,uid=0,gid=44",
        "dev13": "/dev/nvidia-uvm,mode=0666,uid=0,gid=44",
        "dev14": "/dev/nvidia-uvm-tools,mode=0666,uid=0,gid=44",
        "dev15": "/dev/nvidia-modeset,mode=0666,uid=0,gid=44",
        "dev16": "/dev/nvidia-caps/nvidia-cap1,mode=0666,uid=0,gid=44",
        "dev17": "/dev/nvidia-caps/nvidia-cap2,mode=0666,uid=0,gid=44",
    }


def test_pve_dev_entries_minimal_host_relative_names():
    nodes = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"]
    assert pve_dev_entries([1], nodes) == {
        "dev0": "/dev/nvidia1",
        "dev1": "/dev/nvidiactl",
        "dev2": "/dev/nvidia-uvm",
    }


def test_pve_dev_entries_errors():
    with pytest.raises(ValueError, match="/dev/nvidia7"):
        pve_dev_entries([7], ALL_NODES)
    with pytest.raises(ValueError, match="/dev/nvidia-uvm .*nvidia-modprobe"):
        pve_dev_entries([0], ["/dev/nvidia0", "/dev/nvidiactl"])
    with pytest.raises(ValueError, match="/dev/nvidiactl"):
        pve_dev_entries([0], ["/dev/nvidia0", "/dev/nvidia-uvm"])
    with pytest.raises(ValueError, match="mode"):
        pve_dev_entries([0], ALL_NODES, mode="rw")
    with pytest.raises(ValueError, match="0-255"):
        pve_dev_entries([0], ALL_NODES, start=250)
    with pytest.raises(ValueError, match="repeat"):
        pve_dev_entries([0, 0], ALL_NODES)


# Raw lxc.* lines


def test_raw_lines_pve_style_cgroup2_subset():
    assert raw_lxc_lines([1], MAJORS, ALL_NODES) == [
        "lxc.cgroup2.devices.allow: c 195:1 rwm",
        "lxc.cgroup2.devices.allow: c 195:255 rwm",
        "lxc.cgroup2.devices.allow: c 508:* rwm",
        "lxc.cgroup2.devices.allow: c 195:254 rwm",
        "lxc.cgroup2.devices.allow: c 509:* rwm",
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
    ]


def test_raw_lines_lxc_style_cgroup1_dev_root_nvidia_name():
    nodes = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    majors = {"nvidia": 195, "nvidia-uvm": 511}
    assert raw_lxc_lines([0, 1], majors, nodes, style="lxc", cgroup="v1", dev_root="/srv/dev/") == [
        "lxc.cgroup.devices.allow = c 195:0 rwm",
        "lxc.cgroup.devices.allow = c 195:1 rwm",
        "lxc.cgroup.devices.allow = c 195:255 rwm",
        "lxc.cgroup.devices.allow = c 511:* rwm",
        "lxc.mount.entry = /srv/dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry = /srv/dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
        "lxc.mount.entry = /srv/dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry = /srv/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
    ]


def test_raw_lines_both_styles_same_entries():
    pve = raw_lxc_lines([0], MAJORS, ALL_NODES, style="pve", cgroup="v1")
    lxc = raw_lxc_lines([0], MAJORS, ALL_NODES, style="lxc", cgroup="v1")
    assert [line.replace(": ", " = ", 1) for line in pve] == lxc


def test_raw_lines_missing_majors_and_bad_arguments():
    with pytest.raises(ValueError, match="nvidia-frontend"):
        raw_lxc_lines([0], {"nvidia-uvm": 508, "nvidia-caps": 509}, ALL_NODES)
    with pytest.raises(ValueError, match="'nvidia-uvm'"):
        raw_lxc_lines([0], {"nvidia-frontend": 195, "nvidia-caps": 509}, ALL_NODES)
    with pytest.raises(ValueError, match="'nvidia-caps'"):
        raw_lxc_lines([0], {"nvidia-frontend": 195, "nvidia-uvm": 508}, ALL_NODES)
    # No caps nodes on the host: the caps major is not needed
    no_caps = [n for n in ALL_NODES if "caps" not in n]
    assert raw_lxc_lines([0], {"nvidia-frontend": 195, "nvidia-uvm": 508}, no_caps)
    with pytest.raises(ValueError, match="style"):
        raw_lxc_lines([0], MAJORS, ALL_NODES, style="yaml")
    with pytest.raises(ValueError, match="cgroup"):
        raw_lxc_lines([0], MAJORS, ALL_NODES, cgroup="v3")
