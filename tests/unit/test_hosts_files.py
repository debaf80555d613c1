"""Bad hosts files and bad ``--data`` values, through the real pyinfra CLI.

Each case writes a hosts file, points ``PVE_SGLANG_HOSTS`` at it and runs
``pyinfra inventory.py debug-inventory`` (some also ``deploy.py --dry``) in the repository: the run
must stop at inventory time with exit 2, no Python traceback, and a message naming the host (or
the file and line, for YAML errors) and the field. Secrets written in the file never show in
``debug-inventory``'s output, at any verbosity. The summary test at the end prints how many
files were tried, the exit codes and the tracebacks seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cli_runs import PyinfraCli

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
SUMMARY_FILE = REPO / ".cache" / "test_hosts_files_summary.json"


@dataclass(frozen=True)
class Case:
    """One bad hosts file (text or bytes) with extra CLI arguments and the expected message."""

    content: str | bytes
    expect: tuple[str, ...]
    args: tuple[str, ...] = ()
    dry: bool = False  # also run `deploy.py --dry`
    env: dict = field(default_factory=dict)


def pve(container: dict | None = None, host: dict | None = None, containers: list | None = None) -> str:
    """A valid Proxmox hosts file (host pve1, container 105) with changes."""
    entry = {"ssh_hostname": "192.0.2.10", "platform": "pve", **(host or {})}
    entry["containers"] = containers if containers is not None else [
        {"vmid": 105, "gpus": [0, 1], "model_path": "/models/m", **(container or {})}
    ]
    return yaml.safe_dump({"pve1": entry}, sort_keys=False)


def lxc(container: dict | None = None, host: dict | None = None) -> str:
    """A valid plain LXC hosts file (host lab1, container c1) with changes."""
    entry = {"ssh_hostname": "192.0.2.20", "platform": "lxc", **(host or {})}
    entry["containers"] = [{"name": "c1", "gpus": [0], **(container or {})}]
    return yaml.safe_dump({"lab1": entry}, sort_keys=False)


PVE_TEXT = pve()
C105 = "host pve1, container 105"

CASES: dict[str, Case] = {
    # --- YAML syntax and encoding --------------------------------------------------------------
    "tab indent": Case("pve1:\n\tplatform: pve\n", ("line 2", "tab")),
    "unclosed flow list": Case("pve1:\n  gpus: [0, 1\n", ("line 3", "YAML syntax error")),
    "unterminated quote": Case('pve1:\n  model_path: "/models\n', ("line 3", "YAML syntax error")),
    "bad indentation": Case("pve1:\n  platform: pve\n containers: []\n", ("line 3", "YAML")),
    "non-utf8 byte": Case(b"pve1:\n  model_path: /models/\xff\n", ("line 2", "not UTF-8", "0xff")),
    "utf-16 file": Case("pve1:\n  platform: pve\n".encode("utf-16"), ("line 1", "not UTF-8")),
    "nul character": Case("pve1:\n  model_path: /m\x00\n", ("line 2", "not allowed in YAML")),
    "two documents": Case("pve1: {}\n---\npve2: {}\n", ("line 2", "single document")),
    "python tag": Case("pve1: !!python/object/apply:os.system [id]\n", ("line 1", "python/object")),
    "unhashable key": Case("? [a, b]\n: 1\n", ("line 1", "unhashable")),
    "nested too deeply": Case("pve1: " + "[" * 3000 + "\n", ("nested too deeply",)),
    "duplicate host": Case("pve1: {}\npve1: {}\n", ("line 2", "'pve1' appears twice")),
    "duplicate field": Case(PVE_TEXT + "    cores: 4\n    cores: 8\n", ("'cores' appears twice",)),
    # --- top level ---------------------------------------------------------------------------
    "empty file": Case("", ("is empty", "mapping of host names")),
    "only comments": Case("# nothing here\n", ("is empty",)),
    "top level list": Case("- pve1\n- pve2\n", ("top level is a list", "line 1")),
    "top level string": Case("pve1\n", ("top level is a string",)),
    "top level empty mapping": Case("{}\n", ("no hosts",)),
    # --- host names and entries ----------------------------------------------------------------
    "null host name": Case("~:\n  platform: pve\n", ("host name None", "line 1", "non-empty string")),
    "integer host name": Case("5:\n  platform: pve\n", ("host name 5", "an integer")),
    "boolean host name": Case("yes:\n  platform: pve\n", ("host name True", "a boolean")),
    "empty host name": Case('"":\n  platform: pve\n', ("host name ''", "non-empty")),
    "host name with space": Case('"pve 1":\n  platform: pve\n', ("host name 'pve 1'", "allowed:")),
    "host name with shell chars": Case('"pve1;id":\n  platform: pve\n', ("host name 'pve1;id'",)),
    "host name with slash": Case('"pve/1":\n  platform: pve\n', ("host name 'pve/1'",)),
    "host name another connector": Case('"@docker/x":\n  platform: pve\n', ("'@docker/x'",)),
    "host entry list": Case("pve1:\n  - platform\n", ("host pve1", "host entry is a list", "line 1")),
    "host entry string": Case("pve1: pve\n", ("host pve1", "host entry is a string")),
    "host entry integer": Case("pve1: 5\n", ("host pve1", "an integer")),
    "host entry date": Case("pve1: 2024-01-01\n", ("host pve1", "a date")),
    "integer key in host": Case("pve1:\n  1: x\n", ("host pve1", "key 1", "an integer")),
    "null key in container": Case(PVE_TEXT + "    ~: x\n", ("host pve1", "key None")),
    # --- containers ----------------------------------------------------------------------------
    "containers mapping": Case(
        "pve1:\n  containers:\n    vmid: 105\n", ("host pve1", "field 'containers'", "a mapping")
    ),
    "containers string": Case("pve1:\n  containers: c1\n", ("host pve1", "'containers'", "a string")),
    "container entry string": Case(
        "pve1:\n  containers:\n    - '105'\n", ("host pve1, container #1", "a string", "line 3")
    ),
    "container entry list": Case(
        "pve1:\n  containers:\n    - [105]\n", ("host pve1, container #1", "a list")
    ),
    "container entry null": Case("pve1:\n  containers:\n    -\n", ("host pve1, container #1", "'vmid'")),
    "container without vmid": Case(
        pve(containers=[{"gpus": [0]}]), ("host pve1, container #1", "no 'vmid'")
    ),
    "lxc container without name": Case(
        "lab1:\n  platform: lxc\n  containers:\n    - vmid: 105\n",
        ("host lab1, container #1", "no 'name'"),
    ),
    "pve container with name": Case(
        pve(containers=[{"name": "c1"}]), ("host pve1, container #1", "'name' names containers")
    ),
    "vmid string": Case(pve({"vmid": "web"}), ("host pve1", "VMID 'web'")),
    "vmid boolean": Case(pve({"vmid": True}), ("host pve1", "VMID True")),
    "vmid too small": Case(pve({"vmid": 99}), ("host pve1", "VMID 99", "100..999999999")),
    "duplicate vmid": Case(
        pve(containers=[{"vmid": 105}, {"vmid": 105}]), ("host pve1", "vmid 105 is declared twice")
    ),
    "lxc name with space": Case(lxc({"name": "c 1"}), ("host lab1", "container name 'c 1'")),
    "lxc name empty": Case(lxc({"name": ""}), ("host lab1", "container name ''")),
    # --- unknown and misplaced keys ------------------------------------------------------------
    "unknown field": Case(pve({"modle_path": "/m"}), (C105, "'modle_path'", "did you mean 'model_path'")),
    "ssh_hostnme typo": Case(
        pve(host={"ssh_hostnme": "192.0.2.11"}),
        ("host pve1", "'ssh_hostnme'", "did you mean 'ssh_hostname'"),
        dry=True,
    ),
    "ssh_port string": Case(pve(host={"ssh_port": "twenty-two"}), ("host pve1", "'ssh_port'", "int")),
    "ssh_password hidden": Case(
        pve(host={"ssh_password": 12345}), ("host pve1", "'ssh_password' = <secret>")
    ),
    "ssh key on container": Case(pve({"ssh_user": "root"}), (C105, "'ssh_user'", "host entry")),
    "pct_vmid set by user": Case(pve({"pct_vmid": 200}), (C105, "'pct_vmid'", "set by the inventory")),
    "pve_host set by user": Case(pve(host={"pve_host": "x"}), ("host pve1", "'pve_host'")),
    "lxc key on pve host": Case(pve(host={"lxc_home": "/root"}), ("host pve1", "'lxc_home'", "platform is pve")),
    "pct_local not bool": Case(pve({"pct_local": "yes"}), (C105, "'pct_local'", "bool")),
    # A pve-container version the rules cannot compare: named with its host, not a bare
    # ValueError from pve_releases at the first pct command (issue 33, item 7).
    "pct_pve_container typo": Case(
        pve({"pct_pve_container": "6.1.x"}),
        (C105, "field 'pct_pve_container' = '6.1.x': not a pve-container version", "'4.4-3'"),
        dry=True,
    ),
    "pct_pve_container with --data": Case(
        PVE_TEXT, ("--data pct_pve_container", "'abc': not a pve-container version"),
        args=("--data", "pct_pve_container=abc"),
    ),
    "native dev min typo": Case(
        pve(host={"pve_container_native_dev_min": "6.x"}),
        ("host pve1: field 'pve_container_native_dev_min' = '6.x': not a pve-container version",),
    ),
    "unknown connector key": Case(lxc({"lxc_hme": "/root"}), ("host lab1, container c1", "'lxc_hme'", "'lxc_home'")),
    "host field on container": Case(pve({"reload_modules": True}), (C105, "'reload_modules'", "belongs to the host")),
    "unknown platform": Case(pve(host={"platform": "proxmox"}), ("host pve1", "'platform'", "'pve'", "'lxc'")),
    # --- field values (rules that exist) -------------------------------------------------------
    "cores not a number": Case(pve({"cores": "many"}), (C105, "'cores'", "'many'")),
    "host default cores bad": Case(pve(host={"cores": "many"}), ("host pve1", "'cores'")),
    "cores bad without containers": Case(
        "pve1:\n  cores: many\n", ("host pve1, container (defaults)", "'cores'", "line 2")
    ),
    "memory too small": Case(pve({"memory_mib": 0}), (C105, "'memory_mib'")),
    "mem fraction above 1": Case(pve({"mem_fraction_static": 1.5}), (C105, "'mem_fraction_static'")),
    "server_port 0": Case(pve({"server_port": 0}), (C105, "'server_port'")),
    "moe backend unknown": Case(pve({"moe_runner_backend": "fast"}), (C105, "'moe_runner_backend'", "'triton'")),
    "stack_install unknown": Case(pve({"stack_install": "all"}), (C105, "'stack_install'", "'pinned'")),
    "hostname invalid": Case(pve({"hostname": "bad_name!"}), (C105, "'hostname'")),
    "service_name with space": Case(pve({"service_name": "sg lang"}), (C105, "'service_name'")),
    "gpus negative": Case(pve({"gpus": [-1]}), (C105, "'gpus")),
    "gpus duplicate": Case(pve({"gpus": [0, 0]}), (C105, "'gpus")),
    "gpus string": Case(pve({"gpus": "some"}), (C105, "'gpus'")),
    "mount without path": Case(pve({"mounts": [{"host_path": "/tank"}]}), (C105, "'mounts")),
    "mount unknown key": Case(
        pve({"mounts": [{"host_path": "/tank", "path": "/m", "ro": True}]}), (C105, "'mounts")
    ),
    "mounts not a list": Case(pve({"mounts": "/tank:/m"}), (C105, "'mounts'")),
    "tp larger than gpus": Case(pve({"tp_size": 4}), (C105, "tp_size 4")),
    "secret env var unset": Case(
        pve({"hf_token": "env:PVE_SGLANG_TEST_UNSET"}), (C105, "'hf_token'", "PVE_SGLANG_TEST_UNSET")
    ),
    "nodes unknown container": Case(
        pve({"nodes": ["@pct/pve1/105", "@pct/pve9/105"]}), ("@pct/pve1/105", "'nodes'", "pve9")
    ),
    # --- field values (the hardening rules of issue 10) --------------------------------------
    "gpus empty": Case(pve({"gpus": []}), (C105, "'gpus'")),
    "bench concurrency 0": Case(pve({"bench_concurrencies": [0]}), (C105, "'bench_concurrencies")),
    "server_host not an ip": Case(pve({"server_host": "not an ip"}), (C105, "'server_host'")),
    "model_path relative": Case(pve({"model_path": "models/m"}), (C105, "'model_path'")),
    "venv_path relative": Case(pve({"venv_path": "venv"}), (C105, "'venv_path'")),
    "cache dir whitespace": Case(
        pve({"sglang_cache_dir": "/var/cache/sg lang"}), (C105, "'sglang_cache_dir'"),
    ),
    "api_key empty": Case(pve({"api_key": ""}), (C105, "'api_key'")),
    "sglang_version latest": Case(pve({"sglang_version": "latest"}), (C105, "'sglang_version'")),
    "cores huge": Case(pve({"cores": 100_000_000}), (C105, "'cores'")),
    "mount host_path comma": Case(
        pve({"mounts": [{"host_path": "/tank,backup=1", "path": "/m"}]}), (C105, "'mounts"),
    ),
    "api-key in extra args": Case(
        pve({"extra_server_args": ["--api-key", "x"]}), (C105, "'extra_server_args"),
    ),
    "newline in model_path": Case(pve({"model_path": "/models/a\nb"}), (C105, "'model_path'")),
    "newline in venv_path": Case(pve({"venv_path": "/opt/v\n/x"}), (C105, "'venv_path'")),
    # --- --data --------------------------------------------------------------------------------
    "data literal api_key": Case(
        PVE_TEXT, ("--data api_key", "env:NAME", "ps"), args=("--data", "api_key=abc"), dry=True
    ),
    "data= literal hf_token": Case(
        PVE_TEXT, ("--data hf_token", "env:NAME"), args=("--data=hf_token=hf_abcdef",)
    ),
    "data literal numeric api_key": Case(PVE_TEXT, ("--data api_key",), args=("--data", "api_key=123")),
    "data cores not a number": Case(
        PVE_TEXT, (C105, "'cores'", "given with --data"), args=("--data", "cores=many"), dry=True
    ),
    "data= mem fraction": Case(
        PVE_TEXT, (C105, "'mem_fraction_static'", "given with --data"),
        args=("--data=mem_fraction_static=2",),
    ),
    "data unknown field": Case(
        PVE_TEXT, ("--data modle_path", "did you mean 'model_path'"), args=("--data", "modle_path=/m")
    ),
    "data platform": Case(PVE_TEXT, ("--data platform", "hosts file"), args=("--data", "platform=lxc")),
    "data pct_vmid": Case(PVE_TEXT, ("--data pct_vmid",), args=("--data", "pct_vmid=200")),
    "data ssh_port string": Case(PVE_TEXT, ("--data ssh_port", "int"), args=("--data", "ssh_port=abc")),
    "data tp larger than gpus": Case(
        PVE_TEXT, (C105, "tp_size", "given with --data"), args=("--data", "tp_size=8")
    ),
    "data secret env unset": Case(
        PVE_TEXT, (C105, "'api_key'", "PVE_SGLANG_TEST_UNSET"),
        args=("--data", "api_key=env:PVE_SGLANG_TEST_UNSET"),
    ),
    "data model_path relative": Case(
        PVE_TEXT, (C105, "'model_path'", "given with --data"), args=("--data", "model_path=rel"),
    ),
    "data gpus empty": Case(
        PVE_TEXT, (C105, "'gpus'", "given with --data"), args=("--data", "gpus=[]"),
    ),
}

RESULTS: dict[str, dict] = {}


class Cli:
    """The real pyinfra CLI (``pyinfra_cli``), run in the repository on a hosts file."""

    def __init__(self, cli: PyinfraCli, tmp_dir: Path):
        self.cli, self.tmp_dir = cli, tmp_dir
        self.runs = 0

    def __call__(self, content: str | bytes, *args: str, deploy: bool = False,
                 env: dict | None = None) -> subprocess.CompletedProcess:
        self.runs += 1
        run_dir = self.tmp_dir / f"run{self.runs}"
        run_dir.mkdir()
        hosts = run_dir / "hosts.yml"
        hosts.write_bytes(content if isinstance(content, bytes) else content.encode())
        environ = {**os.environ, "PVE_SGLANG_HOSTS": str(hosts), **(env or {})}
        environ.pop("PVE_SGLANG_TEST_UNSET", None)
        return self.cli("inventory.py", *(["deploy.py", "--dry"] if deploy else
                                          ["debug-inventory"]), *args, env=environ)


@pytest.fixture(scope="module")
def run_cli(pyinfra_cli, tmp_path_factory):
    """Run ``pyinfra inventory.py debug-inventory ARGS`` (or ``deploy.py --dry``) on a file."""
    return Cli(pyinfra_cli, tmp_path_factory.mktemp("cli"))


@pytest.mark.parametrize("name", list(CASES))
def test_bad_hosts_file_exits_2_without_traceback(run_cli, name):
    case = CASES[name]
    runs = [False, True] if case.dry else [False]
    for deploy in runs:
        result = run_cli(case.content, *case.args, deploy=deploy, env=case.env)
        output = result.stdout + result.stderr
        RESULTS[f"{name}{' (deploy.py --dry)' if deploy else ''}"] = {
            "rc": result.returncode,
            "traceback": "Traceback" in output,
        }
        assert "Traceback" not in output, output
        assert "internal exception" not in output.lower() and "full traceback" not in output, output
        assert result.returncode == 2, output
        assert "pve-sglang: invalid settings" in result.stderr
        for text in case.expect:
            assert text in result.stderr, f"{text!r} not in {result.stderr!r}"
        # Stopped at inventory time: nothing was contacted.
        assert "Connecting to hosts" not in output


SECRETS = {"api_key": "sk-literal-4f1d9c", "hf_token": "hf_literalTokenA7"}


def secret_hosts_file() -> str:
    """Secrets written literally, on the host entry (defaults) and on a container."""
    return yaml.safe_dump({
        "lab1": {
            "ssh_hostname": "192.0.2.20",
            "platform": "lxc",
            "hf_token": SECRETS["hf_token"],
            "containers": [
                {"name": "c1", "gpus": [0], "api_key": SECRETS["api_key"]},
                {"name": "c2", "gpus": [0]},
            ],
        },
    })


@pytest.mark.parametrize("flags", [(), ("-v",), ("-vv",), ("--debug",), ("--json",)])
def test_debug_inventory_never_prints_literal_secrets(run_cli, flags):
    result = run_cli(secret_hosts_file(), *flags)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    for key, value in SECRETS.items():
        assert value not in output, f"{key} value printed with {flags}"
        assert f'"{key}": "<secret>"' in output, output  # the key is there, masked
    assert "@lxc/lab1/c2" in output


def test_literal_secret_is_masked_in_host_data_but_reaches_the_settings():
    """The mask is only for printing: the server's env file still gets the real values."""
    from pve_sglang.hosts_file import HostSecret, build_groups
    from pve_sglang.project import load_defaults
    from pve_sglang.config.settings import ContainerSettings, settings_for

    _, containers = build_groups(yaml.safe_load(secret_hosts_file()))
    data = dict(containers)["@lxc/lab1/c1"]
    assert isinstance(data["api_key"], HostSecret) and isinstance(data["hf_token"], HostSecret)
    assert SECRETS["api_key"] not in json.dumps(data, default=lambda value: value.to_json())
    settings = settings_for({**load_defaults(), **data}, ContainerSettings)
    assert settings.secrets == {"HF_TOKEN": SECRETS["hf_token"], "SGLANG_API_KEY": SECRETS["api_key"]}


