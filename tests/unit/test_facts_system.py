"""
System facts on recorded outputs: this CI machine (a Docker container in a KVM VM, hybrid
cgroups), the H200 device machine (a Firecracker VM without systemd-detect-virt or lspci,
cgroup2) and public `lspci -vvv | grep ACSCtl` outputs from NCCL issue threads.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from fixtures.factutil import fake_bin, lines, local_fact, run_command, text
from pve_sglang.facts.system import (
    CgroupVersion,
    InitramfsOlderThan,
    IommuAcs,
    VirtualMachineType,
    parse_iommu_acs,
)


# --- VirtualMachineType ---------------------------------------------------------------------

def test_vm_type_recorded_here_kvm():
    assert VirtualMachineType().process(lines("dev-docker", "systemd_detect_virt_vm.txt")) == "kvm"


def test_vm_type_bare_metal_exits_1_printing_none(tmp_path):
    # systemd-detect-virt --vm prints "none" and exits 1 on bare metal: not a failure.
    fake_bin(tmp_path, "systemd-detect-virt", stdout="none\n", rc=1)
    done = run_command(VirtualMachineType().command(), [tmp_path])
    assert done.returncode == 0
    assert VirtualMachineType().process(done.stdout.splitlines()) == "none"
    value, failed = local_fact(VirtualMachineType, path_dirs=[tmp_path])
    assert (value, failed) == ("none", False)


def test_vm_type_falls_back_to_cpu_flag_without_systemd_detect_virt(tmp_path):
    # A PATH with grep and nothing else, as on the H200 image (no systemd-detect-virt).
    (tmp_path / "grep").symlink_to(shutil.which("grep"))
    done = subprocess.run(["/bin/sh", "-c", VirtualMachineType().command()], capture_output=True,
                          text=True, env={"PATH": str(tmp_path)})
    assert done.returncode == 0
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        flagged = any(" hypervisor" in line for line in handle if line.startswith("flags"))
    assert done.stdout.strip() == ("hypervisor" if flagged else "none")


# --- IommuAcs --------------------------------------------------------------------------------

def test_iommu_acs_recorded_nccl_606_src_valid_no_redirect():
    info = parse_iommu_acs(["lspci: yes"] + lines("public", "lspci_vvv_grep_acsctl_nccl-606.txt"))
    assert len(info["acs_devices"]) == 9
    assert info["src_valid"] == ["?"] * 4  # `grep ACSCtl` drops the bus lines
    assert info["p2p_redirect"] == []


def test_iommu_acs_recorded_nccl_523_with_redirect():
    info = parse_iommu_acs(["lspci: yes"] + lines("public", "lspci_vvv_grep_acsctl_nccl-523.txt"))
    assert len(info["acs_devices"]) == 12
    assert len(info["src_valid"]) == 5
    assert len(info["p2p_redirect"]) == 5
    assert info["acs_devices"][0]["flags"] == {
        "SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True,
        "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False,
    }


def test_iommu_acs_synthetic_fact_output_with_bus_ids_and_cmdline():
    info = IommuAcs().process(lines("synthetic", "acs_pxb_l40sx4_fact_IommuAcs.txt"))
    assert info["lspci"] is True
    assert info["p2p_redirect"] == ["0000:00:01.0", "0000:18:00.0", "0000:18:01.0"]
    # 0000:17:00.0 has no ACS capability line: not listed.
    assert [d["bus_id"] for d in info["acs_devices"]] == info["src_valid"]
    assert info["cmdline"] == {"intel_iommu": "on"} and info["iommu_passthrough"] is False


def test_iommu_acs_recorded_h200_without_lspci():
    info = IommuAcs().process(lines("h200", "raw_busy", "fact_IommuAcs.txt"))
    assert info["lspci"] is False and info["acs_devices"] == []
    assert info["cmdline"] == {} and info["iommu_passthrough"] is False


def test_iommu_acs_recorded_here_without_lspci():
    info = IommuAcs().process(lines("dev-docker", "fact_IommuAcs.txt"))
    assert info["lspci"] is False


def test_iommu_passthrough_from_cmdline():
    info = parse_iommu_acs(["lspci: no", "cmdline: BOOT_IMAGE=/vmlinuz quiet amd_iommu=on iommu=pt"])
    assert info["iommu_passthrough"] is True
    assert info["cmdline"] == {"amd_iommu": "on", "iommu": "pt"}


def test_iommu_acs_command_runs_here():
    done = run_command(IommuAcs().command())
    assert done.returncode == 0
    info = IommuAcs().process(done.stdout.splitlines())
    assert info["lspci"] in (True, False)
    value, failed = local_fact(IommuAcs)
    assert not failed and "cmdline" in value


# --- CgroupVersion ---------------------------------------------------------------------------

def test_cgroup_recorded_h200_v2():
    # `stat -fc %T /sys/fs/cgroup` as recorded there (no unified/ on a pure cgroup2 host).
    assert CgroupVersion().process(lines("h200", "stat_fs_cgroup.txt")) == "v2"
    assert CgroupVersion().process(lines("h200", "raw_idle", "fact_CgroupVersion.txt")) == "v2"


def test_cgroup_recorded_here_hybrid():
    assert CgroupVersion().process(lines("dev-docker", "fact_CgroupVersion.txt")) == "hybrid"


def test_cgroup_v1_and_unknown():
    assert CgroupVersion().process(["tmpfs"]) == "v1"
    assert CgroupVersion().process(["ext4"]) is None


def test_cgroup_through_local_connector():
    value, failed = local_fact(CgroupVersion)
    assert not failed and value in ("v1", "v2", "hybrid")


def test_vm_type_recorded_h200_firecracker_cpu_flag_fallback():
    # The H200 image has no systemd-detect-virt; its CPU flags carry "hypervisor".
    assert VirtualMachineType().process(lines("h200", "run2", "fact_VirtualMachineType.txt")) == "hypervisor"


# --- InitramfsOlderThan ------------------------------------------------------------------------

def test_initramfs_older_than_the_option_run_with_find(tmp_path):
    """The real command on a boot folder: images not rebuilt since the option was written."""
    boot = tmp_path / "boot"
    boot.mkdir()
    conf = tmp_path / "nvidia-uvm.conf"
    conf.write_text("options nvidia_uvm uvm_disable_hmm=1\n")
    os.utime(conf, (2000, 2000))
    for name, mtime in [("initrd.img-6.8.12-4-pve", 1000), ("initrd.img-6.8.12-9-pve", 3000),
                        ("vmlinuz-6.8.12-4-pve", 1000), ("initrd.img-6.5.13-6-pve", 2000)]:
        (boot / name).write_text("x")
        os.utime(boot / name, (mtime, mtime))

    def value(path) -> list[str]:
        command = InitramfsOlderThan().command(str(path), str(boot)).get_raw_value()
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
        assert done.returncode == 0
        return InitramfsOlderThan().process(done.stdout.splitlines())

    # An image as old as the option is not newer: update-initramfs ran before it, or failed.
    assert value(conf) == [f"{boot}/initrd.img-6.5.13-6-pve", f"{boot}/initrd.img-6.8.12-4-pve"]
    os.utime(conf, (500, 500))
    assert value(conf) == []
    assert value(tmp_path / "missing.conf") == []


def test_debian_architecture_recorded_here(tmp_path):
    """``dpkg --print-architecture`` as recorded on this machine; no dpkg: None, no failure."""
    from pve_sglang.facts.system import DebianArchitecture

    fake_bin(tmp_path, "dpkg", stdout=text("dev-docker", "dpkg_print_architecture.txt"))
    done = run_command(DebianArchitecture().command(), [tmp_path])
    assert DebianArchitecture().process(done.stdout.splitlines()) == "amd64"
    done = run_command(DebianArchitecture().command(), [tmp_path / "none"], bare=True)
    assert done.returncode == 0 and DebianArchitecture().process(done.stdout.splitlines()) is None
