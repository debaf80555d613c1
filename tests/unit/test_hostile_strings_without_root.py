"""Hostile strings never inject into a shell (issue 10, item 1), without root: the payloads, the
string settings read from the models, and below validation every operation's and fact's commands
(and the shared layer's) with the payloads in every string argument, run for real by ``sh``.

The payloads: ``$(touch F)``, a backtick form, ``'``, ``"``, ``;``, a newline, ``&&``, ``|``, a
space, a comma, and ``${IFS}`` forms without whitespace. ``PlainShell`` runs each command with
plain ``sh`` (dash) from a temporary directory whose stub tools come first on PATH, the flag file
inside it (as nobody when the tests run as root); one batch script runs many commands
(``BatchShell``). The same cases in a chroot, and every setting through the hosts file's
validation and all three phases on recorded facts: tests/root/test_hostile_strings.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import inspect
from io import StringIO
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import pytest
from pydantic import BaseModel, SecretStr
from pyinfra.api import FactBase, OperationError
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.operations import parse_commands
from pyinfra_testing.util import FakeHost, FakeState

from pve_sglang.facts import container as container_facts
from pve_sglang.facts import nvidia as nvidia_facts
from pve_sglang.facts import pve as pve_facts
from pve_sglang.facts import system as system_facts
from pve_sglang.facts import verify as verify_facts
from pve_sglang.model_store import facts as model_facts
from pve_sglang.facts import installed_stacks as stacks_facts
from pve_sglang.facts import wheel_store as wheel_store_facts
from pve_sglang.facts.container import UnitState
from pve_sglang.facts.pve import LxcContainerStatus, PctStatus
from pve_sglang.hosts_file import build_inventory
from pve_sglang.config.gateway import GatewaySettings
from pve_sglang.config.monitoring import MonitoringSettings
from pve_sglang.facts import gateway as gateway_facts
from pve_sglang.operations import gateway as gateway_ops
from pve_sglang.model_store import operations as model
from pve_sglang.operations import boot, debs, layer, lxc, nvidia_driver, paths, pct, systemd_unit, venv, wheel_store, wheels
from pve_sglang.operations import stack_switch as stacks
from pve_sglang.operations.systemd_unit import RestartTurn
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import (ContainerSettings, HostSettings, Mount,
                                        SettingsError)
from pve_sglang.remote.file_hash import file_digest
from pve_sglang.runtime.pyinfra_private import operation_function
from pve_sglang.stack.lock import SHIPPED, Lock, LockKey, default_key, parse
from pve_sglang.stack.wheel_fetch import MANIFEST, wheel_dir


def payloads(flag: str) -> dict[str, str]:
    """The hostile values, by name: each one creates FLAG if a shell runs it unquoted."""
    return {
        "dollar-paren": f"$(touch {flag})",
        "backtick": f"`touch {flag}`",
        "single-quote": f"';touch {flag};'",
        "double-quote": f'";touch {flag};"',
        "semicolon": f";touch {flag}",
        "newline": f"\ntouch {flag}\n",
        "and-and": f"&& touch {flag}",
        "pipe": f"|touch {flag}",
        "space": "a b",
        "comma": ",backup=1",
        # Without whitespace, for fields that refuse it.
        "dollar-paren-ifs": f"$(touch${{IFS}}{flag})",
        "backtick-ifs": f"`touch${{IFS}}{flag}`",
        "single-quote-ifs": f"';touch${{IFS}}{flag};'",
        "double-quote-ifs": f'";touch${{IFS}}{flag};"',
        "semicolon-ifs": f";touch${{IFS}}{flag}",
        "and-and-ifs": f"&&touch${{IFS}}{flag}",
    }


F = "/hostile/F"  # in the chroot
PAYLOADS = payloads(F)
URL_BASE = "https://example.invalid/"
PATH_BASE = "/srv/x"

# The base hosts file: one container per platform, with the optional steps switched on (model
# download, benchmark, secrets, a mount), so that the values reach every command they can.
CONTAINER_BASE = {
    "bench": True,
    "api_key": "k3y",
    "hf_token": "hf_t0ken",
    "model_download": "org/model",
    "mounts": [{"host_path": "/tank/models", "path": "/models"}],
    # Reachable from the gateway's container (a loopback server cannot be its worker).
    "server_host": "0.0.0.0",
}
# A gateway in front of the container, on the same host: its string settings reach its phase.
GATEWAY_IDS = {"pve": 120, "lxc": "gw1"}
# A monitoring container on the same host: its string settings reach its phase (and the node
# exporter's, on the GPU host).
MONITORING_IDS = {"pve": 130, "lxc": "mon1"}
MOUNT_BASE = CONTAINER_BASE["mounts"][0]
PLATFORMS = {"pve": ("pve1", "vmid", 105), "lxc": ("lxc1", "name", "ct1")}

# Tools the commands call: stubs in the chroot that exit 0. Any other command a run does not
# find gets a stub too (see Sandbox.run), so every command runs to its end.
STUBS = ("pct pveam pveversion lxc-create lxc-start lxc-stop lxc-wait lxc-info lxc-attach "
         "lxc-destroy apt-get dpkg dpkg-query systemctl curl wget uv pip python3 nvidia-smi "
         "nvidia-modprobe update-initramfs update-ca-certificates modprobe fuser lspci "
         "systemd-detect-virt debootstrap journalctl").split()
# pct exec / lxc-attach run what follows "--"; timeout runs what follows its duration.
PASS_THROUGH = {
    "pct": 'if [ "$1" = exec ]; then while [ $# -gt 0 ] && [ "$1" != -- ]; do shift; done; '
           'shift; exec "$@"; fi; exit 0',
    "lxc-attach": 'while [ $# -gt 0 ] && [ "$1" != -- ]; do shift; done; shift; exec "$@"',
    "timeout": 'shift; exec "$@"',
}


# --- the string settings, read from the models --------------------------------------------


def _is_stringy(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        return _is_stringy(get_args(annotation)[0])
    if annotation in (str, SecretStr):
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_stringy(arg) for arg in get_args(annotation) if arg is not type(None))
    return False


def _is_string_list(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):  # an optional list
        return any(_is_string_list(arg) for arg in get_args(annotation) if arg is not type(None))
    return get_origin(annotation) is list and _is_stringy(get_args(annotation)[0])


def string_fields(model: type[BaseModel]) -> list[tuple[str, str]]:
    """(field, "str" | "list") for every string or list-of-string field of MODEL."""
    fields = []
    for name, info in model.model_fields.items():
        if _is_stringy(info.annotation):
            fields.append((name, "str"))
        elif _is_string_list(info.annotation):
            fields.append((name, "list"))
    return fields


HOST_STRINGS = string_fields(HostSettings)
CONTAINER_STRINGS = string_fields(ContainerSettings)
MOUNT_STRINGS = [name for name, kind in string_fields(Mount) if kind == "str"]
GATEWAY_STRINGS = string_fields(GatewaySettings)
MONITORING_STRINGS = string_fields(MonitoringSettings)
SHIPPED_LOCK = SHIPPED / default_key().name  # the default set's, for Debian 12
# The repository's lock is given: a hostile index URL must not start a lock's resolution.
DEFAULTS = {**load_defaults(), "stack_lock": str(SHIPPED_LOCK)}


def _base(field: str) -> str:
    default = DEFAULTS.get(field)
    if isinstance(default, list):
        default = next((item for item in default if isinstance(item, str)), None)
    return default if isinstance(default, str) and default else PATH_BASE


def forms(payload: str, base: str) -> list[str]:
    """The payload alone, after a plausible value, and inside a URL."""
    return [payload, base + payload, URL_BASE + payload]


def settings_cases(platform: str, payload: str) -> list[tuple[str, str, Any, Any]]:
    """(where, field, form index, value) for every string setting and this payload.

    WHERE is "host", "container", "mount", "gateway" or "key" (the container's VMID or name)."""
    cases = []
    for field, kind in HOST_STRINGS:
        for index, value in enumerate(forms(payload, _base(field))):
            cases.append(("host", field, index, [*DEFAULTS[field], value] if kind == "list" else value))
    for field, kind in CONTAINER_STRINGS:
        for index, value in enumerate(forms(payload, _base(field))):
            cases.append(("container", field, index,
                          [*DEFAULTS[field], value] if kind == "list" else value))
    for field in MOUNT_STRINGS:
        for index, value in enumerate(forms(payload, MOUNT_BASE[field])):
            cases.append(("mount", field, index, value))
    for field, kind in GATEWAY_STRINGS:
        for index, value in enumerate(forms(payload, _base(field))):
            cases.append(("gateway", field, index,
                          [value] if kind == "list" else value))
    for field, _kind in MONITORING_STRINGS:
        for index, value in enumerate(forms(payload, _base(field))):
            cases.append(("monitoring", field, index, value))
    _, key, base = PLATFORMS[platform]
    for index, value in enumerate(forms(payload, str(base))):
        cases.append(("key", key, index, value))
    return cases


def hosts_file(platform: str, settings: list[tuple[str, str, Any]]) -> dict:
    """The hosts file of PLATFORM's one host and container with SETTINGS (where, field, value)."""
    name, key, ident = PLATFORMS[platform]
    host: dict[str, Any] = {"platform": platform}
    if platform == "lxc":
        host["net0"] = "name=eth0,bridge=lxcbr0,ip=dhcp"  # plain LXC has no vmbr0
    container: dict[str, Any] = {key: ident, **json.loads(json.dumps(CONTAINER_BASE))}
    gateway: dict[str, Any] = {key: GATEWAY_IDS[platform]}
    monitoring: dict[str, Any] = {key: MONITORING_IDS[platform]}
    for where, field, value in settings:
        if where == "monitoring":
            monitoring[field] = value
        elif where == "gateway":
            gateway[field] = value
            if field == "gateway_api_key":  # smg passes it on: the workers' key too
                container["api_key"] = value
        elif where == "host":
            host[field] = value
        elif where == "container":
            container[field] = value
        elif where == "mount":
            container["mounts"][0][field] = value
        else:
            container[key] = value
    # The gateway with its own settings only: the container's values reach its commands through
    # the functions the container's own phases run them through (the benchmark's argv), and its
    # files (worker list, keys) are read by Python, not a shell; a deploy is a third longer with it.
    fronted = any(where == "gateway" for where, _, _ in settings)
    watched = any(where == "monitoring" for where, _, _ in settings)
    return {name: {**host, "containers": [container], **({"gateways": [gateway]} if fronted else {}),
                   **({"monitoring": monitoring} if watched else {})}}


# --- the batch shell, and the plain shell without root --------------------------------------


#: A step of a batch: an upload ("put", dest, content) or a command ("cmd", command, layers),
#: LAYERS being the command's forms to parse (inner, wrapped, the host's whole command).
Step = tuple
#: What one command of a batch found: whether it created F, and why it did not parse (or None).
Result = tuple[bool, "str | None"]

# A batch is one script, run by one dash: these functions, then one call a step, each value in
# single quotes (shlex.quote: exact, newlines included). An upload is written where pct push or
# lxc-attach would put it; a command's layers are each parsed by ``sh -n -c``, then the command
# runs with ``sh -c`` from WORKDIR with a clean environment (PATH and HOME alone: the script's
# own variables are not exported), and F is looked for and removed. The step under way is in
# ``current``, so that a command that hangs the batch is named.
_BATCH_FUNCTIONS = r"""
put() {
    [ -d "$2" ] || { "$MKDIR" -p "${2%/*}" 2>/dev/null; "$CAT" "$B/$1.data" >"$2" 2>/dev/null; }
}
parse() {
    "$PARSE_SH" -n -c "$2" </dev/null 2>>"$B/$1.parse" || echo "$1" >>"$B/parse-failed"
}
run() {
    echo "$1" >"$B/current"
    (cd "$WORKDIR" && PATH="$CMD_PATH" HOME="$CMD_HOME" exec "$RUN_SH" -c "$2") \
        </dev/null >/dev/null 2>"$B/$1.err"
    if [ -e "$FLAG" ]; then echo "$1" >>"$B/injected"; "$RM" -f "$FLAG"; fi
}
"""
#: Seconds one batch may take before the command under way is reported as hanging.
BATCH_TIMEOUT_S = 900


class BatchShell:
    """Runs commands as a deploy's shell would, many in one batch script: whether each parses
    and whether it creates the flag file. Subclasses say where (a chroot, or a plain folder)."""

    #: dash's "not found" line for a tool: its name (a path, where the subclass allows one).
    not_found: re.Pattern

    def __init__(self, batches: Path, flag: Path):
        self.batches_dir, self.flag = batches, flag
        self.batches = self.runs = self.parsed = 0
        self.auto_stubs: set[str] = set()
        #: Layer text -> dash's message, or None where it parses (parsing is the text's alone).
        self.parse_errors: dict[str, str | None] = {}

    # What a subclass says.
    def variables(self, batch: Path) -> dict[str, str]:
        """The script's variables: the tools, WORKDIR, CMD_PATH, CMD_HOME, FLAG and B."""
        raise NotImplementedError

    def execute(self, script: Path) -> None:
        """Run SCRIPT (within BATCH_TIMEOUT_S, else subprocess.TimeoutExpired)."""
        raise NotImplementedError

    def stub_for(self, name: str) -> Path | None:
        """Where a stub for the missing tool NAME goes (None: nowhere)."""
        raise NotImplementedError

    # The batches.
    def _drive(self, steps: list[Step]) -> Path:
        """Run STEPS in one script; the batch folder, with the script's lists and stderrs.
        A layer parsed before (the same text) is not parsed again."""
        self.batches += 1
        batch = self.batches_dir / str(self.batches)
        batch.mkdir(parents=True)
        batch.chmod(0o777)
        variables = "".join(f"{name}={shlex.quote(value)}\n"
                            for name, value in self.variables(batch).items())
        lines, parsing = [_BATCH_FUNCTIONS, variables], {}
        for index, step in enumerate(steps):
            if step[0] == "put":
                _, dest, content = step
                (batch / f"{index}.data").write_bytes(content)
                lines.append(f"put {index} {shlex.quote('/' + dest.lstrip('/'))}")
                continue
            _, command, layers = step
            for text in layers:
                if text not in self.parse_errors and text not in parsing:
                    parsing[text] = f"{index}.{len(parsing)}"
                    lines.append(f"parse {parsing[text]} {shlex.quote(text)}")
                    self.parsed += 1
            lines.append(f"run {index} {shlex.quote(command)}")
            self.runs += 1
        script = batch / "script.sh"
        script.write_text("\n".join(lines) + "\n")
        try:
            self.execute(script)
        except subprocess.TimeoutExpired:
            current = int((batch / "current").read_text())
            raise AssertionError(f"did not finish in {BATCH_TIMEOUT_S} s: {steps[current][1]!r}") from None
        failed = _listed(batch / "parse-failed")
        for text, name in parsing.items():
            self.parse_errors[text] = (batch / f"{name}.parse").read_text().strip() \
                if name in failed else None
        return batch

    def check_steps(self, steps: list[Step]) -> dict[int, Result]:
        """Run STEPS in order in one batch; for each command's index, what it found. A tool
        that is not there gets a stub, and the commands that missed it run again."""
        batch = self._drive(steps)
        commands = {index: step for index, step in enumerate(steps) if step[0] == "cmd"}
        errors = {index: (batch / f"{index}.err").read_text(errors="replace") for index in commands}
        injected = {int(name) for name in _listed(batch / "injected")}
        shutil.rmtree(batch)
        pending = list(commands)
        for _ in range(8):
            missing = {index: {m.group(1) for m in map(self.not_found.match, errors[index].splitlines())
                               if m} - self.auto_stubs for index in pending}
            new = set().union(*missing.values())
            if not new:
                break
            for name in new:
                self.auto_stubs.add(name)
                target = self.stub_for(name)
                if target is not None and not target.exists():
                    _write_stub(target)
            pending = [index for index in pending if missing[index]]
            # The commands that missed a tool run again, alone (what ran before them stays).
            batch = self._drive([("cmd", commands[index][1], ()) for index in pending])
            again = _listed(batch / "injected")
            for position, index in enumerate(pending):
                errors[index] = (batch / f"{position}.err").read_text(errors="replace")
                if str(position) in again:
                    injected.add(index)
            shutil.rmtree(batch)
        results = {}
        for index, (_, _, layers) in commands.items():
            problems = [self.parse_errors[layer] for layer in dict.fromkeys(layers)
                        if self.parse_errors[layer]]
            problems += [line for line in errors[index].splitlines() if "Syntax error" in line]
            results[index] = (index in injected, "; ".join(problems) or None)
        return results

    def run(self, command: str) -> bool:
        """Run COMMAND alone: whether it created the flag file."""
        return self.check_steps([("cmd", command, ())])[0][0]

    def parses(self, command: str) -> str | None:
        """None when ``sh -n`` parses COMMAND; else dash's message."""
        return self.check_steps([("cmd", "true", (command,))])[0][1]

    def check_all(self, commands: list[str]) -> list[tuple[int, str]]:
        """(index, problem) for each command that does not parse or creates the flag file."""
        results = self.check_steps([("cmd", command, (command,)) for command in commands])
        problems = []
        for index, command in enumerate(commands):
            injected, error = results[index]
            if error:
                problems.append((index, f"does not parse: {command!r}: {error}"))
            if injected:
                problems.append((index, f"F created by: {command!r}"))
        return problems


def _listed(path: Path) -> set[str]:
    """The names a batch script listed in PATH (none where it wrote none)."""
    return set(path.read_text().split()) if path.exists() else set()


def _write_stub(path: Path, body: str = "exit 0") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


PLAIN_REAL_TOOLS = ("touch", "true", "false")  # and sh: dash, for the nested sh -c
PLAIN_NOT_FOUND = re.compile(r"^[^:\n]*: \d+: ([^/:\n]+): not found$")
NOBODY = 65534


class PlainShell(BatchShell):
    """The same check without a chroot or root: a temporary directory whose stub tools come
    first on PATH (the chroot's stubs, and every other tool a command does not find), and the
    flag file inside it. Commands run with plain ``dash`` from the temporary directory with a
    clean environment; only dash, touch, true and false are real. Run as root, the commands
    run as nobody, so a redirection to a system path cannot write there."""

    not_found = PLAIN_NOT_FOUND

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="pve-sglang-hostile-"))
        self.root.chmod(0o755)
        self.stub, self.work, hostile = self.root / "stub", self.root / "work", self.root / "hostile"
        for directory, mode in ((self.stub, 0o755), (self.work, 0o777), (hostile, 0o777)):
            directory.mkdir()
            directory.chmod(mode)
        super().__init__(self.root / "batches", hostile / "F")
        self.payloads = payloads(str(self.flag))
        self.tools = {name: shutil.which(name, path="/usr/bin:/bin") for name in
                      ("dash", "cat", "mkdir", "rm", *PLAIN_REAL_TOOLS)}
        for name in PLAIN_REAL_TOOLS:
            (self.stub / name).symlink_to(self.tools[name])
        (self.stub / "sh").symlink_to(self.tools["dash"])
        for tool in STUBS:
            _write_stub(self.stub / tool, PASS_THROUGH.get(tool, "exit 0"))
        _write_stub(self.stub / "timeout", PASS_THROUGH["timeout"])
        self.batches_dir.mkdir()
        self.batches_dir.chmod(0o777)
        self.user = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}

    def variables(self, batch: Path) -> dict[str, str]:
        return {"CAT": self.tools["cat"], "MKDIR": self.tools["mkdir"], "RM": self.tools["rm"],
                "PARSE_SH": self.tools["dash"], "RUN_SH": self.tools["dash"],
                "WORKDIR": str(self.work), "CMD_PATH": str(self.stub), "CMD_HOME": str(self.work),
                "FLAG": str(self.flag), "B": str(batch)}

    def execute(self, script: Path) -> None:
        subprocess.run([self.tools["dash"], str(script)], env={}, cwd=self.work,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=BATCH_TIMEOUT_S,
                       check=True, **self.user)

    def stub_for(self, name: str) -> Path | None:
        return self.stub / name

    def close(self) -> None:
        shutil.rmtree(self.root)