def test_secret_by_environment_name_is_shown_as_the_name(run_cli):
    hosts = pve({"api_key": "env:PVE_SGLANG_TEST_KEY"})
    result = run_cli(hosts, env={"PVE_SGLANG_TEST_KEY": "sk-from-env-0b7e"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert '"api_key": "env:PVE_SGLANG_TEST_KEY"' in output
    assert "sk-from-env-0b7e" not in output


def test_data_with_env_secret_and_valid_values_is_accepted(run_cli):
    result = run_cli(
        PVE_TEXT, "--data", "api_key=env:PVE_SGLANG_TEST_KEY", "--data=cores=8",
        env={"PVE_SGLANG_TEST_KEY": "sk-from-env-0b7e"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert '"cores": 8' in output and "sk-from-env-0b7e" not in output


def test_connector_keys_the_user_may_set_are_accepted(run_cli):
    hosts = lxc({"lxc_home": "/home/x", "lxc_local": False}, host={"ssh_user": "root", "ssh_port": 2222})
    result = run_cli(hosts)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    container = output[output.index("@lxc/lab1/c1"):]
    assert '"lxc_home": "/home/x"' in container and '"ssh_port": 2222' in container


def test_yaml_merge_keys_are_not_duplicates(run_cli):
    hosts = (
        "base: &base\n  platform: pve\n  ssh_hostname: 192.0.2.10\n"
        "pve1:\n  <<: *base\n  ssh_hostname: 192.0.2.11\n  containers: [{vmid: 105, gpus: [0]}]\n"
    )
    result = run_cli(hosts)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert '"ssh_hostname": "192.0.2.11"' in output[output.index("@pct/pve1/105"):]


def multi_node_hosts_file() -> str:
    """Two Proxmox hosts with 2 GPUs each, one TP group of 4 over both (valid multi-node)."""
    nodes = ["@pct/a/105", "@pct/b/105"]
    return yaml.safe_dump({
        name: {
            "ssh_hostname": address,
            "platform": "pve",
            "containers": [{"vmid": 105, "gpus": [0, 1], "tp_size": 4, "nodes": nodes}],
        }
        for name, address in (("a", "192.0.2.31"), ("b", "192.0.2.32"))
    })


def test_multi_node_tp_over_two_hosts_is_accepted(run_cli):
    result = run_cli(multi_node_hosts_file())
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert result.returncode == 0, output
    assert "@pct/a/105" in output and "@pct/b/105" in output


def test_summary_of_bad_hosts_files(capsys):
    """Print (and keep in .cache/) the counts the closing note reports."""
    if not RESULTS:
        pytest.skip("no bad hosts file ran in this session")
    files = {name.removesuffix(" (deploy.py --dry)") for name in RESULTS}
    summary = {
        "bad_hosts_files": len(files),
        "cli_runs": len(RESULTS),
        "exit_codes": dict(Counter(str(r["rc"]) for r in RESULTS.values())),
        "tracebacks": sum(r["traceback"] for r in RESULTS.values()),
        "not_exit_2": sorted(name for name, r in RESULTS.items() if r["rc"] != 2),
    }
    SUMMARY_FILE.parent.mkdir(exist_ok=True)
    SUMMARY_FILE.write_text(json.dumps(summary, indent=2) + "\n")
    with capsys.disabled():
        print(f"\nbad hosts files: {json.dumps(summary)}")
    assert summary["tracebacks"] == 0
