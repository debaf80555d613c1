"""Bad host data stops the run before any host is contacted, naming host, field and value."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pve_sglang.hosts_file import build_groups, read_hosts_file
from pve_sglang.settings import ContainerSettings, SettingsError, load_defaults, settings_for

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "hosts.example.yml"
PYINFRA = Path(sys.executable).parent / "pyinfra"


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def first_container(hosts: dict) -> dict:
    return hosts["pve1"]["containers"][0]


def run_dry(tmp_path: Path, hosts: dict) -> subprocess.CompletedProcess:
    hosts_file = tmp_path / "hosts.yml"
    hosts_file.write_text(yaml.safe_dump(hosts))
    env = {**os.environ, "PVE_SGLANG_HOSTS": str(hosts_file)}
    return subprocess.run(
        [str(PYINFRA), "inventory.py", "deploy.py", "--dry"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def _set(path: list, value):
    def edit(hosts: dict) -> None:
        target = hosts
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


C0 = ["pve1", "containers", 0]
BAD_VALUES = {
    "unknown key": (_set(C0 + ["moe_backend"], "triton"),
                    ["host pve1, container 105", "unknown field 'moe_backend'",
                     "did you mean 'moe_runner_backend'", "allowed fields:"]),
    "wrong type": (_set(C0 + ["cores"], "many"),
                   ["host pve1, container 105", "field 'cores'", "'many'", "integer"]),
    "tp larger than gpus": (_set(C0 + ["gpus"], [0, 1]),
                            ["host pve1, container 105", "tp_size 8", "2 GPUs", "allowed: 1..2"]),
    "unknown moe backend": (_set(C0 + ["moe_runner_backend"], "flashinfer_cutlas"),
                            ["host pve1, container 105", "field 'moe_runner_backend'",
                             "'flashinfer_cutlas'", "not allowed", "'flashinfer_cutlass'"]),
    "unknown attention backend": (_set(C0 + ["attention_backend"], "flash"),
                                  ["field 'attention_backend'", "'flash'", "'flashinfer'", "'triton'"]),
    "mem fraction 1": (_set(C0 + ["mem_fraction_static"], 1.0),
                       ["field 'mem_fraction_static'", "1.0", "less than 1"]),
    "mem fraction 0": (_set(C0 + ["mem_fraction_static"], 0),
                       ["field 'mem_fraction_static'", "greater than 0"]),
    "vmid too small": (_set(C0 + ["vmid"], 99),
                       ["host pve1", "VMID 99", "100..999999999"]),
    "vmid too large": (_set(C0 + ["vmid"], 1_000_000_000),
                       ["host pve1", "VMID 1000000000", "100..999999999"]),
    "vmid not a number": (_set(C0 + ["vmid"], "web"), ["host pve1", "VMID 'web'"]),
    "duplicate vmid": (_set(C0 + ["vmid"], 106), ["host pve1", "vmid 106 is declared twice"]),
    "unknown platform": (_set(["pve1", "platform"], "proxmox"),
                         ["host pve1", "field 'platform'", "'proxmox'", "'pve'", "'lxc'"]),
    "host field on container": (_set(C0 + ["reload_modules"], True),
                                ["container 105", "'reload_modules' belongs to the host"]),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_value_stops_cli_before_connecting(tmp_path, case):
    edit, expected = BAD_VALUES[case]
    hosts = example()
    edit(hosts)
    result = run_dry(tmp_path, hosts)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "invalid settings" in result.stderr
    for text in expected:
        assert text in result.stderr, f"{text!r} not in {result.stderr!r}"
    # Stopped before pyinfra connected to anything.
    assert "Connecting to hosts" not in result.stdout + result.stderr


def test_example_hosts_file_is_valid_and_reaches_connecting(tmp_path):
    result = run_dry(tmp_path, example())
    output = result.stdout + result.stderr
    assert "Connecting to hosts" in output, output
    assert "Traceback" not in output and "internal exception" not in output, output


def test_duplicate_yaml_key_is_an_error(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("pve1:\n  cores: 4\n  cores: 8\n")
    with pytest.raises(SettingsError, match="key 'cores' appears twice"):
        read_hosts_file(path)


def test_host_values_are_container_defaults_and_container_overrides_win():
    hosts = example()
    hosts["pve1"]["cores"] = 48
    _, containers = build_groups(hosts)
    data = dict(containers)
    assert data["@pct/pve1/106"]["cores"] == 48
    assert data["@pct/pve1/105"]["cores"] == 64
    assert data["@pct/pve1/105"]["pct_vmid"] == 105
    assert data["@lxc/lab1/sglang-lab"]["lxc_name"] == "sglang-lab"


def test_secret_from_environment_is_hidden(monkeypatch):
    monkeypatch.setenv("TEST_HF", "hf_secret_value")
    merged = {**load_defaults(), "hf_token": "env:TEST_HF"}
    settings = settings_for(merged, ContainerSettings)
    assert settings.secrets == {"HF_TOKEN": "hf_secret_value"}
    assert "hf_secret_value" not in repr(settings)


def test_missing_secret_environment_variable_names_it(monkeypatch):
    monkeypatch.delenv("NOPE_TOKEN", raising=False)
    hosts = example()
    first_container(hosts)["api_key"] = "env:NOPE_TOKEN"
    with pytest.raises(SettingsError, match="field 'api_key' = '<secret>'.*NOPE_TOKEN is not set"):
        build_groups(hosts)


def test_nodes_must_name_known_containers():
    hosts = example()
    first_container(hosts)["nodes"] = ["@pct/pve1/105", "@pct/pve9/105"]
    with pytest.raises(SettingsError, match="'@pct/pve9/105', which is not a container"):
        build_groups(hosts)
