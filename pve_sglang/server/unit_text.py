"""The SGLang server's systemd unit, its fallback unit and its environment file, as text.

Everything here is pure: settings and the server's argv (``server.command``) in, text out. The
deploy decides where the text goes.

How the API key reaches the server
    SGLang reads ``api_key`` only from ``--api-key`` (or a ``--config`` YAML file); no release up to
    0.5.23 reads it from the environment, and both 0.5.9 and 0.5.23 log their whole ServerArgs,
    key included, at start (``logger.info(f"{server_args=}")`` in 0.5.9's
    ``sglang/srt/entrypoints/engine.py``; ``server_args=...resolved_dict()`` in 0.5.23). So the key
    is stored in the 0600 EnvironmentFile as ``SGLANG_API_KEY`` and the unit starts the server
    through ``remote/sglang_launch.py`` (uploaded to ``LAUNCHER``), with
    ``--arg-from-env=--api-key=SGLANG_API_KEY`` and ``--mask-env=HF_TOKEN``. The launcher reads the
    key from its environment, refuses to start when it is empty (exit 78, which
    ``RestartPreventExitStatus`` keeps from looping), runs ``sglang.launch_server`` in a forked
    child with ``--api-key KEY`` added to ``sys.argv`` only, and copies every process's output to
    the journal with each secret value masked (``<hidden SGLANG_API_KEY>``). The key is therefore
    in no unit file, no ``/proc/PID/cmdline`` (``ps``), no journal line and no deploy output.
    Still readable by the container's root: the EnvironmentFile, ``/proc/PID/environ`` of the
    launcher, the server's memory, and sglang's own crash dumps (``--crash-dump-folder``).
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, Mapping

import jinja2

from pve_sglang import remote
from pve_sglang.remote import sglang_launch
from pve_sglang.server.command import EnvRef
from pve_sglang.stack import switch_rules
from pve_sglang.project import TEMPLATES, project_file
from pve_sglang.config.settings import ServerView

UNIT_TEMPLATE = "sglang.service.j2"
FALLBACK_TEMPLATE = "sglang-stack-fallback.service.j2"
ENV_TEMPLATE = "sglang.env.j2"
ENV_DIR = "/etc/sglang"
# Where the deploy uploads remote/sglang_launch.py: the unit's ExecStart runs it.
LAUNCHER = remote.path(remote.LAUNCHER)
# Where the deploy uploads remote/stack_fallback.py: the fallback unit runs it.
FALLBACK = remote.path(remote.STACK_FALLBACK)
# Restart=on-failure waits RESTART_SEC between tries, and gives up after START_LIMIT_BURST
# starts within START_LIMIT_BURST model loads (start_limit_interval_s).
RESTART_SEC = 10
START_LIMIT_BURST = 3


# --- systemd syntax -----------------------------------------------------------------------

_NEEDS_QUOTES = re.compile(r"[\s\"'\\$%;]")


def _spec_escape(value: str) -> str:
    """Escape systemd specifiers (``%``) in a setting that expands them."""
    return value.replace("%", "%%")


def systemd_quote(arg: str) -> str:
    """One ExecStart argument in systemd's syntax.

    ``%`` becomes ``%%`` (specifiers) and ``$`` becomes ``$$`` (variable expansion): systemd expands
    nothing in it. Arguments with whitespace, quotes, backslashes, ``$``, ``%`` or ``;`` (or empty
    ones) are double-quoted with C-style escapes.
    """
    if isinstance(arg, EnvRef):
        raise ValueError(f"{arg.name}: an environment reference goes through launch_argv")
    arg = str(arg)
    if arg and not _NEEDS_QUOTES.search(arg):
        return arg
    escaped = (
        arg.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\r", "\\r")
        .replace("%", "%%")
        .replace("$", "$$")
    )
    return f'"{escaped}"'


def systemd_command(argv: list[str]) -> str:
    """An ExecStart value: the quoted argv, one ``--flag value`` group per continued line."""
    if not argv or not str(argv[0]).startswith("/"):
        raise ValueError(f"ExecStart needs an absolute executable path, got {argv[:1]}")
    lines = [[systemd_quote(argv[0])]]
    for index, arg in enumerate(argv[1:], 1):
        # A launcher's ``-m MODULE`` after its own options starts a line too.
        if isinstance(arg, str) and (arg.startswith("--") or (arg == "-m" and index > 1)):
            lines.append([])
        lines[-1].append(systemd_quote(arg))
    return " \\\n    ".join(" ".join(words) for words in lines)


def _environment_assignment(key: str, value: str) -> str:
    """One ``Environment=`` word: specifiers expand there, variables do not."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise ValueError(f"not an environment variable name: {key!r}")
    word = f"{key}={value}"
    if "\n" in word:
        raise ValueError(f"Environment {key}: value has a newline")
    if not re.search(r"[\s\"'\\%]", word):
        return word
    return '"' + _spec_escape(word.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def _plain_path(what: str, value: str) -> str:
    if not value.startswith("/") or re.search(r"\s", value):
        raise ValueError(f"{what} {value!r}: needs an absolute path without whitespace")
    return _spec_escape(value)


def env_quote(value: str) -> str:
    """A value for a systemd EnvironmentFile that POSIX sh reads the same way.

    Always double-quoted; backslash escapes ``\\``, ``"``, `` ` `` and ``$`` (the set both systemd
    and sh honour inside double quotes). Newlines are refused (one variable a line).
    """
    if "\n" in value or "\r" in value:
        raise ValueError("an EnvironmentFile value cannot hold a newline")
    return '"' + re.sub(r'([\\"`$])', r"\\\1", value) + '"'


# --- rendering ----------------------------------------------------------------------------

@functools.cache
def _templates() -> jinja2.Environment:
    """The checkout's ``templates/`` (``project.project_file``), loaded on first use."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(project_file(TEMPLATES))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def env_file_of(service: str, folder: str = ENV_DIR) -> str:
    """Where the deploy writes the EnvironmentFile (mode 0600) of service SERVICE, in FOLDER."""
    return f"{folder}/{service}.env"


def env_file_path(server: ServerView) -> str:
    """Where the deploy writes the server unit's EnvironmentFile (mode 0600)."""
    return env_file_of(server.service_name)


def unit_name(server: ServerView) -> str:
    return f"{server.service_name}.service"


def unit_file(unit: str) -> str:
    """Where the deploy writes systemd unit UNIT (``sglang.service``)."""
    return f"/etc/systemd/system/{unit}"


def unit_path(server: ServerView) -> str:
    """Where the deploy writes the server's systemd unit."""
    return unit_file(unit_name(server))


def restart_since(server: ServerView) -> dict[str, str]:
    """What the server reads when it starts, ``{what: path}``: one changed after the running
    server started is a restart pending (a run killed before its restart; ``make status`` says
    so too). The link's own mtime moves at a switch; the serving stack's when an install in it
    ends (its marker goes) and before a patch."""
    return {"the unit file": unit_path(server), "the environment file": env_file_path(server),
            "the launcher": LAUNCHER, "the sglang stack link": server.venv_path,
            "the sglang venv": f"{server.venv_path}/"}


def cache_environment(server: ServerView) -> dict[str, str]:
    """Persistent caches: SGLang's (FlashInfer autotune results among them) and the JIT caches.

    0.5.23 points the third-party caches under SGLANG_CACHE_DIR itself (setdefault); 0.5.9 does
    not, so they are set explicitly to the same layout. FlashInfer appends ``.cache/flashinfer``
    to FLASHINFER_WORKSPACE_BASE.
    """
    base = server.sglang_cache_dir.rstrip("/") or "/"
    return {
        "SGLANG_CACHE_DIR": base,
        "FLASHINFER_WORKSPACE_BASE": base,
        "TRITON_CACHE_DIR": f"{base}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{base}/inductor",
        "CUDA_CACHE_PATH": f"{base}/nv",
        "PYTHONUNBUFFERED": "1",
    }


def launch_argv(argv: list[str], mask_vars: Iterable[str] = (), launcher: str = LAUNCHER) -> list[str]:
    """The ExecStart argv: ARGV (``PYTHON -m MODULE ...``) started through the launcher.

    Each ``FLAG EnvRef(VAR)`` pair of ARGV becomes ``--arg-from-env=FLAG=VAR`` and every VAR, with
    MASK_VARS, is masked in the output. Raises ValueError for an ARGV not of that form.
    """
    if len(argv) < 3 or argv[1] != "-m" or isinstance(argv[2], EnvRef):
        raise ValueError(f"the server argv must be PYTHON -m MODULE ..., got {list(argv[:3])}")
    python, module, rest = argv[0], argv[2], list(argv[3:])
    from_env: list[str] = []
    args: list[str] = []
    for index, arg in enumerate(rest):
        if isinstance(arg, EnvRef):
            if not args or not args[-1].startswith("-") or isinstance(rest[index - 1], EnvRef):
                raise ValueError(f"{arg.name}: an environment reference must follow its flag")
            from_env.append(f"{sglang_launch.ARG_FROM_ENV}{args.pop()}={arg.name}")
        else:
            args.append(arg)
    named = {option.rpartition("=")[2] for option in from_env}
    masks = [f"{sglang_launch.MASK_ENV}{name}" for name in sorted(set(mask_vars) - named)]
    return [python, launcher, *from_env, *masks, "-m", module, *args]


def render_unit(
    server: ServerView,
    argv: list[str],
    env_file: str | None = None,
    description: str | None = None,
    extra_environment: Mapping[str, str] | None = None,
    launcher: str = LAUNCHER,
) -> str:
    """The systemd unit for the server, started through the launcher (``launch_argv``).

    Secrets stay in ``env_file`` (default ``/etc/sglang/<service_name>.env``); the unit only names
    their variables, and systemd expands none of them into a command line.
    """
    for secret in server.secrets.values():
        if any(str(arg) == secret or str(arg).endswith("=" + secret) for arg in argv):
            raise ValueError("the server argv holds a secret value; it must come from the EnvironmentFile")
    env_file = env_file or env_file_path(server)
    environment = {**cache_environment(server), **(extra_environment or {})}
    return _templates().get_template(UNIT_TEMPLATE).render(
        description=_spec_escape(description or f"SGLang server ({server.model_path})").replace("\n", " "),
        env_file=_plain_path("env_file", env_file),
        env_vars=sorted(server.secrets),
        environment=[_environment_assignment(k, v) for k, v in environment.items()],
        working_directory=_plain_path("sglang_cache_dir", server.sglang_cache_dir),
        exec_start=systemd_command(launch_argv(argv, server.secrets, launcher)),
        launcher_config_error=sglang_launch.EX_CONFIG,
        timeout_start_s=server.health_timeout_s,
        restart_sec=RESTART_SEC,
        start_limit_burst=START_LIMIT_BURST,
        start_limit_interval_s=start_limit_interval_s(server),
        on_failure=fallback_unit_name(server),
        exec_stop_post=systemd_command([*fallback_argv(server), "--on-exit"]),
    )


def fallback_unit_name(server: ServerView) -> str:
    """The server unit's ``OnFailure=``: it switches a stack on trial back (``remote/
    stack_fallback.py``)."""
    return f"{server.service_name}-stack-fallback.service"


def fallback_unit_path(server: ServerView) -> str:
    return unit_file(fallback_unit_name(server))


def fallback_argv(server: ServerView, script: str = FALLBACK) -> list[str]:
    """The container's Python running SCRIPT (``remote/stack_fallback.py``) on the server's
    unit, link and stack record, with ``upgrade_rollback`` and the exit status the unit is not
    restarted on (the launcher's missing secret): the unit's ``ExecStopPost=`` (with
    ``--on-exit``) and its ``OnFailure=`` unit."""
    return ["/usr/bin/python3", script, "--unit", unit_name(server), "--venv-path",
            server.venv_path, "--state", switch_rules.state_path(server.service_name),
            *([] if server.upgrade_rollback else ["--keep-failed"]),
            "--no-restart-status", str(sglang_launch.EX_CONFIG)]


def render_fallback_unit(server: ServerView, script: str = FALLBACK) -> str:
    """The oneshot unit the server's unit names in ``OnFailure=`` (``fallback_argv``)."""
    return _templates().get_template(FALLBACK_TEMPLATE).render(
        server_unit=unit_name(server), unit_name=fallback_unit_name(server),
        exec_start=systemd_command(fallback_argv(server, script)))


def start_limit_interval_s(server: ServerView) -> int:
    """StartLimitIntervalSec: START_LIMIT_BURST tries that each load the model for up to
    ``health_timeout_s`` fit in it, so a crash after a long load still counts toward the limit."""
    return START_LIMIT_BURST * (server.health_timeout_s + RESTART_SEC)


def render_env(server: ServerView) -> str:
    """The EnvironmentFile (deploy it with mode 0600): HF_TOKEN and SGLANG_API_KEY when set."""
    return _templates().get_template(ENV_TEMPLATE).render(
        unit=unit_name(server),
        variables=[(key, env_quote(value)) for key, value in sorted(server.secrets.items())],
    )
