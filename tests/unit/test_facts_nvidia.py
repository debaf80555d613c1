"""
NVIDIA facts on recorded real outputs: the H200 device machine (tests/fixtures/h200/, driver
580.159.04, Firecracker VM), this CPU-only CI machine (tests/fixtures/dev-docker/: the driver
absent) and public outputs (tests/fixtures/public/, sources in tests/fixtures/README.md).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from fixtures.factutil import fake_bin, lines, local_fact, run_command, text
from pve_sglang.facts.nvidia import (
    CharDeviceMajors,
    GpuCheck,
    NvidiaDeviceNodes,
    NvidiaDriverVersion,
    NvidiaGpuMinors,
    NvidiaGpuProcesses,
    NvidiaGpus,
    bus_key,
    NvidiaP2pMatrix,
    NvidiaTopoMatrix,
    UvmDisableHmm,
    parse_driver_version,
)

H200_GPU = {
    "index": 0,
    "name": "NVIDIA H200",
    "bus_id": "00000000:00:06.0",
    "compute_cap": "9.0",
    "memory_mib": 143771,
    "driver_version": "580.159.04",
}


# --- NvidiaDriverVersion ---------------------------------------------------------------------

def test_driver_version_recorded_h200_open_module_580():
    assert NvidiaDriverVersion().process(lines("h200", "proc_driver_nvidia_version.txt")) == "580.159.04"


def test_driver_version_recorded_h200_fact_command_output():
    assert NvidiaDriverVersion().process(lines("h200", "raw_idle", "fact_NvidiaDriverVersion.txt")) == "580.159.04"


def test_driver_version_brief_examples():
    # The line layout of the open module (as recorded on the H200) and of the proprietary one.
    assert parse_driver_version([
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Wed Mar 12 23:43:37 UTC 2025"
    ]) == "570.133.20"
    assert parse_driver_version(["NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  "
                                 "Sat Aug 19 01:15:15 UTC 2023"]) == "535.104.05"


def test_driver_version_recorded_driver_absent_is_none_and_command_succeeds():
    # Recorded on a machine without the driver: the fact's command printed nothing, exit 0.
    done = run_command(NvidiaDriverVersion().command())
    assert done.returncode == 0
    if not os.path.exists("/proc/driver/nvidia/version"):  # no driver here either
        assert done.stdout == text("dev-docker", "fact_NvidiaDriverVersion.txt")
    assert NvidiaDriverVersion().process([]) is None


def test_driver_version_through_local_connector_does_not_fail_the_host():
    value, failed = local_fact(NvidiaDriverVersion)
    assert not failed
    # None on this CI machine (no driver); a version string on a GPU machine.
    assert value is None or value.count(".") >= 1


# --- NvidiaGpus ------------------------------------------------------------------------------

def test_gpus_recorded_h200_query():
    assert NvidiaGpus().process(lines("h200", "nvidia_smi_query_gpu.txt")) == [H200_GPU]


def test_gpus_recorded_h200_through_local_connector(tmp_path):
    # The recorded nvidia-smi line, served by a fake nvidia-smi, through pyinfra's @local.
    fake_bin(tmp_path, "nvidia-smi", stdout=text("h200", "nvidia_smi_query_gpu.txt"))
    value, failed = local_fact(NvidiaGpus, path_dirs=[tmp_path])
    assert not failed
    assert value == [H200_GPU]


def test_gpus_nvidia_smi_missing_is_empty_list():
    done = run_command(NvidiaGpus().command(), bare=True)
    assert done.returncode == 0 and done.stdout == ""
    assert NvidiaGpus().default() == []


def test_gpus_driver_not_loaded_message_is_empty_list(tmp_path):
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n")
    fake_bin(tmp_path, "nvidia-smi", stdout=message, rc=9)
    done = run_command(NvidiaGpus().command(), [tmp_path], only=True)
    assert done.returncode == 0
    assert NvidiaGpus().process(done.stdout.splitlines()) == []


def test_gpus_name_with_comma_and_na_memory():
    rows = NvidiaGpus().process(["1, NVIDIA RTX PRO 6000 Blackwell, Workstation, 00000000:41:00.0, "
                                 "12.0, [N/A], 580.95.05"])
    assert rows[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell, Workstation"
    assert rows[0]["compute_cap"] == "12.0" and rows[0]["memory_mib"] == 0


# --- NvidiaGpuMinors -------------------------------------------------------------------------

def test_gpu_minors_where_index_is_not_minor_constructed_from_public_reports():
    """An 8x A100 host in the public reports' shape (gVisor issue 9389, NVIDIA/nvidia-installer
    issue 21: nvidia-smi's GPU 0 is /dev/nvidia2, GPU 2 is /dev/nvidia0), each information
    file in the driver's layout (open-gpu-kernel-modules nv-procfs.c); constructed, see
    tests/fixtures/README.md."""
    rows = NvidiaGpuMinors().process(
        lines("synthetic", "a100x8_index_not_minor_fact_NvidiaGpuMinors.txt"))
    assert {row["index"]: row["minor"] for row in rows} == {
        0: 2, 1: 1, 2: 0, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7}
    # nvidia-smi's bus id (8-digit domain, capitals) matched to the driver's (4 digits, lower case)
    assert rows[1]["bus_id"] == "00000000:0F:00.0"


def test_gpu_minors_with_one_gpu_excluded_leave_a_gap_constructed():
    """Two GPUs listed, the one between them excluded (its file says so, nvidia-smi skips it):
    nvidia-smi's GPU 1 is /dev/nvidia2."""
    rows = NvidiaGpuMinors().process(lines("synthetic", "l40sx3_one_excluded_fact_NvidiaGpuMinors.txt"))
    assert [(row["index"], row["minor"]) for row in rows] == [(0, 0), (1, 2)]


