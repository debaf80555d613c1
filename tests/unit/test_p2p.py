"""
P2P report on recorded `nvidia-smi topo -m` / `-p2p` outputs: the H200 (one GPU, recorded on the
device machine), multi-GPU outputs quoted in public issue threads (tests/fixtures/README.md), and
two synthetic-but-realistic cases (a KVM guest with VFIO, a bare-metal host with ACS redirect).
Also runs deploy_p2p.py through the pyinfra CLI on @local with fake nvidia-smi/python.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.factutil import fake_bin, lines, text
from pve_sglang.facts.system import parse_iommu_acs
from pve_sglang.gpu.p2p import (
    build_report,
    format_bandwidth_matrix,
    format_report,
    matrix_pairs,
    parse_p2p_matrix,
    parse_topo_matrix,
)

REPO = Path(__file__).resolve().parents[2]
H100 = "h100x8_nvidia_smi_topo_m_thunderkittens-167.txt"


# --- parsing ---------------------------------------------------------------------------------

def test_topo_recorded_h200_single_gpu_with_ansi_escapes():
    raw = text("h200", "nvidia_smi_topo_m.txt")
    assert "\x1b[4m" in raw  # nvidia-smi underlines the header even without a terminal
    assert parse_topo_matrix(raw)["matrix"] == [["X"]]


def test_topo_recorded_h100x8_nvlink_pasted_with_spaces():
    topo = parse_topo_matrix(text("public", H100))
    assert topo["gpus"] == list(range(8))
    assert all(topo["matrix"][i][j] == ("X" if i == j else "NV18") for i in range(8) for j in range(8))
    assert topo["affinity"]["0"] == {"CPU Affinity": "0-47,96-143", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}
    assert topo["affinity"]["7"]["CPU Affinity"] == "48-95,144-191"


def test_topo_recorded_rtx5060ti_x5_tabs_node_phb():
    topo = parse_topo_matrix(text("public", "rtx5060tix5_nvidia_smi_topo_m_aikitoria-ogkm-13.txt"))
    links = matrix_pairs(topo)
    assert links[(3, 4)] == "PHB" and links[(0, 4)] == "NODE" and links[(2, 2)] == "X"
    # The doubled tab before GPU NUMA ID does not shift the columns.
    assert topo["affinity"]["4"] == {"CPU Affinity": "0-63", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}


def test_p2p_recorded_rtx5060ti_x5_prop_all_ok():
    pairs = matrix_pairs(parse_p2p_matrix(text("public", "rtx5060tix5_nvidia_smi_topo_p2p_p_aikitoria-ogkm-13.txt")))
    assert len(pairs) == 25
    assert all(value == ("X" if src == dst else "OK") for (src, dst), value in pairs.items())


def test_p2p_recorded_rtx5090_x2_gns():
    parsed = parse_p2p_matrix(text("public", "rtx5090x2_nvidia_smi_topo_p2p_rw_club-3090-1229.txt"))
    assert parsed == {"gpus": [0, 1], "matrix": [["X", "GNS"], ["GNS", "X"]]}


def test_empty_and_garbage_inputs():
    assert parse_topo_matrix("")["gpus"] == []
    assert parse_p2p_matrix("No devices were found\n")["gpus"] == []
    assert matrix_pairs(None) == {}


# --- report ----------------------------------------------------------------------------------

def test_report_recorded_h200_single_gpu_with_measured_local_copy():
    checks = json.loads(text("h200", "gpu_checks_p2p_256mib.json"))
    report = build_report(text("h200", "nvidia_smi_topo_m.txt"), text("h200", "nvidia_smi_topo_p2p_r.txt"),
                          text("h200", "nvidia_smi_topo_p2p_w.txt"), checks=checks)
    assert report["gpus"] == [0] and report["pairs"] == [] and report["warnings"] == []
    assert report["local_gbps"][0] == checks["local"][0]["gbps"] > 1000
    out = format_report(report)
    assert "nothing to check (1 GPU)" in out
    assert "GPU0" in format_bandwidth_matrix(report)


def test_report_recorded_h100x8_nvlink_expected_no_warnings_without_measurement():
    report = build_report(text("public", H100))
    assert len(report["pairs"]) == 56
    assert all(pair["p2p_expected"] for pair in report["pairs"])
    assert report["warnings"] == [] and report["ok"]
    assert any("Bandwidth not measured" in note for note in report["notes"])


def test_report_recorded_h100x8_with_driver_saying_not_supported_warns():
    # The recorded NVLink topology with a P2P read matrix that says NS everywhere.
    p2p = " \tGPU0\tGPU1\t\n GPU0\tX\tNS\t\n GPU1\tNS\tX\t\n"
    report = build_report(text("public", H100), p2p)
    warned = [w for w in report["warnings"] if "P2P missing although the topology allows it" in w]
    assert len(warned) == 2 and "NV18" in warned[0]
    assert any("NCCL_P2P_DISABLE=1" in advice for advice in report["advice"])


def test_report_recorded_rtx5090_x2_phb_gns_is_by_design():
    report = build_report(text("public", "rtx5090x2_nvidia_smi_topo_m_club-3090-1229.txt"),
                          text("public", "rtx5090x2_nvidia_smi_topo_p2p_rw_club-3090-1229.txt"))
    assert report["warnings"] == []
    assert any("GPU0<->GPU1: PHB, P2P GNS (GPU not supported)" in note for note in report["notes"])


def test_report_synthetic_vm_flags_missing_p2p_and_advises():
    d = "synthetic"
    checks = json.loads(text(d, "vm_kvm_a6000x4_gpu_checks_p2p.json"))
    report = build_report(text(d, "vm_kvm_a6000x4_nvidia_smi_topo_m.txt"),
                          text(d, "vm_kvm_a6000x4_nvidia_smi_topo_p2p_r.txt"),
                          text(d, "vm_kvm_a6000x4_nvidia_smi_topo_p2p_w.txt"),
                          checks=checks, virt="kvm")
    missing = [w for w in report["warnings"] if "P2P missing" in w]
    assert len(missing) == 4  # the two NV4 pairs, both directions; PHB pairs are by design
    assert all("can_device_access_peer is False" in w for w in missing)
    advice = " ".join(report["advice"])
    assert "virtual machine (kvm)" in advice and "LXC" in advice
    assert "iommu=pt" in advice and "NCCL_P2P_DISABLE=1" in advice
    pair = next(p for p in report["pairs"] if (p["src"], p["dst"]) == (0, 1))
    assert pair == {"src": 0, "dst": 1, "link": "NV4", "p2p_expected": True, "p2p_read": "CNS",
                    "p2p_write": "CNS", "can_access_peer": False, "gbps": 11.2, "data_ok": True,
                    "error": None}
    matrix = format_bandwidth_matrix(report).splitlines()
    assert matrix[0].split() == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert matrix[1].split() == ["GPU0", "315.4", "11.2", "10.3", "10.3"]


def test_report_synthetic_acs_redirect_slow_and_corrupt_pair():
    d = "synthetic"
    acs = parse_iommu_acs(lines(d, "acs_pxb_l40sx4_fact_IommuAcs.txt"))
    report = build_report(text(d, "acs_pxb_l40sx4_nvidia_smi_topo_m.txt"),
                          text(d, "acs_pxb_l40sx4_nvidia_smi_topo_p2p_r.txt"),
                          checks=json.loads(text(d, "acs_pxb_l40sx4_gpu_checks_p2p.json")),
                          virt="none", iommu_acs=acs)
    warnings = " ".join(report["warnings"])
    assert "GPU2->GPU3: the copy delivered wrong data (link PXB)" in warnings
    assert "GPU3->GPU2: 3.2 GB/s, under half of the best PXB pair (24.6 GB/s)" in warnings
    advice = " ".join(report["advice"])
    assert "0000:18:00.0" in advice and "setpci" in advice and "iommu=pt" in advice
    assert "virtual machine" not in advice
    assert not report["ok"] and "3 warning(s)" in format_report(report)


def test_report_with_failed_check_carries_its_hint():
    checks = {"check": "p2p", "ok": False, "error": "RuntimeError: no CUDA GPUs are available",
              "hint": "Set uvm_disable_hmm=1", "device_count": 0, "pairs": [], "local": []}
    report = build_report(text("public", H100), checks=checks)
    assert any("gpu_checks p2p failed" in w for w in report["warnings"])
    assert "Set uvm_disable_hmm=1" in report["advice"]


# --- deploy_p2p.py through the pyinfra CLI ---------------------------------------------------

def _pyinfra(tmp_path: Path, *extra: str, path_dirs: list[Path]) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(p) for p in path_dirs] + [env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "@local", str(REPO / "deploy_p2p.py"), "-y", *extra],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180,
    )


def _fake_nvidia_smi(directory: Path, topo: str, p2p_r: str, p2p_w: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in (("topo_m", topo), ("p2p_r", p2p_r), ("p2p_w", p2p_w)):
        (directory / f"{name}.txt").write_text(body, encoding="utf-8")
    script = directory / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in "topo -m") cat {directory}/topo_m.txt;; '
        f'"topo -p2p r") cat {directory}/p2p_r.txt;; "topo -p2p w") cat {directory}/p2p_w.txt;; '
        "*) exit 0;; esac\n",
        encoding="utf-8",
    )
    script.chmod(0o755)


def test_deploy_p2p_local_without_gpus_or_torch(tmp_path):
    done = _pyinfra(tmp_path, path_dirs=[])
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "GPU P2P preflight report" in out
    assert "Bandwidth not measured" in out


def test_deploy_p2p_local_synthetic_vm_with_fake_python(tmp_path):
    d = "synthetic"
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, text(d, "vm_kvm_a6000x4_nvidia_smi_topo_m.txt"),
                     text(d, "vm_kvm_a6000x4_nvidia_smi_topo_p2p_r.txt"),
                     text(d, "vm_kvm_a6000x4_nvidia_smi_topo_p2p_w.txt"))
    fake_python = fake_bin(bin_dir, "fakepython", stdout=text(d, "vm_kvm_a6000x4_gpu_checks_p2p.json"))
    script = tmp_path / "gpu_checks_uploaded.py"
    done = _pyinfra(tmp_path, "--data", f"p2p_python={fake_python}", "--data",
                    f"p2p_script_path={script}", path_dirs=[bin_dir])
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert script.exists()  # uploaded by files.put
    assert "P2P missing although the topology allows it (link NV4)" in out
    assert "315.4" in out and "NCCL_P2P_DISABLE=1" in out


def test_deploy_p2p_strict_fails_on_warnings(tmp_path):
    d = "synthetic"
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, text(d, "vm_kvm_a6000x4_nvidia_smi_topo_m.txt"),
                     text(d, "vm_kvm_a6000x4_nvidia_smi_topo_p2p_r.txt"),
                     text(d, "vm_kvm_a6000x4_nvidia_smi_topo_p2p_w.txt"))
    done = _pyinfra(tmp_path, "--data", "p2p_strict=1", path_dirs=[bin_dir])
    assert done.returncode != 0
    assert "P2P preflight: 4 warning(s)" in done.stdout + done.stderr


def _report_lines(out: str) -> list[str]:
    """The P2P report of a deploy_p2p.py run, without what depends on the machine it ran on
    (the virtualisation found, the measured GB/s)."""
    report, inside = [], False
    for line in out.splitlines():
        line = line.lstrip()  # pyinfra indents a host's first line of an operation's output
        inside = inside or "GPU P2P preflight:" in line
        if inside and line.startswith("[@local]"):
            line = re.sub(r"virtualisation: \S+", "virtualisation: *", line)
            report.append(re.sub(r"^(\[@local\] GPU0 +)\d+\.\d", r"\1N", line))
        if "P2P preflight: nothing to check" in line:
            break
    return report


@pytest.mark.parametrize("recorded, with_torch", [("deploy_p2p_with_torch.txt", True),
                                                  ("deploy_p2p_no_torch.txt", False)])
def test_deploy_p2p_on_h200_outputs_prints_the_report_recorded_there(tmp_path, recorded,
                                                                      with_torch):
    # deploy_p2p.py here, fed the H200's recorded nvidia-smi and gpu_checks.py outputs, prints
    # the report `pyinfra @local deploy_p2p.py -y` printed on the H200 machine (run2).
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, text("h200", "nvidia_smi_topo_m.txt"),
                     text("h200", "nvidia_smi_topo_p2p_r.txt"),
                     text("h200", "nvidia_smi_topo_p2p_w.txt"))
    extra = []
    if with_torch:
        fake_python = fake_bin(bin_dir, "fakepython",
                               stdout=text("h200", "gpu_checks_p2p_256mib.json"))
        extra = ["--data", f"p2p_python={fake_python}",
                 "--data", f"p2p_script_path={tmp_path / 'gpu_checks.py'}"]
    done = _pyinfra(tmp_path, *extra, path_dirs=[bin_dir])
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    expected = _report_lines(text("h200", "run2", recorded))
    assert len(expected) > 5 and "P2P preflight: nothing to check (1 GPU)" in expected[-1]
    assert _report_lines(out) == expected
    if with_torch:
        assert "[@local] GPU0      1994.8" in out  # the recorded 256 MiB copy, on one H200
