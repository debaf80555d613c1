"""
Proxmox VE and plain-LXC facts. No Proxmox host is at hand: the pct/pveversion/pveam outputs are
RECORDED from public sources (tests/fixtures/public/, each cited in tests/fixtures/README.md);
dpkg-query and lxc-info outputs are recorded on this CI machine (tests/fixtures/dev-docker/).
The facts' shell commands are also run for real, against fake pct/pveam binaries that print
those recorded outputs, to check the missing-container and missing-tool paths.
"""

from __future__ import annotations

import pytest

from fixtures.factutil import fake_bin, lines, local_fact, run_command, text
from pve_sglang.facts.pve import (
    LxcContainerStatus,
    PctConfig,
    PctStatus,
    PveamTemplates,
    PveContainerVersion,
    parse_dpkg_version,
)

MISSING_PVE_NAS = "pve_pct_missing_ct_pve-nas-issue6.txt"


# --- PveContainerVersion ---------------------------------------------------------------------

def test_pve_container_version_recorded_dpkg_query_format_here(tmp_path):
    # The fact's dpkg-query format, recorded on this machine for an installed package (lxc),
    # answered by a dpkg-query that prints it: the fact's command and parser give the version.
    fake_bin(tmp_path, "dpkg-query", stdout=text("dev-docker", "dpkg_query_lxc.txt"))
    done = run_command(PveContainerVersion().command(), [tmp_path])
    assert done.returncode == 0
    assert PveContainerVersion().process(done.stdout.splitlines()) == "1:5.0.2-1+deb12u4"


def test_pve_container_version_recorded_not_installed_here(tmp_path):
    # dpkg-query as recorded for a package that is not installed (message on stderr, exit 1):
    # the fact's command prints what the fact printed here, nothing, and succeeds.
    fake_bin(tmp_path, "dpkg-query", stdout=text("dev-docker", "dpkg_query_pve_container.txt"),
             stderr=text("dev-docker", "dpkg_query_pve_container.stderr.txt"), rc=1)
    done = run_command(PveContainerVersion().command(), [tmp_path])
    assert (done.returncode, done.stdout) == (0, text("dev-docker", "fact_PveContainerVersion.txt"))
    value, failed = local_fact(PveContainerVersion, path_dirs=[tmp_path])
    assert not failed and value is None


@pytest.mark.parametrize("version", ["5.3.0", "5.2.3"])
def test_pve_container_version_public_versions(version):
    # Versions as public `pveversion -v` listings show them (README), in dpkg-query's format.
    assert parse_dpkg_version([f"installed {version}"]) == version


def test_pve_container_version_removed_package_is_none():
    assert parse_dpkg_version(["config-files 5.1.12"]) is None


@pytest.mark.parametrize("lines, answer", [
    (["installed 5.0.8", ""], "5.0.8"),  # one line and the empty end: the version
    (["installed 5.0.8", "installed 6.1.10"], "installed 5.0.8 | installed 6.1.10"),
    (["installed 6.1.10", "installed 5.0.8"], "installed 6.1.10 | installed 5.0.8"),
    (["config-files 5.0.8", "installed 6.1.10"], "config-files 5.0.8 | installed 6.1.10"),
])
def test_pve_container_version_of_several_lines_comes_back_whole(lines, answer):
    """Two lines (was: the first installed one won, so their order decided the rules): the
    whole answer, which ``answer_problem`` refuses (issue 47, item 7)."""
    from pve_sglang.pve_releases import answer_problem

    assert parse_dpkg_version(lines) == answer
    assert (answer_problem(answer) is None) == (answer == "5.0.8")


# --- PctStatus -------------------------------------------------------------------------------

def test_pct_status_recorded_running():
    assert PctStatus().process(lines("public", "pve_pct_status_running_ops-notes.txt")) == "running"


def test_pct_status_stopped():
    assert PctStatus().process(["status: stopped"]) == "stopped"


@pytest.mark.parametrize("name", [MISSING_PVE_NAS, "pve_pct_missing_ct_tteck-proxmox-1225.txt"])
def test_pct_status_recorded_missing_container_is_none(name):
    assert PctStatus().process(lines("public", name)) is None