@pytest.mark.parametrize("information, minor", [
    # The driver's own layout: "Device Minor: \t %u"
    ("Bus Location: \t 0000:8a:00.0\nDevice Minor: \t 5\n", 5),
    # No Bus Location line: the folder's name is the bus id
    ("Device Minor: \t 3\n", 3),
    # A driver of 2017 printed no Device Minor (canonical/lxd issue 3950): unknown, not 0
    ("Model:           GeForce GTX 650\nBus Location:    0000:8a:00.0\n", None),
    ("Device Minor: \t ?\n", None),
])
def test_gpu_minors_information_file_variants(information, minor):
    output = ["0, 00000000:8A:00.0, GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b"] + [
        f"/proc/driver/nvidia/gpus/0000:8a:00.0/information:{line}"
        for line in information.splitlines()]
    assert NvidiaGpuMinors().process(output)[0]["minor"] == minor


def test_gpu_minors_through_the_uuid_when_no_bus_id_matches():
    output = ["0, 00000000:8A:00.0, GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b",
              "1, 00000000:8B:00.0, GPU-????????-????-????-????-????????????",
              "/proc/driver/nvidia/gpus/0000:99:00.0/information:GPU UUID: \t "
              "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b",
              "/proc/driver/nvidia/gpus/0000:99:00.0/information:Device Minor: \t 4",
              "/proc/driver/nvidia/gpus/0000:98:00.0/information:GPU UUID: \t "
              "GPU-????????-????-????-????-????????????",
              "/proc/driver/nvidia/gpus/0000:98:00.0/information:Device Minor: \t 1"]
    # A UUID the driver does not know yet ("GPU-????...") matches nothing.
    assert [row["minor"] for row in NvidiaGpuMinors().process(output)] == [4, None]


@pytest.mark.parametrize("bus_id, key", [
    ("00000000:8A:00.0", (0, 0x8A, 0, 0)),
    ("0000:8a:00.0", (0, 0x8A, 0, 0)),
    ("0001:00:1e.7", (1, 0, 0x1E, 7)),
    ("8a:00.0", (0, 0x8A, 0, 0)),
    ("0000:8a:00.8", None),
    ("[N/A]", None),
])
def test_bus_key_edges(bus_id, key):
    assert bus_key(bus_id) == key


def test_gpu_minors_command_on_a_machine_without_the_driver(tmp_path):
    """The fact's real command here (no /proc/driver/nvidia): nvidia-smi's rows and no minor;
    without nvidia-smi nothing, and the command succeeds either way."""
    fake_bin(tmp_path, "nvidia-smi",
             stdout="0, 00000000:00:06.0, GPU-1b1c2d3e-0000-0000-0000-000000000000\n")
    done = run_command(NvidiaGpuMinors().command(), [tmp_path], only=True)
    assert done.returncode == 0
    assert NvidiaGpuMinors().process(done.stdout.splitlines()) == [
        {"index": 0, "bus_id": "00000000:00:06.0",
         "uuid": "GPU-1b1c2d3e-0000-0000-0000-000000000000", "minor": None}]
    done = run_command(NvidiaGpuMinors().command(), bare=True)
    assert (done.returncode, done.stdout) == (0, "")


