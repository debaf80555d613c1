"""Hostile strings in every string setting never inject into a shell (issue 10, item 1).

For every string setting (each ``str``, ``list[str]``, optional ``str`` and secret field of
``HostSettings``, ``ContainerSettings`` and ``Mount``, read from the models, plus the container
names), hostile values (``$(touch F)``, a backtick form, ``'``, ``"``, ``;``, a newline, ``&&``,
``|``, a space, a comma, and ``${IFS}`` forms without whitespace) are put through the hosts
file's validation. A refusal must be a ``SettingsError``. Where the value is accepted, all three
phases (host, container, verify) run on ``@fake`` hosts that answer with RECORDED outputs: the
H200 GPU host (tests/fixtures/h200) and Proxmox's pct/pveam answers (tests/fixtures/public).
No Proxmox host or GPU exists here. Every command the deploy would run, facts included, is
then run for real by ``sh`` (dash, as on Debian and Proxmox): first ``sh -n`` (it must parse),
then ``sh -c`` in a throwaway chroot whose only tools are stubs (``pct``, ``apt-get``,
``systemctl``, ... exit 0; ``pct exec`` and ``lxc-attach`` run the command after ``--``, as the
real tools do) and a few harmless coreutils, so no real tool is ever reached. Container
commands are wrapped by the real ``@pct`` / ``@lxc`` connector code first. Uploaded files are
written into the chroot, so the env file is sourced for real by the commands that read it.
F (a file in the chroot) must never be created.

Below validation, every operation's and fact's commands (and the shared layer's) get the payloads
in every string argument, in the chroot. The payloads, the string settings read from the models,
the batch shell and the cases below validation are tests/unit/test_hostile_strings_without_root.py's,
which runs the same cases without root (``PlainShell``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.operations import run_ops
from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput, make_unix_command_for_host
from pyinfra.facts.server import Which

from pve_sglang.model_store.facts import FILES_FOLLOW
from pve_sglang.facts.container import UnitState
from pve_sglang.hosts_file import build_inventory, build_monitored_inventory
from pve_sglang.config.gateway import smg_lock_path
from pve_sglang.operations import phase
from pve_sglang.preflight import PreflightError
from pve_sglang.config.settings import SECRET_FIELDS, SettingsError
from pve_sglang.stack.lock import parse
from tasks.container import container_phase
from tasks.host import host_phase
from tasks.verify import verify_phase
from tasks.gateway import gateway_phase
from tasks.monitoring import monitoring_phase
from pve_sglang.remote.bench_record import RECORD_PREFIX, kept
from pve_sglang.server.bench import EXIT_STATUS_PREFIX, bench_module
from bench_summary import summary_record
from test_host_phase_recorded import container_answers, gpu_host_responses
from test_hostile_strings_without_root import (
    BATCH_TIMEOUT_S, BatchShell, DEFAULTS, F, PASS_THROUGH, PAYLOADS, PLATFORMS, SHIPPED_LOCK,
    STORE_COMMANDS, STUBS, Step, _write_stub, fact_problems, facts, forms, hosts_file,
    operation_problems, settings_cases,
)
# The module's autouse fixtures: they hold for these tests as for the fast tier's.
from test_hostile_strings_without_root import connectors_read_once, fetched_wheels  # noqa: F401

FIXTURES = Path(__file__).parents[1] / "fixtures"
BENCH_OUTPUT = (FIXTURES / "bench" / "bench_serving_0.5.9.txt").read_text()
# Real tools, harmless inside the chroot (touch is what an injection would run).
REAL_TOOLS = ("touch cat grep sed sort tail head cut tr stat sha1sum ls mkdir ln chmod install mv "
              "rm cp awk env tar id true false").split()
NOT_FOUND = re.compile(r"^(?:sh|/bin/sh|dash): \d+: (.+): not found$")

FORMS = len(forms("", ""))


# --- the deploy on @fake hosts, every command recorded ------------------------------------


def _responses(platform: str) -> dict:
    """Recorded answers of the H200 GPU host and Proxmox; a verify that passes."""
    answers = {
        **gpu_host_responses(),
        **container_answers(None, None),
        Which().command("lxc-start").get_raw_value(): "/usr/bin/lxc-start",
        "nvidia-smi -L": "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)",
        "gpu_checks.py cuda": json.dumps({"ok": True, "device_count": 1, "torch": "2.9.1",
                                          "devices": [{"name": "NVIDIA H200"}]}),
        "curl -s -o /dev/null": "200",
        # The server unit runs and its startup watch finds it serving; one good completion.
        UnitState().command("sglang.service").get_raw_value():
            "ActiveState=active\nUnitFileState=enabled\n"
            "ExecMainStartTimestamp=Wed 2026-12-02 21:09:32.618391 UTC",
        "startup_watch.py watch": json.dumps({"state": {"ActiveState": "active"}, "health": 200,
                                              "cursor": "", "now": 1796245800_000000}),
        "startup_watch.py generate": json.dumps({
            "status": 200, "text": "Red, blue and yellow.", "tokens": 5, "ttft_s": 0.05,
            "elapsed_s": 0.1, "logprobs": ["-0.1"], "model": "m"}),
        # The benchmark's output and, after it, bench_record.py's line of the record's numbers.
        bench_module(DEFAULTS["sglang_version"]): BENCH_OUTPUT + RECORD_PREFIX + json.dumps(
            kept(summary_record(BENCH_OUTPUT))) + f"\n{EXIT_STATUS_PREFIX}0",
        # The venv is the locked set, as the verify phase finds it after the install (a
        # recorded answer cannot change between the install and the check); the install
        # command itself gets hostile arguments in test_every_operation_quotes_its_string_arguments.
        # (Matched on its script's text: the venv's path may be a hostile one.)
        "def distributions():": json.dumps({"packages": parse(SHIPPED_LOCK).packages,
                                      "patch": "already-patched\n", "python": "3.11"}),
        # The model: a plan with all to fetch (so the fetch command runs with the settings'
        # values), a fetch that ends, and the marker the verify phase reads.
        "model_fetch.py plan": json.dumps({
            "repo": "org/model", "commit": "c" * 40, "recorded": None, "hub_commit": "c" * 40,
            "files": 2, "bytes": 10, "dir": "/models/model", "missing_files": 2,
            "missing_bytes": 10, "partial_bytes": 0, "free_bytes": 10**12, "complete": False,
            "settled": False, "gated": False}),
        "model_fetch.py watch": json.dumps({"done": {"commit": "c" * 40, "files": 2, "bytes": 10,
                                                     "fetched_files": 2, "fetched_bytes": 10,
                                                     "seconds": 1}})
        + "\n" + json.dumps({"offset": 100, "running": False}),
        # The marker, then the model folder's files at the sizes it lists (model_store.facts).
        ".pve-sglang-model.json": json.dumps({"repo": "org/model", "commit": "c" * 40,
                                              "files": 2, "bytes": 10,
                                              "sizes": {"config.json": 4, "model.safetensors": 6}})
        + f"\n{FILES_FOLLOW}\n4 config.json\n6 model.safetensors",
    }
    # No shared layer yet: the container builds it (its marker's test fails).
    answers[re.compile(r"^test -f .*\.layer'?$")] = {"success": False}
    # The @fake connector answers the first key contained in a command: longest first.
    return dict(sorted(answers.items(), key=lambda item: -len(str(item[0]))))


def _gateway_responses(workers: list[dict]) -> dict:
    """A gateway that lists its workers healthy, its venv the lock's set, its unit running."""
    lock = parse(smg_lock_path(DEFAULTS["smg_version"], DEFAULTS["gateway_python"]))
    return {
        "gateway_workers.py status": json.dumps({
            "workers": [{"url": w["url"], "is_healthy": True, "status": "ready"} for w in workers],
            "registered": [w["url"] for w in workers], "keys_current": True}),
        # Each worker answers the check's one generation (remote/gateway_workers.py check).
        "gateway_workers.py check": json.dumps({"workers": [
            {"name": w["url"], "url": w["url"], "ok": True, "why": None, "status": 200,
             "events": 4, "elapsed_s": 0.1} for w in workers]}),
        "import importlib.metadata as m, json": json.dumps({**lock.packages, "pip": "23.0.1"}),
        UnitState().command("smg.service").get_raw_value():
            "ActiveState=active\nUnitFileState=enabled\n"
            "ExecMainStartTimestamp=Wed 2026-12-02 21:09:32.618391 UTC",
    }