@pytest.fixture(scope="module")
def plain_shell():
    shell = PlainShell()
    yield shell
    shell.close()


# --- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def connectors_read_once():
    """pyinfra reads the installed packages' entry points for its connectors at every
    ``Inventory``, and this module makes one per operation and world and per deploy (most of
    the time of the operations' tests): read them once per module, as what is installed does
    not change while it runs."""
    import pyinfra.api.inventory as inventory_module
    from pyinfra.api.connectors import get_all_connectors

    found = get_all_connectors()
    executing = {name: connector for name, connector in found.items() if connector.handles_execution}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inventory_module, "get_all_connectors", lambda: dict(found))
        patch.setattr(inventory_module, "get_execution_connectors", lambda: dict(executing))
        yield


@pytest.fixture(autouse=True)
def fetched_wheels(tmp_path_factory, monkeypatch):
    """The machine running pyinfra has the lock's wheels already (a one-file stand-in): the
    wheel store's upload runs with each hostile store path, and nothing is downloaded."""
    cache = tmp_path_factory.mktemp("pyinfra-machine-cache")
    monkeypatch.setenv("PVE_SGLANG_CACHE", str(cache))
    folder = wheel_dir(parse(SHIPPED_LOCK))
    folder.mkdir(parents=True)
    (folder / "standin-1.0-py3-none-any.whl").write_bytes(b"stand-in")
    (folder / MANIFEST).write_text(f"{file_digest(folder / 'standin-1.0-py3-none-any.whl')}  "
                                   "standin-1.0-py3-none-any.whl\n")