def test_pct_status_command_missing_container_exits_zero(tmp_path):
    # pct prints the recorded error on stderr and exits 255, as for a VMID with no config.
    fake_bin(tmp_path, "pct", stderr=text("public", MISSING_PVE_NAS), rc=255)
    done = run_command(PctStatus().command(vmid=100), [tmp_path])
    assert done.returncode == 0
    assert PctStatus().process(done.stdout.splitlines()) is None


def test_pct_status_command_other_errors_still_fail(tmp_path):
    fake_bin(tmp_path, "pct", stderr="ipcc_send_rec[1] failed: Connection refused\n", rc=255)
    done = run_command(PctStatus().command(vmid=100), [tmp_path])
    assert done.returncode == 255
    assert "Connection refused" in done.stdout


def test_pct_status_through_local_connector_recorded_running(tmp_path):
    fake_bin(tmp_path, "pct", stdout=text("public", "pve_pct_status_running_ops-notes.txt"))
    value, failed = local_fact(PctStatus, path_dirs=[tmp_path], vmid=101)
    assert (value, failed) == ("running", False)


def test_pct_status_through_local_connector_missing_container(tmp_path):
    fake_bin(tmp_path, "pct", stderr=text("public", MISSING_PVE_NAS), rc=255)
    value, failed = local_fact(PctStatus, path_dirs=[tmp_path], vmid=100)
    assert (value, failed) == (None, False)


def test_pct_status_without_pct_is_none():
    done = run_command(PctStatus().command(vmid=105), bare=True)
    assert done.returncode == 0 and done.stdout == ""


@pytest.mark.parametrize("bad", ["105; reboot", 99, 1_000_000_000, "1e3"])
def test_pct_vmid_is_validated(bad):
    with pytest.raises(ValueError):
        PctStatus().command(vmid=bad)


@pytest.mark.parametrize("vmid", [100, 999_999_999])
def test_pct_vmid_edges_are_accepted(vmid):
    """Proxmox's first and last VMIDs (100..999999999) reach pct."""
    assert f"pct status {vmid} " in PctStatus().command(vmid=vmid)
    assert f"pct config {vmid} " in PctConfig().command(vmid=vmid)


# --- PctConfig -------------------------------------------------------------------------------

def test_pct_config_recorded_pve_plain_container():
    config = PctConfig().process(lines("public", "pve_pct_config_104_pct-notes.txt"))
    assert config == {
        "arch": "amd64",
        "cores": "1",
        "features": "nesting=1",
        "hostname": "webserver-ct-1",
        "memory": "512",
        "net0": "name=eth0,bridge=vmbr0,firewall=1,hwaddr=E2:A0:B2:B2:69:13,ip=dhcp,ip6=dhcp,type=veth",
        "onboot": "1",
        "ostype": "ubuntu",
        "rootfs": "local-lvm:vm-104-disk-0,size=8G",
        "swap": "512",
        "unprivileged": "1",
    }


def test_pct_config_recorded_pve8_native_dev_passthrough_and_mount_points():
    config = PctConfig().process(lines("public", "pve8_pct_config_115_dev_passthrough_jellyfin-notes.txt"))
    assert config["dev0"] == "/dev/dri/renderD128,gid=993"
    assert config["dev3"] == "/dev/dri/card1,gid=44"
    assert config["mp2"] == "/mnt/data/ccna,mp=/media/ccna"
    assert config["net0"].startswith("name=eth0,bridge=vmbr0,")
    # pct prints description URL-encoded on one line; it stays so.
    assert config["description"].startswith("<div align='center'>%0A")
    assert config["tags"] == "community-script;media" and "lxc" not in config


def test_pct_config_recorded_raw_lxc_lines_in_order():
    # /etc/pve/lxc/116.conf as recorded: the format pct config prints (keys sorted, raw lxc.*
    # lines last; pve-container src/PVE/CLI/pct.pm), including an empty value.
    config = PctConfig().process(lines("public", "pve8_lxc_conf_116_nvidia_raw_lines_inventory.txt"))
    assert config["unprivileged"] == "1" and config["features"] == "nesting=1,mknod=1"
    assert config["lxc"][:3] == [
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.cgroup2.devices.allow", "c 511:* rwm"),
        ("lxc.cgroup2.devices.allow", "c 236:* rwm"),
    ]
    assert config["lxc"][3] == ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file")
    assert ("lxc.cap.drop", "") in config["lxc"]
    assert config["lxc"][-1] == ("lxc.apparmor.profile", "unconfined")
    assert len(config["lxc"]) == 11