def _all_phases() -> None:
    """deploy.py's phases, without a gateway's."""
    host_phase()
    phase.done(name="Proxmox hosts done", phase="host")
    container_phase()
    phase.done(name="GPU containers done", phase="container")
    verify_phase()


def _gateway_phases() -> None:
    """With a gateway's settings: the gateway's phase. The other phases take none of them: its
    container is made from container settings (tried as the containers' are), and the
    benchmark through it from its validated address and port (``test_gateway.py``)."""
    gateway_phase()


def _monitoring_phases() -> None:
    """With the monitoring's settings: its phase (Prometheus in its container, the node
    exporter on the GPU host); its container is made from container settings."""
    monitoring_phase()


class Deploy:
    """One deploy of a validated hosts file on @fake hosts: prepare and execute."""

    def __init__(self, platform: str, hosts: dict):
        pve_hosts, gpu_containers, gateways, monitoring = build_monitored_inventory(hosts, DEFAULTS)
        [(host_name, host_data)] = pve_hosts
        [(ct_name, ct_data)] = gpu_containers
        self.platform = platform
        self.host, self.ct, self.gw, self.mon = "@fake/host", "@fake/ct", "@fake/gw", "@fake/mon"
        self.ct_data = ct_data
        workers = [{**w, "name": self.ct} for _, gw in gateways for w in gw["gateway_worker_list"]]
        responses = {**_responses(platform), **_gateway_responses(workers)}
        responses = dict(sorted(responses.items(), key=lambda item: -len(str(item[0]))))
        fake = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0}
        data = {
            self.host: {**DEFAULTS, **host_data, **fake, "containers": [self.ct],
                        "gateways": [self.gw] if gateways else []},
            self.ct: {**DEFAULTS, **ct_data, **fake, "pve_host": self.host},
        }
        groups = {"pve_hosts": ([self.host], {}), "gpu_containers": ([self.ct], {})}
        if gateways:
            data[self.gw] = {**DEFAULTS, **gateways[0][1], **fake, "pve_host": self.host,
                             "gateway_worker_list": workers}
            groups["gateways"] = ([self.gw], {})
        if monitoring:
            targets = [{**t, "name": self.ct} for t in monitoring[0][1]["monitoring_targets"]]
            data[self.mon] = {**DEFAULTS, **monitoring[0][1], **fake, "pve_host": self.host,
                              "monitoring_targets": targets}
            groups["monitoring"] = ([self.mon], {})
        self.inventory = Inventory((list(data.items()), {}), **groups)
        self.phases = (_monitoring_phases if monitoring else
                       _gateway_phases if gateways else _all_phases)
        self.state = State(self.inventory, Config())

    def run(self, monkeypatch) -> list[tuple]:
        """Prepare and execute; the commands and uploads in order, per host."""
        events: list[tuple] = []
        run_shell_command, put_file = FakeConnector.run_shell_command, FakeConnector.put_file

        def record_command(connector, command, *args, **kwargs):
            text = command if isinstance(command, str) else command.get_raw_value()
            events.append(("cmd", connector.host.name, text))
            return run_shell_command(connector, command, *args, **kwargs)

        def record_upload(connector, src, dest, *args, **kwargs):
            if hasattr(src, "getvalue"):
                content = src.getvalue()
                content = content.encode() if isinstance(content, str) else content
            else:
                content = Path(src).read_bytes() if Path(src).is_file() else None
            events.append(("put", connector.host.name, dest, content))
            return put_file(connector, src, dest, *args, **kwargs)

        # The shared layer's copy runs on the container's host, through its exec tool.
        real = self.connector()[2]

        def record_on_host(connector, command):
            events.append(("cmd", self.host, command.get_raw_value()))
            return True, CommandOutput([])

        monkeypatch.setattr(FakeConnector, "run_shell_command", record_command)
        monkeypatch.setattr(FakeConnector, "put_file", record_upload)
        monkeypatch.setattr(FakeConnector, "run_on_host", record_on_host, raising=False)
        monkeypatch.setattr(FakeConnector, "make_exec_command",
                            lambda connector, inner: real.make_exec_command(inner), raising=False)
        monkeypatch.setattr(FakeConnector, "make_rootfs_command",
                            lambda connector: real.make_rootfs_command(), raising=False)
        try:
            connect_all(self.state)
            for host in self.inventory:
                add_deploy(self.state, self.phases, host=host)
            run_ops(self.state)
        finally:
            monkeypatch.setattr(FakeConnector, "run_shell_command", run_shell_command)
            monkeypatch.setattr(FakeConnector, "put_file", put_file)
        failed = [host.name for host in self.state.failed_hosts]
        assert not failed, f"hosts failed at execution: {failed}"
        return events

    def connector(self):
        """The real container connector for this container (its exec and push commands)."""
        if self.platform == "pve":
            name = f"@pct/pve1/{self.ct_data['pct_vmid']}"
            # pve-container of Proxmox VE 9.2 (tests/fixtures/pve): the --keep-env form; the
            # form of older releases adds no string of the user's (test_connector_pct_releases).
            data = {"pct_vmid": self.ct_data["pct_vmid"], "ssh_hostname": "pve1",
                    "pct_pve_container": "6.1.10"}
        else:
            name = f"@lxc/lxc1/{self.ct_data['lxc_name']}"
            data = {"lxc_name": self.ct_data["lxc_name"], "lxc_path": self.ct_data["lxc_path"],
                    "ssh_hostname": "lxc1"}
        state = State(Inventory(([(name, data)], {})), Config())
        host = state.inventory.get_host(name)
        return state, host, host.connector