def test_the_plain_shell_sees_an_unquoted_value(plain_shell):
    """The check without root can fail too: an unquoted value creates the flag, through pct
    exec's wrapping as well; a command that does not parse is reported; a quoted one is clean."""
    value = plain_shell.payloads["dollar-paren"]
    commands = [f"echo no template matching {value}",
                f"pct exec 105 --keep-env 0 -- sh -c 'echo {value}'",
                StringCommand("echo", QuoteString(value)).get_raw_value(),
                "echo 'unterminated",
                f"some-tool-no-stub-has --flag && {value.strip('$()')}"]
    problems = dict(plain_shell.check_all(commands))
    assert problems[0].startswith("F created by") and problems[1].startswith("F created by")
    assert 2 not in problems
    assert problems[3].startswith("does not parse")
    # A tool without a stub gets one, and the command runs on to the injection.
    assert problems[4].startswith("F created by")
    assert not plain_shell.flag.exists()


def test_string_settings_are_read_from_the_models():
    """Every string field is tried, as the models define them (not a hand-kept list)."""
    names = {name for name, _ in HOST_STRINGS + CONTAINER_STRINGS + GATEWAY_STRINGS
             + MONITORING_STRINGS} | set(MOUNT_STRINGS)
    assert {"template", "lxc_path", "lxc_config", "venv_path", "model_path", "api_key",
            "extra_server_args", "host_path", "path", "gateway_api_key", "gateway_venv",
            "gateway_workers", "gateway_wheelhouse", "prometheus_host", "monitoring_dir",
            "node_textfile_dir"} <= names
    assert "cores" not in names and "gpus" not in names