def test_pct_config_recorded_missing_container_is_none(tmp_path):
    assert PctConfig().process(lines("public", MISSING_PVE_NAS)) is None
    fake_bin(tmp_path, "pct", stderr=text("public", MISSING_PVE_NAS), rc=255)
    value, failed = local_fact(PctConfig, path_dirs=[tmp_path], vmid=100)
    assert (value, failed) == (None, False)


def test_pct_config_through_local_connector_recorded(tmp_path):
    fake_bin(tmp_path, "pct", stdout=text("public", "pve_pct_config_400_nas-notes.txt"))
    value, failed = local_fact(PctConfig, path_dirs=[tmp_path], vmid=400)
    assert not failed
    assert value["mp1"] == "/mnt/media-hhd,mp=/mnt/hdd-media" and value["tags"] == "nas"


# --- PveamTemplates --------------------------------------------------------------------------

def test_pveam_list_recorded():
    assert PveamTemplates().process(lines("public", "pve_pveam_list_local_notes-ru.txt")) == [
        "local:vztmpl/alpine-3.21-default_20241217_amd64.tar.xz",
        "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
        "local:vztmpl/ubuntu-24.10-standard_24.10-1_amd64.tar.zst",
    ]


def test_pveam_list_header_only_and_missing_tool():
    assert PveamTemplates().process(["NAME                                                         SIZE"]) == []
    done = run_command(PveamTemplates().command(storage="local"), bare=True)
    assert done.returncode == 0 and done.stdout == ""
    with pytest.raises(ValueError):
        PveamTemplates().command(storage="local; rm -rf /")


# --- plain LXC -------------------------------------------------------------------------------

def test_lxc_status_recorded_stopped_here(tmp_path):
    # lxc-info answering as it did here for a stopped container: the fact's command passes its
    # output on as recorded, and the fact reads STOPPED from it.
    recorded = text("dev-docker", "fact_LxcContainerStatus_t1.txt")
    fake_bin(tmp_path, "lxc-info", stdout=recorded)
    done = run_command(LxcContainerStatus().command(container="t1"), [tmp_path])
    assert done.stdout == recorded
    assert LxcContainerStatus().process(done.stdout.splitlines()) == "STOPPED"


def test_lxc_status_recorded_missing_container_here(tmp_path):
    fake_bin(tmp_path, "lxc-info", stdout=text("dev-docker", "lxc_info_s_missing.txt"),
             stderr=text("dev-docker", "lxc_info_s_missing.stderr.txt"), rc=1)
    done = run_command(LxcContainerStatus().command(container="pve-sglang-missing"), [tmp_path])
    assert done.returncode == 0 and done.stdout == ""
    assert LxcContainerStatus().process(done.stdout.splitlines()) is None
    # The real lxc-info, where there is one.
    done = run_command(LxcContainerStatus().command(container="pve-sglang-missing"))
    assert done.returncode == 0 and done.stdout == ""
    value, failed = local_fact(LxcContainerStatus, container="pve-sglang-missing")
    assert (value, failed) == (None, False)


def test_lxc_status_running():
    assert LxcContainerStatus().process(["State:          RUNNING"]) == "RUNNING"


def test_pct_pending_recorded_format():
    """pct pending (pve-guest-common's format_pending, tests/fixtures/pve/README.md): only the
    keys with a change waiting; the missing-container error is None."""
    from pathlib import Path

    from pve_sglang.facts.pve import PctPending, parse_pct_pending

    fixtures = Path(__file__).parents[1] / "fixtures"
    lines = (fixtures / "pve" / "9.2" / "pct_pending_105_gpu_removal_pending.txt").read_text().splitlines()
    assert parse_pct_pending(lines) == {"dev6": ("del", "/dev/nvidia1,mode=0666")}
    assert parse_pct_pending(["cur memory: 1024", "new memory: 2048", "new dev7: /dev/nvidia2",
                              "cur cores: 4"]) == {"memory": ("new", "2048"),
                                                   "dev7": ("new", "/dev/nvidia2")}
    missing = (fixtures / "public" / "pve_pct_missing_ct_pve-nas-issue6.txt").read_text().splitlines()
    assert parse_pct_pending(missing) is None
    assert "pct pending 105" in PctPending().command(105)