# --- the sandbox: a chroot of stub tools ----------------------------------------------------


def _copy_with_libraries(binary: str, root: Path) -> None:
    """BINARY and the shared libraries it needs, at the same paths under ROOT."""
    paths = [binary]
    done = subprocess.run(["ldd", binary], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            paths.append(match.group(1))
    for path in paths:
        target = root / path.lstrip("/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(path), target)


#: The batch script's own tools in the chroot (/driver/, on no command's PATH).
DRIVER_TOOLS = ("cat", "mkdir", "rm")


class Sandbox(BatchShell):
    """A throwaway chroot: dash, harmless coreutils, stub tools; commands run as root in it,
    a deploy's thousands in one chroot, not three processes each from pytest's (large) one."""

    not_found = NOT_FOUND

    def __init__(self, root: Path):
        self.root = root
        super().__init__(root / "batch", root / F.lstrip("/"))
        for directory in ("usr/bin", "stub", "tmp", "dev", "hostile", "root", "driver", "batch"):
            (root / directory).mkdir(parents=True, exist_ok=True)
        (root / "bin").symlink_to("usr/bin")
        os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (root / "dev/null").chmod(0o666)
        _copy_with_libraries("/bin/dash", root)
        shutil.copy2("/bin/dash", root / "usr/bin/sh")
        shutil.copy2("/bin/dash", root / "driver/sh")
        for tool in REAL_TOOLS:
            found = shutil.which(tool, path="/usr/bin:/bin")
            if found:
                _copy_with_libraries(found, root)
                if not (root / "usr/bin" / tool).exists():
                    shutil.copy2(os.path.realpath(found), root / "usr/bin" / tool)
        for tool in DRIVER_TOOLS:
            found = shutil.which(tool, path="/usr/bin:/bin")
            _copy_with_libraries(found, root)
            shutil.copy2(os.path.realpath(found), root / "driver" / tool)
        for tool in STUBS:
            _write_stub(root / "stub" / tool, PASS_THROUGH.get(tool, "exit 0"))
        _write_stub(root / "stub/timeout", PASS_THROUGH["timeout"])
        self.chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        self.flagged = self.flag
        self.payloads = PAYLOADS

    def _inside(self, path: str) -> Path | None:
        target = (self.root / path.lstrip("/")).resolve()
        return target if str(target).startswith(str(self.root.resolve()) + "/") else None

    def variables(self, batch: Path) -> dict[str, str]:
        return {"CAT": "/driver/cat", "MKDIR": "/driver/mkdir", "RM": "/driver/rm",
                "PARSE_SH": "/driver/sh", "RUN_SH": "/bin/sh", "WORKDIR": "/",
                "CMD_PATH": "/stub:/usr/bin:/bin", "CMD_HOME": "/root", "FLAG": F,
                "B": "/" + str(batch.relative_to(self.root))}

    def execute(self, script: Path) -> None:
        subprocess.run([self.chroot, str(self.root), "/driver/sh", "/" + str(script.relative_to(self.root))],
                       capture_output=True, timeout=BATCH_TIMEOUT_S, stdin=subprocess.DEVNULL,
                       env={"PATH": "/driver"}, check=True)

    def stub_for(self, name: str) -> Path | None:
        return self._inside(name if "/" in name else f"/stub/{name}")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, as_root):
    if os.geteuid() != 0 or not shutil.which("chroot"):
        pytest.skip("the sandbox is a chroot: needs root")
    return Sandbox(tmp_path_factory.mktemp("hostile-root"))


class Findings:
    """What running one deploy's commands in the sandbox found."""

    def __init__(self):
        self.injections: list[str] = []
        self.parse_failures: list[str] = []
        self.commands = 0

    @property
    def clean(self) -> bool:
        return not (self.injections or self.parse_failures)


_SEEN: dict[tuple, tuple[bool, str | None]] = {}
STATS: dict[str, int] = {"tried": 0, "refused": 0, "planned": 0, "preflight": 0, "commands": 0,
                         "runs": 0}


def replay(deploy: Deploy, events: list[tuple], sandbox: Sandbox) -> Findings:
    """Run every recorded command in the sandbox, container ones through the connector, the
    uploads among them in their order: one batch per deploy."""
    findings = Findings()
    state, ct_host, connector = deploy.connector()
    uploads = hashlib.sha1()
    steps: list[Step] = []
    checks: list[tuple[str, tuple]] = []  # (host command, key) of every command, in order
    batched: dict[tuple, int] = {}  # key -> its step, for the commands not seen before

    def check(host_command: str, layers: list[str]) -> None:
        # A command already run after the same uploads (in this module) is not run again.
        key = (host_command, uploads.hexdigest())
        checks.append((host_command, key))
        if key not in _SEEN and key not in batched:
            batched[key] = len(steps)
            steps.append(("cmd", host_command, tuple(layers)))

    for event in events:
        in_container = event[1] == deploy.ct
        if event[0] == "cmd":
            command = event[2]
            if not in_container:
                check(command, [command])
                continue
            inner = make_unix_command_for_host(state, ct_host, StringCommand(command))
            wrapped = StringCommand("cd", "/", "&&", connector.make_exec_command(inner))
            check(wrapped.get_raw_value(), [command, inner.get_raw_value(), wrapped.get_raw_value()])
        else:
            _, _, dest, content = event
            uploads.update(repr((dest, content)).encode())
            if content is not None:
                steps.append(("put", dest, content))
            if in_container:
                temp = "/tmp/pyinfra-container-upload/upload"
                steps.append(("put", temp, content or b""))
                push = StringCommand("cd", "/", "&&", connector.make_push_command(temp, dest))
                check(push.get_raw_value(), [push.get_raw_value()])
    results = sandbox.check_steps(steps)
    for key, index in batched.items():
        _SEEN[key] = results[index]
    for host_command, key in checks:
        findings.commands += 1
        injected, error = _SEEN[key]
        if injected:
            findings.injections.append(host_command)
        if error:
            findings.parse_failures.append(f"{host_command!r}: {error}")
    return findings


def attempt(platform: str, settings: list, sandbox: Sandbox, monkeypatch) -> Findings | Exception:
    """Deploy SETTINGS on @fake hosts and run its commands in the sandbox; or what it raised."""
    try:
        deploy = Deploy(platform, hosts_file(platform, settings))
        return replay(deploy, deploy.run(monkeypatch), sandbox)
    except Exception as error:  # noqa: BLE001 - the caller reports it
        return error


def locate(platform: str, settings: list, sandbox: Sandbox, monkeypatch, problems: list) -> None:
    """Deploy SETTINGS together; split them until each finding names its field."""
    result = attempt(platform, settings, sandbox, monkeypatch)
    if isinstance(result, Findings) and result.clean:
        STATS["planned"] += len(settings)
        STATS["commands"] += result.commands
        return
    if len(settings) > 1:
        middle = len(settings) // 2
        locate(platform, settings[:middle], sandbox, monkeypatch, problems)
        locate(platform, settings[middle:], sandbox, monkeypatch, problems)
        return
    [(_, field, setting)] = settings
    name = f"{field}={setting!r}"
    if isinstance(result, PreflightError):
        STATS["preflight"] += 1  # refused before any change, with a clean message
    elif isinstance(result, Exception):
        problems.append(f"{name}: accepted, then {type(result).__name__}: {result}")
    else:
        STATS["planned"] += 1
        STATS["commands"] += result.commands
        problems.extend(f"{name}: F created by: {c}" for c in result.injections)
        problems.extend(f"{name}: does not parse: {e}" for e in result.parse_failures)


# --- the tests ------------------------------------------------------------------------------


def test_the_sandbox_sees_an_unquoted_value(sandbox):
    """The check can fail: an unquoted value creates F, also through pct exec's wrapping; an
    upload lands before the commands after it and not before those ahead of it."""
    value = PAYLOADS["dollar-paren"]
    assert sandbox.run(f"echo no template matching {value}")
    assert sandbox.run(f"pct exec 105 --keep-env 0 -- sh -c 'echo {value}'")
    assert not sandbox.run(StringCommand("echo", QuoteString(value)).get_raw_value())
    assert sandbox.parses("echo 'unterminated") is not None
    assert sandbox.parses(StringCommand("echo", QuoteString(value)).get_raw_value()) is None
    # In one batch: the env file is sourced before its upload (nothing), then after it (F).
    source = "[ -f /etc/hostile.env ] && . /etc/hostile.env; true"
    results = sandbox.check_steps([("cmd", source, (source,)),
                                   ("put", "/etc/hostile.env", f"X={value}\n".encode()),
                                   ("cmd", source, (source,)),
                                   ("cmd", "echo 'unterminated", ("echo 'unterminated",)),
                                   ("cmd", "true", ())])
    assert [results[index][0] for index in (0, 2, 3, 4)] == [False, True, False, False]
    assert results[3][1] is not None and results[0][1] is None and results[4][1] is None
    assert not sandbox.flagged.exists()


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_hostile_value_never_injects_on_recorded_h200_and_proxmox_facts(
    platform, payload, sandbox, monkeypatch, tmp_path
):
    # The benchmark writes its history (bench_history_dir, relative) where pyinfra runs.
    monkeypatch.chdir(tmp_path)
    value = PAYLOADS[payload]
    # By form: each field once a deploy. The secrets ride with the next form's other fields: a
    # secret's value as a whole argument of the server's command line is refused before any
    # change (rightly), which would split a group of one form down to each field, a deploy each;
    # the forms differ, so no value is a secret's (a refusal would still split, and so be found).
    accepted: dict[tuple[int, str], list[tuple[str, str, Any]]] = {}
    refused = []
    for where, field, index, setting in settings_cases(platform, value):
        STATS["tried"] += 1
        try:
            build_inventory(hosts_file(platform, [(where, field, setting)]), DEFAULTS)
        except SettingsError:
            refused.append((field, setting))
            STATS["refused"] += 1
            continue
        secret = field in SECRET_FIELDS | {"gateway_api_key"}
        # The gateway's and monitoring's own fields apart: the others deploy without them.
        phases = where if where in ("gateway", "monitoring") else "deploy"
        slot = (index + 1) % FORMS if secret else index
        accepted.setdefault((slot, phases), []).append((where, field, setting))

    problems: list[str] = []
    for settings in accepted.values():
        # All accepted fields at once; halves of them when that finds something, down to the
        # field that does.
        locate(platform, settings, sandbox, monkeypatch, problems)
    STATS["runs"] = sandbox.runs
    print(f"{platform} {payload}: {STATS}")
    assert not problems, "\n".join(problems)


# --- below validation: every operation and fact quotes what it is given ---------------------


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_every_operation_quotes_its_string_arguments(payload, sandbox):
    planned, problems = operation_problems(sandbox, sandbox.payloads[payload])
    assert planned > 30  # the operations did plan their commands
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("commands", list(STORE_COMMANDS))
def test_the_store_commands_quote_their_paths(commands, payload, sandbox):
    problems = STORE_COMMANDS[commands](sandbox, sandbox.payloads[payload])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_every_fact_quotes_its_string_arguments(payload, sandbox):
    ran, problems = fact_problems(sandbox, sandbox.payloads[payload])
    # Most facts took the hostile value (a refusal is fine, but all refused would prove nothing).
    assert ran > len(facts()) // 2
    assert not problems, "\n".join(problems)