# --- below validation: every operation and fact quotes what it is given ---------------------
# Validation refuses most hostile values (the test above); the commands must not depend on
# that. Each operation and fact of the project gets the payloads in every string argument,
# with the facts saying "nothing there yet" (and "running, changed" for the restart paths).

OPERATION_MODULES = (pct, lxc, venv, nvidia_driver, systemd_unit, debs, paths, wheels, layer, boot, model,
                     stacks, wheel_store, gateway_ops)
FACT_MODULES = (container_facts, nvidia_facts, pve_facts, system_facts, verify_facts, model_facts,
                stacks_facts, wheel_store_facts, gateway_facts)
RUNNING = {PctStatus: "running", LxcContainerStatus: "RUNNING",
           UnitState: {"active": "active", "enabled": "disabled"}}


def _argument(annotation: Any, value: str) -> Any:
    """A hostile argument of this type, or a harmless one for a type that holds no string."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _argument(str if str in args else args[0], value)
    if annotation is str:
        return value
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list:
        return [_argument(args[0], value)]
    if origin is tuple:
        return (_argument(args[0], value),)
    if origin is dict:
        return {"hostname": _argument(args[1], value), "sglang": _argument(args[1], value)}
    if annotation is dict:  # an object read from a fact (model.fetched's planned: a plan)
        return {"commit": value, "repo": value, "dir": value}
    if annotation is bool:
        return True
    if annotation is int:
        return 105
    if annotation is float:
        return 1.0
    if origin is Callable or annotation is Callable:
        return lambda: True
    if annotation is Lock:
        return parse(SHIPPED_LOCK)  # no string of a lock reaches a shell: its text is uploaded
    if annotation is RestartTurn:
        return None  # a turn runs the restart's own commands (checked here) in its place
    if annotation is LockKey:
        return LockKey(pins=(("sglang", value),), python="3.11", index_url=value)
    if dataclasses.is_dataclass(annotation) or (
            isinstance(annotation, type) and issubclass(annotation, tuple)
            and hasattr(annotation, "_fields")):
        # A record of the project's (a gateway's Worker, switch_rules.StacksAt): each field
        # hostile where it holds a string.
        return annotation(**{name: _argument(hint, value)
                             for name, hint in get_type_hints(annotation).items()})
    raise TypeError(f"no hostile argument for {annotation!r}")


def _hostile_arguments(function: Callable, value: str, skip: tuple = ()) -> dict:
    hints = get_type_hints(function, include_extras=False)
    names = [n for n in inspect.signature(function).parameters if n not in ("self", *skip)]
    return {name: _argument(hints.get(name, str), value) for name in names}


class _DefaultFacts(FakeHost):
    """A host whose every fact answers its default ("nothing there"), or WORLD's value."""

    def __init__(self, world: dict):
        super().__init__(FakeState(), "hostile", facts={}, data={})
        self.world = world

    def get_fact(self, fact_cls, *args, **kwargs):  # type: ignore[override]
        return self.world[fact_cls] if fact_cls in self.world else fact_cls().default()