# --- CharDeviceMajors ------------------------------------------------------------------------

def test_char_majors_recorded_h200_580_open_module():
    majors = CharDeviceMajors().process(lines("h200", "proc_devices.txt"))
    nvidia = {name: major for name, major in majors.items() if name.startswith("nvidia")}
    assert nvidia == {
        "nvidia": 195,
        "nvidiactl": 195,
        "nvidia-uvm": 238,
        "nvidia-nvswitch": 239,
        "nvidia-nvlink": 240,
        "nvidia-caps": 241,
        "nvidia-caps-imex-channels": 242,
    }
    # Block devices are not character devices.
    assert "virtblk" not in majors and majors["mem"] == 1
    # A name listed twice (infiniband_mad 231 and 245) keeps its first major.
    assert majors["infiniband_mad"] == 231


def test_char_majors_recorded_dev_docker_without_driver():
    majors = CharDeviceMajors().process(lines("dev-docker", "proc_devices.txt"))
    assert majors["pts"] == 136
    assert not any(name.startswith("nvidia") for name in majors)


# --- NvidiaDeviceNodes -----------------------------------------------------------------------

def test_device_nodes_recorded_h200():
    nodes = NvidiaDeviceNodes().process(lines("h200", "raw_busy", "fact_NvidiaDeviceNodes.txt"))
    assert [(n["path"], n["major"], n["minor"]) for n in nodes] == [
        ("/dev/nvidia-uvm", 238, 0),
        ("/dev/nvidia-uvm-tools", 238, 1),
        ("/dev/nvidia0", 195, 0),
        ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia-caps/nvidia-cap1", 241, 1),
        ("/dev/nvidia-caps/nvidia-cap2", 241, 2),
    ]
    assert nodes[0]["mode"] == "crw-rw-rw-"
    # The /dev/nvidia-caps directory itself is not a node.
    assert all(n["path"] != "/dev/nvidia-caps" for n in nodes)


def test_device_nodes_agree_with_recorded_ls_and_proc_devices():
    nodes = {n["path"]: n for n in NvidiaDeviceNodes().process(lines("h200", "raw_idle", "fact_NvidiaDeviceNodes.txt"))}
    # `ls -l /dev/nvidia*` recorded there: every character device, with its major and minor,
    # is a node the fact found (its own listing, another command), with the same numbers.
    listing, directory = {}, "/dev"
    for line in lines("h200", "ls_dev_nvidia.txt"):
        if line.endswith(":"):
            directory = line[:-1]
        elif line.startswith("c"):
            major, minor, name = re.search(r"(\d+), +(\d+) .* (\S+)$", line).groups()
            path = name if name.startswith("/") else f"{directory}/{name}"
            listing[path] = {"major": int(major), "minor": int(minor)}
    assert len(listing) == 6
    assert {path: {k: nodes[path][k] for k in ("major", "minor")} for path in listing} == listing
    assert nodes["/dev/nvidia-uvm"]["major"] == CharDeviceMajors().process(lines("h200", "proc_devices.txt"))["nvidia-uvm"]


def test_device_nodes_none_present_command_succeeds():
    done = run_command(NvidiaDeviceNodes().command())
    assert done.returncode == 0
    assert NvidiaDeviceNodes().process([]) == []


# --- UvmDisableHmm ---------------------------------------------------------------------------

def test_uvm_disable_hmm_recorded_h200_is_n():
    assert UvmDisableHmm().process(lines("h200", "uvm_disable_hmm.txt")) is False


@pytest.mark.parametrize("value, expected", [("Y", True), ("N", False), ("1", True), ("0", False)])
def test_uvm_disable_hmm_values(value, expected):
    assert UvmDisableHmm().process([value]) is expected


def test_uvm_disable_hmm_recorded_module_not_loaded_is_none():
    done = run_command(UvmDisableHmm().command())
    assert done.returncode == 0
    assert UvmDisableHmm().default() is None
    value, failed = local_fact(UvmDisableHmm)
    assert not failed and value in (None, True, False)


