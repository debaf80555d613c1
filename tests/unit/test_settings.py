"""Bad host data stops the run before any host is contacted, naming host, field and value."""

import inspect
import subprocess
from pathlib import Path

import pytest
import yaml

from pve_sglang.hosts_file import build_groups, in_force, read_hosts_file
from pve_sglang.project import load_defaults
from pve_sglang.server.addresses import base_url, client_address
from pve_sglang.config.settings import (
    ContainerSettings,
    SettingsError,
    settings_for,
    tensor_parallel_size,
    validate_container,
    validate_host,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "hosts.example.yml"


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def first_container(hosts: dict) -> dict:
    return hosts["pve1"]["containers"][0]


def run_dry(cli, tmp_path: Path, hosts: dict) -> subprocess.CompletedProcess:
    """``pyinfra inventory.py deploy.py --dry`` on HOSTS, through CLI (``pyinfra_cli``)."""
    hosts_file = tmp_path / "hosts.yml"
    hosts_file.write_text(yaml.safe_dump(hosts))
    return cli("inventory.py", "deploy.py", "--dry", env={"PVE_SGLANG_HOSTS": str(hosts_file)})


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
def test_bad_value_stops_cli_before_connecting(pyinfra_cli, tmp_path, case):
    edit, expected = BAD_VALUES[case]
    hosts = example()
    edit(hosts)
    result = run_dry(pyinfra_cli, tmp_path, hosts)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "invalid settings" in result.stderr
    for text in expected:
        assert text in result.stderr, f"{text!r} not in {result.stderr!r}"
    # Stopped before pyinfra connected to anything.
    assert "Connecting to hosts" not in result.stdout + result.stderr


def test_example_hosts_file_is_valid_and_reaches_connecting(pyinfra_cli, tmp_path):
    result = run_dry(pyinfra_cli, tmp_path, example())
    output = result.stdout + result.stderr
    assert "Connecting to hosts" in output, output
    assert "Traceback" not in output and "internal exception" not in output, output


def test_duplicate_yaml_key_is_an_error(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("pve1:\n  cores: 4\n  cores: 8\n")
    with pytest.raises(SettingsError, match="key 'cores' appears twice"):
        read_hosts_file(path)


LAYERS = ("defaults", "host", "tuned", "own", "override")


@pytest.mark.parametrize("given, wins", [
    ({"defaults": 1}, 1),  # set at the lowest layer alone: kept
    ({"defaults": 1, "host": 2}, 2),
    ({"host": 2, "tuned": 3}, 3),  # make tune's best over the host entry
    ({"tuned": 3, "own": 4}, 4),  # the container's own entry over make tune's best
    ({"defaults": 1, "host": 2, "tuned": 3, "own": 4, "override": 5}, 5),  # --data over all
    ({"defaults": 1, "override": None}, None),  # a null given is a value, not an absence
])
def test_the_settings_precedence_is_one_table(given, wins):
    layers = {name: {"x": value, name: True} for name, value in given.items()}
    merged = in_force(**layers)
    assert merged["x"] == wins
    assert {name for name in LAYERS if merged.get(name)} == set(given)  # nothing else is lost
    assert list(inspect.signature(in_force).parameters) == list(LAYERS)  # lowest first


def test_host_values_are_container_defaults_and_container_overrides_win():
    hosts = example()
    hosts["pve1"]["cores"] = 48
    _, containers = build_groups(hosts)
    data = dict(containers)
    assert data["@pct/pve1/106"]["cores"] == 48
    assert data["@pct/pve1/105"]["cores"] == 64
    assert data["@pct/pve1/105"]["pct_vmid"] == 105
    assert data["@lxc/lab1/sglang-lab"]["lxc_name"] == "sglang-lab"


@pytest.mark.parametrize("vmid", [100, 999_999_999])
def test_vmid_edges_are_accepted(vmid):
    """The first and last VMIDs Proxmox allows (100..999999999, "vmid too small/large" above
    are the refused neighbours)."""
    hosts = example()
    first_container(hosts)["vmid"] = vmid
    _, containers = build_groups(hosts)
    assert dict(containers)[f"@pct/pve1/{vmid}"]["pct_vmid"] == vmid


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


# --- field rules, unit level: each bad value is refused naming field, value and what is allowed -

def check(**values) -> str:
    """The error validating one container of host pve1 with VALUES over the defaults."""
    with pytest.raises(SettingsError) as error:
        validate_container("pve1", "105", values, load_defaults())
    return str(error.value)


def accepted(**values) -> ContainerSettings:
    return validate_container("pve1", "105", values, load_defaults())


M = {"host_path": "/tank/models", "path": "/models"}
REFUSED = {
    "gpus empty": ({"gpus": []}, ["field 'gpus' = []", "passes no GPU", "allowed: 'all'"]),
    "gpus repeated": ({"gpus": [0, 0]}, ["field 'gpus' = [0, 0]", "more than once"]),
    "gpus negative": ({"gpus": [-1]}, ["field 'gpus.0' = -1", "greater than or equal to 0"]),
    "gpus boolean": ({"gpus": [True]}, ["field 'gpus.0' = True", "a whole number"]),
    "cores boolean": ({"cores": True}, ["field 'cores' = True", "a whole number"]),
    "bench concurrency 0": ({"bench_concurrencies": [0]},
                            ["field 'bench_concurrencies.0' = 0", "greater than or equal to 1"]),
    "bench concurrencies empty": ({"bench_concurrencies": []},
                                  ["field 'bench_concurrencies' = []", "at least 1 item"]),
    "server_host not an ip": ({"server_host": "not an ip"},
                              ["field 'server_host' = 'not an ip'", "allowed: an IPv4 or IPv6"]),
    "server_host a name": ({"server_host": "localhost"}, ["'localhost'", "not an IP address"]),
    "server_host zone": ({"server_host": "fe80::1%eth0"}, ["zone"]),
    "accept unhashed not a boolean": ({"model_accept_unhashed": "maybe"},
                                      ["field 'model_accept_unhashed' = 'maybe'", "a valid boolean"]),
    "accept unhashed null": ({"model_accept_unhashed": None},
                             ["field 'model_accept_unhashed' = None", "a valid boolean"]),
    "model_path relative": ({"model_path": "models/glm"},
                            ["field 'model_path' = 'models/glm'", "not an absolute path"]),
    "venv_path dotdot": ({"venv_path": "/opt/../venv"}, ["'/opt/../venv'", "'..'", "'/venv'"]),
    "venv_path root": ({"venv_path": "/"}, ["field 'venv_path' = '/'", "below /"]),
    "cache dir space": ({"sglang_cache_dir": "/var/cache/my cache"},
                        ["field 'sglang_cache_dir'", "whitespace", "absolute path without spaces"]),
    "wheelhouse newline": ({"wheelhouse": "/srv/wheels\n/etc"}, ["field 'wheelhouse'", "newlines"]),
    "mount host_path comma": ({"mounts": [{**M, "host_path": "/tank,backup=1"}]},
                              ["field 'mounts.0.host_path' = '/tank,backup=1'", "mpN options"]),
    "mount path equals": ({"mounts": [{**M, "path": "/models=x"}]}, ["field 'mounts.0.path'", "'='"]),
    "mount path relative": ({"mounts": [{**M, "path": "models"}]}, ["mounts.0.path", "absolute"]),
    "mount path twice": ({"mounts": [M, {**M, "host_path": "/tank/b"}]},
                         ["field 'mounts'", "['/models'] used more than once"]),
    "runfile path newline": ({"nvidia_runfile_path": "/tmp/a\nb.run"}, ["nvidia_runfile_path", "newline"]),
    "runfile path missing": ({"nvidia_runfile_path": "/nonexistent/NVIDIA-Linux-x86_64-580.run"},
                             ["field 'nvidia_runfile_path'", "no such file on this machine"]),
    "ca certificate newline": ({"ca_certificates": ["/etc/ca\n.crt"]}, ["ca_certificates.0", "newline"]),
    "sglang latest": ({"sglang_version": "latest"},
                      ["field 'sglang_version' = 'latest'", "PEP 440", "not 'latest'"]),
    "torch range": ({"torch_version": ">=2.9"}, ["field 'torch_version' = '>=2.9'", "PEP 440"]),
    "python of no Debian": ({"stack_python": "3.12"}, ["field 'stack_python' = '3.12'",
                                                      "allowed: 3.11 (Debian 12), 3.13 (Debian 13)"]),
    "flashinfer not normal": ({"flashinfer_version": "v0.6.3"}, ["'v0.6.3'", "normal form, '0.6.3'"]),
    "uv a number": ({"uv_version": 0.13}, ["field 'uv_version' = 0.13", "write it quoted"]),
    "cuda a number": ({"cuda_toolkit_version": 12.8}, ["field 'cuda_toolkit_version' = 12.8", "quoted"]),
    "cuda three parts": ({"cuda_toolkit_version": "12.8.1"}, ["'12.8.1'", "MAJOR.MINOR"]),
    "cores too many": ({"cores": 100_000_000}, ["field 'cores' = 100000000", "less than or equal to 8192"]),
    "cores zero": ({"cores": 0}, ["field 'cores' = 0", "greater than or equal to 1"]),
    "memory below proxmox": ({"memory_mib": 8}, ["field 'memory_mib' = 8", "greater than or equal to 16"]),
    "swap negative": ({"swap_mib": -1}, ["field 'swap_mib' = -1", "greater than or equal to 0"]),
    "rootfs zero": ({"rootfs_size_gib": 0}, ["field 'rootfs_size_gib' = 0", "greater than or equal to 1"]),
    "net0 extra option": ({"net0": "name=eth0,bridge=vmbr0;reboot"}, ["field 'net0'", "'bridge=vmbr0;reboot'"]),
    "net0 unknown key": ({"net0": "name=eth0,bridge=vmbr0,evil=1"}, ["'evil=1' is not allowed", "bridge"]),
    "net0 without name": ({"net0": "bridge=vmbr0,ip=dhcp"}, ["name= included"]),
    "rootfs storage": ({"rootfs_storage": "local lvm"}, ["field 'rootfs_storage' = 'local lvm'", "storage id"]),
    "hostname underscore": ({"hostname": "glm_5"}, ["field 'hostname' = 'glm_5'", "DNS name"]),
    "service name at": ({"service_name": "sglang@"}, ["field 'service_name' = 'sglang@'", "template"]),
    "served model name space": ({"served_model_name": "glm 5"}, ["field 'served_model_name'", "no spaces"]),
    "model download url": ({"model_download": "https://huggingface.co/Qwen/Qwen3-8B"},
                           ["field 'model_download'", "ORG/NAME"]),
    "model download dashes": ({"model_download": "org/a--b"}, ["no '--'"]),
    "model revision dotdot": ({"model_revision": "main/../x"}, ["field 'model_revision'", "no '..'"]),
    "api key flag": ({"extra_server_args": ["--api-key", "sk-x"]},
                     ["field 'extra_server_args.0' = '--api-key'", "set api_key instead"]),
    "api key flag with value": ({"extra_server_args": ["--api-key=sk-x"]},
                                ["extra_server_args.0", "set api_key instead"]),
    "admin key prefix": ({"extra_server_args": ["--admin-api=sk-x"]}, ["--admin-api would put a secret"]),
    "flag of a setting": ({"extra_server_args": ["--tp-size", "4"]}, ["--tp-size is rendered from the setting tp_size"]),
    "two words in one item": ({"extra_server_args": ["--chunked-prefill-size 4096"]},
                              ["holds a space", "['--chunked-prefill-size', '4096']"]),
    "extra arg newline": ({"extra_server_args": ["--enable-metrics\n--x"]}, ["newline"]),
    "health timeout zero": ({"health_timeout_s": 0}, ["field 'health_timeout_s' = 0"]),
    "health timeout days": ({"health_timeout_s": 864_000}, ["less than or equal to 86400"]),
    "generation timeout zero": ({"generation_timeout_s": 0},
                                ["field 'generation_timeout_s' = 0", "greater than or equal to 1"]),
    "generation timeout hours": ({"generation_timeout_s": 7200},
                                 ["field 'generation_timeout_s' = 7200", "less than or equal to 3600"]),
    "probation negative": ({"upgrade_probation_s": -1},
                           ["field 'upgrade_probation_s' = -1", "greater than or equal to 0"]),
    "probation months": ({"upgrade_probation_s": 8_000_000},
                         ["field 'upgrade_probation_s' = 8000000", "less than or equal to 604800"]),
    "probation words": ({"upgrade_probation_s": "ten minutes"},
                        ["field 'upgrade_probation_s' = 'ten minutes'", "integer"]),
    "server port zero": ({"server_port": 0}, ["field 'server_port' = 0"]),
    "dist port too large": ({"dist_init_port": 70_000}, ["field 'dist_init_port' = 70000"]),
    "ports equal": ({"dist_init_port": 30000}, ["dist_init_port 30000 is server_port too"]),
    "dist addr with port": ({"dist_init_addr": "10.0.0.1:50000"}, ["field 'dist_init_addr'", "without a port"]),
    "nodes repeated": ({"nodes": ["a", "b", "a"]}, ["field 'nodes'", "['a'] listed more than once"]),
    "pip index not http": ({"pip_index_url": "file:///srv/simple"}, ["field 'pip_index_url'", "http://"]),
    "torch index space": ({"torch_index_url": "https://x/ cu128"}, ["field 'torch_index_url'"]),
    "runfile url no host": ({"nvidia_runfile_url": "https:///x.run"}, ["field 'nvidia_runfile_url'"]),
    "tp not split over nodes": ({"tp_size": 3, "nodes": ["a", "b"]},
                                ["tp_size 3 does not split evenly over 2 nodes", "multiples of 2"]),
    "tp larger than listed gpus": ({"tp_size": 4, "gpus": [0, 1]},
                                   ["tp_size 4 is larger than the 2 GPUs", "allowed: 1..2"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_field_rule_refuses(case):
    values, expected = REFUSED[case]
    message = check(**values)
    assert message.startswith("host pve1, container 105: "), message
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_value_stays_refused_when_set_on_the_host(case):
    """A host entry's container values are its containers' defaults: validated the same way."""
    values, _ = REFUSED[case]
    hosts = example()
    hosts["pve1"]["containers"] = [{"vmid": 105}]
    hosts["pve1"].update(values)
    with pytest.raises(SettingsError):
        build_groups(hosts)


SECRET = "sk-do-not-show-me"
SECRETS_REFUSED = {
    "api key empty": ({"api_key": ""}, "empty"),
    "api key space": ({"api_key": f"{SECRET} x"}, "whitespace"),
    "hf token newline": ({"hf_token": f"{SECRET}\n"}, "whitespace"),
    "api key flag value": ({"extra_server_args": [f"--api-key={SECRET}"]}, "set api_key"),
    "api key flag next item": ({"extra_server_args": ["--api-key", SECRET, "--x y"]}, "holds a space"),
    "api key flag next item bad": ({"extra_server_args": ["--api-key", f"{SECRET}\n"]}, "newline"),
    "index url with credentials": ({"pip_index_url": f"https://bot:{SECRET}@mirror.example/simple"},
                                   "credentials in a URL"),
    "torch index url with user": ({"torch_index_url": f"https://{SECRET}@mirror.example/cu128"},
                                  "credentials in a URL"),
}


@pytest.mark.parametrize("case", sorted(SECRETS_REFUSED))
def test_secret_refused_without_showing_it(case):
    values, expected = SECRETS_REFUSED[case]
    message = check(**values)
    assert expected in message, message
    assert SECRET not in message


def test_secret_from_an_empty_environment_variable_is_refused(monkeypatch):
    monkeypatch.setenv("TEST_EMPTY_KEY", "")
    assert "field 'api_key' = '<secret>': empty" in check(api_key="env:TEST_EMPTY_KEY")


def test_values_the_rules_allow():
    s = accepted(
        gpus=[0, 1], tp_size=4, nodes=["@pct/pve1/105", "@pct/pve2/105"],
        server_host="::", hostname="glm5.lab.example", net0="name=eth0,bridge=vmbr0,ip=dhcp,tag=20,trunks=10;20",
        mounts=[{"host_path": "/tank/models/", "path": "//models"}], venv_path="/opt/sglang/venv/",
        model_download="Qwen/Qwen3-8B", model_revision="refs/pr/1", served_model_name="org/glm-5:fp4",
        torch_version="2.9.1+cu128", sglang_version="0.5.9", cuda_toolkit_version="12.8",
        pip_index_url="https://mirror.example/simple", dist_init_addr="fd00::11",
        extra_server_args=["--chat-template", "/models/my template.jinja", "--api-key-prefix-is-not-a-flag"],
        api_key="sk-abc$'\"", hf_token="hf_x", bench_concurrencies=[1, 64], memory_mib=16,
    )
    # Harmless spellings are normalised, so every step sees one path.
    assert (s.mounts[0].host_path, s.mounts[0].path, s.venv_path) == ("/tank/models", "/models", "/opt/sglang/venv")


def test_two_hosts_of_two_gpus_serve_tp4_over_two_nodes():
    """Issue 10: the inventory refused this valid multi-node setup (nodes not counted)."""
    hosts = {
        name: {"ssh_hostname": address, "containers": [{"vmid": 105, "gpus": [0, 1], "tp_size": 4,
                                                        "nodes": ["@pct/pve1/105", "@pct/pve2/105"]}]}
        for name, address in (("pve1", "192.0.2.10"), ("pve2", "192.0.2.11"))
    }
    _, containers = build_groups(hosts)
    assert [name for name, _ in containers] == ["@pct/pve1/105", "@pct/pve2/105"]


def test_host_field_rules():
    defaults = load_defaults()
    cases = {
        "lxc_path": ("var/lib/lxc", "not an absolute path"),
        "lxc_release": ("Bookworm 12", "Debian release name"),
        "lxc_rootfs_tarball": ("rootfs.tar", "not an absolute path"),
        "lxc_config": (["lxc.net.0.type = none\nlxc.hook.pre-start = /x"], "on one line"),
        "template_storage": ("local;x", "storage id"),
        "template": ("debian$(id)", "template name"),
        "pve_container_native_dev_min": ("newest", "not a pve-container version"),
    }
    for field, (value, expected) in cases.items():
        with pytest.raises(SettingsError) as error:
            validate_host("pve1", {field: value}, defaults)
        message = str(error.value)
        assert message.startswith(f"host pve1: field '{field}"), message
        assert expected in message, message


@pytest.mark.parametrize("value, refused", [
    ("5.0.6", True),  # one below devN: would pass GPUs as devN to a pct that refuses them
    ("4.4-3", True),
    ("5.0.7", False),  # the first with devN (DEVN_FROM)
    ("5.0.7-1", False),
    ("6.0.4", False),  # moved up: a user's choice, raw lines until then
])
def test_native_dev_min_can_only_move_the_rule_up(value, refused):
    """``pve_container_native_dev_min`` at the edge of 5.0.7 (issue 47, item 7: below it was
    accepted, though the docs say it can only move the rule up)."""
    if not refused:
        validate_host("pve1", {"pve_container_native_dev_min": value}, load_defaults())
        return
    with pytest.raises(SettingsError) as error:
        validate_host("pve1", {"pve_container_native_dev_min": value}, load_defaults())
    message = str(error.value)
    assert message.startswith(f"host pve1: field 'pve_container_native_dev_min' = '{value}': "
                              "below 5.0.7, the first pve-container with devN entries"), message
    assert "can only move the rule up; allowed: a version from 5.0.7" in message


def test_tensor_parallel_size_is_one_rule():
    assert tensor_parallel_size(None, 8, 1) == 8
    assert tensor_parallel_size(None, 2, 2) == 4
    assert tensor_parallel_size(4, 2, 2) == 4
    assert tensor_parallel_size(4, None, 2) == 4  # gpus: all, before the host's GPUs are known
    with pytest.raises(ValueError, match="larger than the 4 GPUs"):
        tensor_parallel_size(6, 2, 2)
    with pytest.raises(ValueError, match="does not split evenly over 2 nodes"):
        tensor_parallel_size(3, None, 2)


def test_base_url_brackets_ipv6():
    assert base_url("127.0.0.1", 30000) == "http://127.0.0.1:30000"
    assert base_url("::1", 30000) == "http://[::1]:30000"
    assert base_url(client_address("::"), 8) == "http://[::1]:8"
    assert client_address("0.0.0.0") == "127.0.0.1"


def test_runfile_path_on_this_machine_is_accepted(tmp_path):
    runfile = tmp_path / "NVIDIA-Linux-x86_64-580.159.04.run"
    runfile.write_text("#!/bin/sh\n")
    assert accepted(nvidia_runfile_path=str(runfile)).nvidia_runfile_path == str(runfile)


# --- bench_prompts_file: the user's prompts, checked whole before any change --------------

GOOD_PROMPT = '{"conversations": [{"content": "w1 w2 w3"}, {"content": "w4 w5"}]}\n'


@pytest.mark.parametrize("text, words", [
    ("", ["no prompt in it", "allowed: a JSONL file, one"]),
    ("\n\n", ["no prompt in it"]),
    (GOOD_PROMPT + "{not json\n", ["line 2: not JSON", "SGLang's custom dataset"]),
    ('["w1", "w2"]\n', ["line 1: no prompt and answer"]),
    ('{"conversations": [{"content": "only a prompt"}]}\n', ["line 1: no prompt and answer"]),
    ('{"conversations": [{"content": "w1"}, {"content": 7}]}\n', ["line 1: no prompt and answer"]),
    (GOOD_PROMPT + '{"text": "$(touch F)"}\n', ["line 2: no prompt and answer"]),
])
def test_a_prompts_file_the_benchmark_cannot_read_whole_is_refused(tmp_path, text, words):
    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    error = check(bench_prompts_file=str(path))
    for word in ["container 105", "field 'bench_prompts_file'", str(path), *words]:
        assert word in error, error


def test_a_prompts_file_that_is_not_there_or_not_text_is_refused(tmp_path):
    assert "no such file on this machine" in check(bench_prompts_file=str(tmp_path / "none"))
    binary = tmp_path / "prompts.bin"
    binary.write_bytes(b'{"conversations": "\xff\xfe"}\n')
    assert "not UTF-8 text" in check(bench_prompts_file=str(binary))


def test_a_prompts_file_of_both_spellings_is_accepted(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(GOOD_PROMPT + '\n{"conversation": [{"value": "a b"}, {"value": "c"}]}\n')
    assert accepted(bench_prompts_file=str(path)).bench_prompts_file == str(path)