def operations() -> list:
    return [
        (f"{module.__name__.rsplit('.', 1)[-1]}.{name}", op)
        for module in OPERATION_MODULES
        for name, op in vars(module).items()
        if operation_function(op) is not None and getattr(op, "__module__", None) == module.__name__
    ]


def facts() -> list:
    return [
        (f"{module.__name__.rsplit('.', 1)[-1]}.{name}", cls)
        for module in FACT_MODULES
        for name, cls in vars(module).items()
        if isinstance(cls, type) and issubclass(cls, FactBase) and cls.__module__ == module.__name__
    ]


def operation_problems(shell, value: str) -> tuple[int, list[str]]:
    """Every operation's commands with VALUE in every string argument, run by SHELL: how many
    commands, and the problems found."""
    planned: list[tuple[str, str]] = []
    for name, op in operations():
        for world in ({}, RUNNING):
            # The host's architecture known: without it a template prefix is refused.
            host = _DefaultFacts({system_facts.DebianArchitecture: "amd64", **world})
            # The nodes a hostile ``nodes`` names are in the run: a node's switch goes on to
            # its commands (``stacks.in_run`` reads the hosts pyinfra deploys).
            host.state.active_hosts = [host, types.SimpleNamespace(name=value)]
            kwargs = _hostile_arguments(operation_function(op), value)
            if "src" in kwargs:
                kwargs["src"] = StringIO(value)
            with ctx_state.use(host.state), ctx_host.use(host):
                try:
                    commands = parse_commands(list(operation_function(op)(**kwargs)))
                except (ValueError, OperationError):
                    continue  # refused before any command: fine
            planned += [(name, c) for c in commands if isinstance(c, str)]
    problems = shell.check_all([command for _, command in planned])
    return len(planned), [f"{planned[index][0]}: {problem}" for index, problem in problems]


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_every_operation_quotes_its_string_arguments_without_root(payload, plain_shell):
    """The same commands under plain sh with stub tools first on PATH: no chroot, no root."""
    planned, problems = operation_problems(plain_shell, plain_shell.payloads[payload])
    assert planned > 30
    assert not problems, "\n".join(problems)