# --- NvidiaGpuProcesses ----------------------------------------------------------------------

def test_gpu_processes_recorded_h200_busy():
    processes = NvidiaGpuProcesses().process(lines("h200", "raw_busy", "fact_NvidiaGpuProcesses.txt"))
    assert processes == [{
        "pid": 843,
        "name": "python3",
        "used_memory_mib": 1634,
        "devices": ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl",
                    "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"],
    }]


def test_gpu_processes_recorded_h200_idle_is_empty(tmp_path):
    # nvidia-smi as recorded there with no process on the GPU (the header-less CSV is empty).
    fake_bin(tmp_path, "nvidia-smi", stdout=text("h200", "nvidia_smi_query_compute_apps_idle.txt"))
    done = run_command(NvidiaGpuProcesses().command(), [tmp_path], only=True)
    assert done.returncode == 0
    assert NvidiaGpuProcesses().process(done.stdout.splitlines()) == []


def test_gpu_processes_command_with_recorded_nvidia_smi_and_fuser(tmp_path):
    # nvidia-smi and fuser as recorded on the H200 while a process held the GPU (fuser prints
    # the PIDs on stdout and the names with access letters on stderr).
    fake_bin(tmp_path, "nvidia-smi", stdout=text("h200", "nvidia_smi_query_compute_apps_busy_nounits.txt"))
    done = run_command(NvidiaGpuProcesses().command(), [tmp_path], only=True)
    assert done.returncode == 0
    assert NvidiaGpuProcesses().process(done.stdout.splitlines()) == [
        {"pid": 843, "name": "python3", "used_memory_mib": 1634, "devices": []}
    ]


def test_gpu_processes_no_tools_is_empty():
    done = run_command(NvidiaGpuProcesses().command(), bare=True)
    assert done.returncode == 0


# --- topology facts --------------------------------------------------------------------------

def test_topo_matrix_recorded_h200_single_gpu():
    topo = NvidiaTopoMatrix().process(lines("h200", "nvidia_smi_topo_m.txt"))
    assert topo == {
        "gpus": [0],
        "matrix": [["X"]],
        "affinity": {"0": {"CPU Affinity": "0-15", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}},
        "nics": {},
    }


def test_p2p_matrix_recorded_h200_single_gpu():
    for name in ("nvidia_smi_topo_p2p_r.txt", "nvidia_smi_topo_p2p_w.txt"):
        assert NvidiaP2pMatrix().process(lines("h200", name)) == {"gpus": [0], "matrix": [["X"]]}


def test_topology_facts_without_nvidia_smi_are_none():
    for command in (NvidiaTopoMatrix().command(), NvidiaP2pMatrix().command(mode="w")):
        done = run_command(command, bare=True)
        assert done.returncode == 0 and done.stdout == ""
    assert NvidiaTopoMatrix().process(["No devices were found"]) is None


def test_p2p_matrix_rejects_unknown_mode():
    with pytest.raises(ValueError):
        NvidiaP2pMatrix().command(mode="rw; reboot")


# --- GpuCheck --------------------------------------------------------------------------------

def test_gpu_check_parses_recorded_h200_cuda_result():
    result = GpuCheck().process(lines("h200", "gpu_checks_cuda.json"))
    assert result["ok"] is True and result["devices"][0]["name"] == "NVIDIA H200"


def test_gpu_check_command_quotes_and_times_out(tmp_path):
    command = GpuCheck().command(python="/opt/venv/bin/python", script="/tmp/x y.py", check="p2p",
                                 args=("--size-mib", "16"), timeout=30).get_raw_value()
    assert "timeout 30 /opt/venv/bin/python '/tmp/x y.py' p2p --size-mib 16" in command
    fake = fake_bin(tmp_path, "fakepython", stdout="progress\n" + json.dumps({"ok": True}) + "\n")
    done = run_command(GpuCheck().command(python=str(fake), script="s.py"))
    assert GpuCheck().process(done.stdout.splitlines()) == {"ok": True}


def test_gpu_check_without_json_reports_the_output():
    result = GpuCheck().process(["Traceback (most recent call last):", "ImportError: x"])
    assert result["ok"] is False and "ImportError" in result["error"]
