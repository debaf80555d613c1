"""
The checkout's own files (``group_data/``, ``templates/``) are found through
``pve_sglang.project.project_file``, against the checkout, whatever the current directory.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pve_sglang import project
from test_host_phase_recorded import container_answers, gpu_host_responses, plan

REPO = project.ROOT


def test_project_file_is_the_checkouts_file():
    assert project.project_file("group_data/all.py") == REPO / "group_data" / "all.py"
    assert project.template("sglang.service.j2") == str(REPO / "templates" / "sglang.service.j2")


def test_a_missing_file_names_itself_and_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(project, "ROOT", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"templates/sglang.service.j2 is not in .*checkout"):
        project.template("sglang.service.j2")


def test_defaults_and_templates_load_from_another_directory(tmp_path):
    script = (
        "from pve_sglang.config.settings import ContainerSettings\n"
        "from pve_sglang.project import load_defaults\n"
        "from pve_sglang.server.unit_text import render_env\n"
        "data = load_defaults()\n"
        "s = ContainerSettings.model_validate({k: v for k, v in data.items()"
        " if k in ContainerSettings.model_fields})\n"
        "print(data['service_name'], render_env(s).splitlines()[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sglang # Environment of sglang.service (systemd"), done.stdout


def test_host_phase_plans_its_templates_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ops = plan({**gpu_host_responses(), **container_answers(None, None)})
    names = [name for name, _ in ops]
    assert "Proxmox host | Disable HMM in nvidia_uvm (persisted)" in names, names
    assert "Proxmox host | Create /dev/nvidia-uvm* at boot (oneshot unit)" in names, names