class _ShellExec:
    """A container exec tool in the sandbox: the inner command runs in its own ``sh -c``, as
    ``lxc-attach ... -- sh -c`` and ``pct exec ... -- sh -c`` run it."""

    def make_exec_command(self, inner: StringCommand) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(inner))

    def make_rootfs_command(self) -> StringCommand:
        return StringCommand("echo", QuoteString("lxc.rootfs.path = /var/lib/lxc/x/rootfs"))


def layer_problems(shell, value: str) -> list[str]:
    """The layer's commands are made at execution (a FunctionCommand): run them with SHELL."""
    store = f"/srv/{value}"
    commands = [layer.install_command(f"/opt/{value}/uv", f"/opt/{value}/python", store,
                                      f"/tmp/{value}.txt"),
                layer.copy_command(_ShellExec(), store, parse(SHIPPED_LOCK))]
    return [problem for _, problem in shell.check_all([c.get_raw_value() for c in commands])]


def store_problems(shell, value: str) -> list[str]:
    """The wheel store's retention: its commands are made from the store's read (a removal)
    and at execution (a container's record, written by its host): run them with SHELL."""
    from pve_sglang.stack.store_retention import Prune, user_path, user_text

    store_path, lock_id = f"/srv/{value}", "a" * 16
    prune = Prune(locks=(lock_id,), wheels=(f"{value}.whl",), stale=("b" * 16,))
    commands = [*wheel_store.commands(store_path, prune),
                wheel_store.record_command(store_path, user_path(store_path, "lxc-x"),
                                           user_text(value, {lock_id}))]
    return [problem for _, problem in shell.check_all([c.get_raw_value() for c in commands])]


