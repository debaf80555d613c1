"""The rendered systemd unit and EnvironmentFile, checked with this machine's systemd tools.

``systemd-analyze verify`` loads the unit as systemd would (the ExecStart binary and the
EnvironmentFile must exist, hence /usr/bin/python3 and a file in tmp_path). At debug log level it
also dumps each command line as systemd parsed it, which the quoting round trip reads back.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pve_sglang import remote
from pve_sglang.remote import sglang_launch, stack_fallback
from pve_sglang.server.command import server_argv
from pve_sglang.server.unit_text import (
    LAUNCHER,
    env_file_path,
    env_quote,
    fallback_unit_name,
    launch_argv,
    render_env,
    render_fallback_unit,
    render_unit,
    systemd_quote,
)
from pve_sglang.stack.switch_rules import state_path
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings

LAUNCHER_SOURCE = remote.source(remote.LAUNCHER)

SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
ENV_GENERATOR = "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator"
PYTHON = "/usr/bin/python3"
HF_TOKEN = "hf_AbCdEfSecretToken123"
API_KEY = "sk-live-Secret$Key%With\"Quotes'"


def settings(**overrides) -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    return ContainerSettings.model_validate({**data, **overrides})


def write_unit(tmp_path: Path, s: ContainerSettings, argv: list[str],
               launcher: str = LAUNCHER) -> tuple[Path, Path, str]:
    env_file = tmp_path / "etc" / f"{s.service_name}.env"
    env_file.parent.mkdir(parents=True, exist_ok=True)
    env_file.write_text(render_env(s))
    env_file.chmod(0o600)
    text = render_unit(s, argv, env_file=str(env_file), launcher=launcher)
    unit = tmp_path / f"{s.service_name}.service"
    unit.write_text(text)
    return unit, env_file, text


def verify(unit: Path, debug: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "debug" if debug else "notice"}
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)],
        capture_output=True, text=True, env=env, timeout=120,
    )


def parsed_commands(unit: Path) -> dict[str, list[list[str]]]:
    """Command lines as systemd parsed them (its debug dump), per Exec* setting."""
    done = verify(unit, debug=True)
    assert done.returncode == 0, done.stderr
    commands: dict[str, list[list[str]]] = {}
    current = None
    for line in (done.stdout + done.stderr).splitlines():
        header = re.match(r"\s*-> (Exec\w+):", line)
        if header:
            current = header.group(1)
        match = re.match(r"\s*Command Line: (.*)$", line)
        if match and current:
            commands.setdefault(current, []).append(unquote_dump(match.group(1)))
    return commands


def unquote_dump(line: str) -> list[str]:
    """Split a dumped command line: words, or double-quoted words with backslash escapes."""
    words = []
    for quoted, bare in re.findall(r'"((?:\\.|[^"\\])*)"|(\S+)', line):
        words.append(re.sub(r"\\(.)", r"\1", quoted) if bare == "" else bare)
    return words


def exec_time(arg: str, env: dict[str, str]) -> str:
    """What systemd passes at exec time: ``$$`` -> ``$``, ``${NAME}`` -> its value."""
    return re.sub(r"\$\$|\$\{(\w+)\}", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), ""), arg)


def sh_env(env_file: Path) -> dict[str, str]:
    """The EnvironmentFile read by POSIX sh."""
    done = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; env -0', "sh", str(env_file)],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"},
    )
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)


@pytest.fixture
def secret_settings(tmp_path):
    return settings(
        hf_token=HF_TOKEN, api_key=API_KEY, sglang_cache_dir=str(tmp_path / "cache"),
        served_model_name="glm-5",
    )


def test_unit_passes_systemd_analyze_verify(tmp_path, secret_settings):
    argv = server_argv(secret_settings, 8, ["12.0"] * 8, None, 1, None, PYTHON)
    unit, _, _ = write_unit(tmp_path, secret_settings, argv)
    done = verify(unit)
    assert done.returncode == 0, done.stderr
    complaints = [line for line in done.stderr.splitlines() if str(unit) in line or unit.name in line]
    assert complaints == []


def test_unit_settings(tmp_path, secret_settings):
    argv = server_argv(secret_settings, 8, ["12.0"] * 8, None, 1, None, PYTHON)
    _, env_file, text = write_unit(tmp_path, secret_settings, argv)
    lines = text.splitlines()
    for expected in [
        "[Unit]", "After=network-online.target", "Wants=network-online.target", "[Service]",
        "Type=simple", f"EnvironmentFile={env_file}", "Restart=on-failure", "RestartSec=10",
        "TimeoutStartSec=3600", "TimeoutStopSec=120", "KillMode=control-group",
        "LimitNOFILE=1048576", "LimitMEMLOCK=infinity", "[Install]", "WantedBy=multi-user.target",
        f"Environment=SGLANG_CACHE_DIR={tmp_path}/cache",
        f"Environment=FLASHINFER_WORKSPACE_BASE={tmp_path}/cache",
        f"WorkingDirectory={tmp_path}/cache",
    ]:
        assert expected in lines, expected
    assert env_file_path(secret_settings) == "/etc/sglang/sglang.env"


def test_no_secret_in_the_unit(tmp_path, secret_settings):
    argv = server_argv(secret_settings, 8, ["12.0"] * 8, None, 1, None, PYTHON)
    unit, env_file, text = write_unit(tmp_path, secret_settings, argv)
    env_text = env_file.read_text()
    for secret in (HF_TOKEN, API_KEY, "SecretToken", "sk-live"):
        assert secret not in text
    assert "hf_AbCdEfSecretToken123" in env_text and "sk-live-Secret" in env_text
    assert "${" not in text and "ExecStartPre" not in text
    env = sh_env(env_file)
    assert env["SGLANG_API_KEY"] == API_KEY and env["HF_TOKEN"] == HF_TOKEN
    # systemd expands nothing: the command line it runs is the same with the secrets set.
    (start,) = parsed_commands(unit)["ExecStart"]
    assert [exec_time(arg, env) for arg in start] == [exec_time(arg, {}) for arg in start]
    assert start[:2] == [PYTHON, LAUNCHER]
    assert "--arg-from-env=--api-key=SGLANG_API_KEY" in start and "--mask-env=HF_TOKEN" in start
    assert "--api-key" not in start
    assert start[start.index("-m"):] == [arg for arg in argv[1:] if arg not in ("--api-key", "${SGLANG_API_KEY}")]


def test_secret_in_argv_is_refused(secret_settings):
    argv = server_argv(secret_settings, 8, [], None, 1, None, PYTHON) + ["--tokenizer-path", HF_TOKEN]
    with pytest.raises(ValueError, match="secret"):
        render_unit(secret_settings, argv, env_file="/etc/sglang/sglang.env")


def test_empty_api_key_variable_stops_the_start(tmp_path, secret_settings):
    """The unit's ExecStart, run as systemd would run it (the real launcher, this machine's
    Python, no sglang here): an empty key stops it with the exit code that prevents restarts."""
    argv = server_argv(secret_settings, 8, [], None, 1, None, PYTHON)
    unit, env_file, text = write_unit(tmp_path, secret_settings, argv, launcher=str(LAUNCHER_SOURCE))
    assert "RestartPreventExitStatus=78" in text.splitlines()
    (start,) = parsed_commands(unit)["ExecStart"]
    base = {"PATH": "/usr/bin:/bin"}
    results = {}
    for label, env in [("set", {**base, **sh_env(env_file)}), ("empty", {**base, "SGLANG_API_KEY": ""}),
                       ("unset", base)]:
        results[label] = subprocess.run(start, env=env, capture_output=True, text=True, timeout=60)
    assert results["empty"].returncode == results["unset"].returncode == 78
    assert "SGLANG_API_KEY is empty or unset" in results["empty"].stderr
    # With the key, the launcher runs the module: this machine has no sglang.
    assert results["set"].returncode == 1 and "No module named" in results["set"].stdout
    for done in results.values():
        assert API_KEY not in done.stdout + done.stderr


def test_no_key_no_guard(tmp_path):
    s = settings(sglang_cache_dir=str(tmp_path / "cache"))
    unit, env_file, text = write_unit(tmp_path, s, server_argv(s, 1, [], None, 1, None, PYTHON))
    assert "--arg-from-env" not in text and "--api-key" not in text and "--mask-env" not in text
    assert [line for line in env_file.read_text().splitlines() if not line.startswith("#")] == []
    assert verify(unit).returncode == 0


def test_quoting_round_trip(tmp_path):
    tricky = [
        "--chat-template", "/models/my template %i.jinja",
        "--json-model-override-args", '{"rope": "$HOME", "q": "it\'s", "b": "back\\\\slash"}',
        "--tool-call-parser", "100%",
        "--enable-metrics",
        "--empty", "",
        "--semicolon", ";",
    ]
    s = settings(sglang_cache_dir=str(tmp_path / "cache"), extra_server_args=tricky)
    argv = server_argv(s, 2, ["9.0", "9.0"], None, 1, None, PYTHON)
    unit, _, text = write_unit(tmp_path, s, argv)
    assert '"/models/my template %%i.jinja"' in text and '"100%%"' in text and "$$HOME" in text
    (start,) = parsed_commands(unit)["ExecStart"]
    expanded = [exec_time(arg, {}) for arg in start]
    assert expanded == launch_argv(argv)
    assert expanded[expanded.index("-m"):] == list(argv[1:])


@pytest.mark.parametrize(
    "arg, quoted",
    [("plain", "plain"), ("a b", '"a b"'), ("50%", '"50%%"'), ("$X", '"$$X"'), ("", '""'),
     ('say "hi"', '"say \\"hi\\""'), ("a\\b", '"a\\\\b"'), ("it's", '"it\'s"')],
)
def test_systemd_quote(arg, quoted):
    assert systemd_quote(arg) == quoted


def test_env_file_round_trip(tmp_path):
    values = {"HF_TOKEN": 'hf_"quoted"\\back`tick`', "SGLANG_API_KEY": "k$y$(id)%'"}
    s = settings(hf_token=values["HF_TOKEN"], api_key=values["SGLANG_API_KEY"])
    env_file = tmp_path / "sglang.env"
    env_file.write_text(render_env(s))
    assert render_env(s).startswith("# ")
    assert sh_env(env_file)["HF_TOKEN"] == values["HF_TOKEN"]
    assert sh_env(env_file)["SGLANG_API_KEY"] == values["SGLANG_API_KEY"]
    with pytest.raises(ValueError, match="newline"):
        env_quote("two\nlines")


@pytest.mark.skipif(not os.access(ENV_GENERATOR, os.X_OK), reason="systemd's environment.d generator missing")
def test_env_file_read_by_systemds_parser(tmp_path):
    """systemd's env-file parser (the one EnvironmentFile= uses) reads the quoting as intended.

    The environment.d generator runs that parser and prints the result in the same format; it
    also expands ``$NAME`` afterwards (EnvironmentFile= does not), so the value has no ``$``.
    """
    value = 'hf_"quoted"\\back`tick`'
    conf = tmp_path / "environment.d" / "10-sglang.conf"
    conf.parent.mkdir()
    conf.write_text(render_env(settings(hf_token=value)))
    done = subprocess.run([ENV_GENERATOR], capture_output=True, text=True, check=True,
                          env={"XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("HF_TOKEN=")]
    printed = tmp_path / "printed.env"
    printed.write_text(line + "\n")
    assert sh_env(printed)["HF_TOKEN"] == value


@pytest.mark.parametrize("rollback", [True, False])
def test_the_fallback_is_called_with_the_units_own_rule(tmp_path, rollback):
    """The server unit's ExecStopPost= and its OnFailure= unit call the uploaded fallback with
    this unit, link and record, ``upgrade_rollback`` and the exit status the unit is not
    restarted on: read back as systemd parses the units, then by the fallback's own parser."""
    s = settings(sglang_cache_dir=str(tmp_path / "cache"), upgrade_rollback=rollback,
                 venv_path="/srv/sglang/venv")
    unit, _, _ = write_unit(tmp_path, s, server_argv(s, 1, [], None, 1, None, PYTHON))
    fallback = tmp_path / fallback_unit_name(s)
    fallback.write_text(render_fallback_unit(s))
    (stop_post,) = parsed_commands(unit)["ExecStopPost"]
    (start,) = parsed_commands(fallback)["ExecStart"]
    assert stop_post[:2] == start[:2] == [PYTHON, remote.path(remote.STACK_FALLBACK)]
    assert stop_post[2:] == [*start[2:], "--on-exit"]
    args = stack_fallback.arguments(stop_post[2:])
    assert (args.unit, args.venv_path, args.state) == ("sglang.service", s.venv_path,
                                                       state_path(s.service_name))
    assert args.on_exit and args.keep_failed is (not rollback)
    assert args.no_restart_status == [sglang_launch.EX_CONFIG]
    assert not stack_fallback.arguments(start[2:]).on_exit