#: Commands made at execution from the store's state: each runs with the hostile value in it.
STORE_COMMANDS = {"shared layer": layer_problems, "store retention": store_problems}


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("commands", list(STORE_COMMANDS))
def test_the_store_commands_quote_their_paths_without_root(commands, payload, plain_shell):
    problems = STORE_COMMANDS[commands](plain_shell, plain_shell.payloads[payload])
    assert not problems, "\n".join(problems)


def fact_problems(shell, value: str) -> tuple[int, list[str]]:
    """Every fact's command with VALUE in every string argument, run by SHELL: how many facts
    took it, and the problems found."""
    planned: list[tuple[str, str]] = []
    for name, cls in facts():
        kwargs = _hostile_arguments(cls.command, value)
        try:
            command = cls().command(**kwargs)
        except ValueError:
            continue  # refused before any command: fine
        planned.append((name, command if isinstance(command, str) else command.get_raw_value()))
    problems = shell.check_all([command for _, command in planned])
    return len(planned), [f"{planned[index][0]}: {problem}" for index, problem in problems]


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_every_fact_quotes_its_string_arguments_without_root(payload, plain_shell):
    ran, problems = fact_problems(plain_shell, plain_shell.payloads[payload])
    assert ran > len(facts()) // 2
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_values_that_cannot_be_quoted_into_their_target_are_refused(platform):
    """Quoting cannot help a newline in a config line, a unit or a path, nor a comma or '=' in a
    Proxmox mount path (pct reads mpN as key=value,...): validation refuses them, cleanly."""
    accepted = []
    for payload in ("\nx", "x\ny", "\r"):
        for where, field, _, value in settings_cases(platform, payload):
            try:
                build_inventory(hosts_file(platform, [(where, field, value)]), DEFAULTS)
            except SettingsError:
                continue
            accepted.append((field, value))
    for payload in (",backup=1", "=1"):
        for field in MOUNT_STRINGS:
            for value in forms(payload, MOUNT_BASE[field]):
                try:
                    build_inventory(hosts_file(platform, [("mount", field, value)]), DEFAULTS)
                except SettingsError:
                    continue
                accepted.append((f"mounts.{field}", value))
    assert not accepted, f"accepted: {accepted}"
