"""The SGLang server's command line, its systemd unit and its environment file.

Everything here is pure: settings and facts in, text out. The deploy decides where the text goes.

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
from pathlib import Path
from typing import Iterable, Mapping

import jinja2

from pve_sglang import remote
from pve_sglang.remote import sglang_launch
from pve_sglang.server import spelling
from pve_sglang.stack import switch_rules
from pve_sglang.remote.sglang_flags import release_flags
from pve_sglang.project import TEMPLATES, project_file
from pve_sglang.config.settings import ContainerSettings, host_port, tensor_parallel_size

UNIT_TEMPLATE = "sglang.service.j2"
FALLBACK_TEMPLATE = "sglang-stack-fallback.service.j2"
ENV_TEMPLATE = "sglang.env.j2"
ENV_DIR = "/etc/sglang"
API_KEY_VAR = "SGLANG_API_KEY"
# Where the deploy uploads remote/sglang_launch.py: the unit's ExecStart runs it.
LAUNCHER = remote.path(remote.LAUNCHER)
# Where the deploy uploads remote/stack_fallback.py: the fallback unit runs it.
FALLBACK = remote.path(remote.STACK_FALLBACK)
# Restart=on-failure waits RESTART_SEC between tries, and gives up after START_LIMIT_BURST
# starts within START_LIMIT_BURST model loads (start_limit_interval_s).
RESTART_SEC = 10
START_LIMIT_BURST = 3


class EnvRef(str):
    """An argument whose value the launcher takes from the environment variable NAME.

    It stands after its flag in the server argv (``--api-key``, ``EnvRef("SGLANG_API_KEY")``);
    ``launch_argv`` turns the pair into a launcher option, so the value is never in a command line.
    """

    def __new__(cls, name: str) -> EnvRef:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"not an environment variable name: {name!r}")
        ref = super().__new__(cls, "${" + name + "}")
        ref.name = name
        return ref


class ServerArgv(list):
    """The server's argv (a plain list of str) with the warnings met while building it."""

    def __init__(self, items: Iterable[str] = (), warnings: Iterable[str] = ()):
        super().__init__(items)
        self.warnings: list[str] = list(warnings)


# --- the command line ---------------------------------------------------------------------


def _major(cap: str) -> int:
    match = re.fullmatch(r"\s*(\d+)(?:\.\d+)?\s*", str(cap))
    if not match:
        raise ValueError(f"compute capability {cap!r} is not of the form MAJOR.MINOR, e.g. '12.0'")
    return int(match.group(1))


def server_argv(
    settings: ContainerSettings,
    gpu_count: int,
    compute_caps: list[str],
    node_rank: int | None,
    nnodes: int,
    dist_init_addr: str | None,
    python: str,
) -> ServerArgv:
    """The ExecStart argv of ``python -m sglang.launch_server`` for one node.

    ``tp_size`` None means one rank per GPU on every node (``gpu_count * nnodes``). Every flag is
    spelled as ``settings.sglang_version`` spells it (``server.spelling``), so none of them makes
    that release log a deprecation warning. Returns a ``ServerArgv``: a list of str whose
    ``warnings`` say what was changed and why (today: allreduce fusion dropped on compute
    capability 12.x).
    """
    if gpu_count < 1:
        raise ValueError(f"gpu_count {gpu_count}: the container sees no GPU")
    if nnodes < 1:
        raise ValueError(f"nnodes {nnodes}: must be >= 1")
    tp = tensor_parallel_size(settings.tp_size, gpu_count, nnodes)
    release = settings.sglang_version
    warnings: list[str] = []

    argv = [python, "-m", "sglang.launch_server"]
    argv += ["--model-path", settings.model_path]
    argv += ["--host", settings.server_host, "--port", str(settings.server_port)]
    argv += ["--tp-size", str(tp)]
    argv += ["--moe-runner-backend", settings.moe_runner_backend]
    argv += ["--attention-backend", spelling.attention_backend(settings.attention_backend, release)]
    argv += ["--mem-fraction-static", repr(float(settings.mem_fraction_static))]
    if settings.max_running_requests is not None:
        argv += ["--max-running-requests", str(settings.max_running_requests)]
    if settings.cuda_graph_max_bs is not None:
        argv += [*spelling.flag("cuda_graph_max_bs", release), str(settings.cuda_graph_max_bs)]
    if settings.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(settings.chunked_prefill_size)]
    if settings.schedule_policy is not None:
        problem = spelling.schedule_policy_problem(settings.schedule_policy, release)
        if problem:
            raise ValueError(f"schedule_policy: {problem}")
        argv += ["--schedule-policy", settings.schedule_policy]
    if settings.enable_metrics:
        # The same spelling in every release from 0.5.9 to 0.5.23 (a plain store_true).
        argv += ["--enable-metrics"]
    if settings.disable_cuda_graph:
        argv += spelling.flag("disable_cuda_graph", release)
    if settings.enable_flashinfer_allreduce_fusion:
        fusion = spelling.flag("flashinfer_allreduce_fusion", release)
        sm12 = sorted({cap for cap in compute_caps if _major(cap) == 12})
        if sm12:
            warnings.append(
                "enable_flashinfer_allreduce_fusion is set but the GPUs have compute capability "
                f"{', '.join(sm12)} (SM12x): {' '.join(fusion)} left out (sglang "
                "0.5.23 refuses it there: 'requires SM90 or SM10X'; it proved problematic on SM120)"
            )
        else:
            if not compute_caps:
                warnings.append(
                    "enable_flashinfer_allreduce_fusion is set and the GPUs' compute capability is "
                    "unknown: kept, but sglang 0.5.23 refuses it on SM12x"
                )
            argv += fusion
    if settings.served_model_name:
        argv += ["--served-model-name", settings.served_model_name]
    if nnodes > 1:
        if node_rank is None or not 0 <= node_rank < nnodes:
            raise ValueError(f"node_rank {node_rank!r} is not in 0..{nnodes - 1} (nnodes {nnodes})")
        if not dist_init_addr:
            raise ValueError(f"nnodes {nnodes} needs dist_init_addr (rank 0's address:port)")
        argv += ["--nnodes", str(nnodes), "--node-rank", str(node_rank)]
        argv += ["--dist-init-addr", dist_init_addr]
    if settings.api_key is not None:
        argv += ["--api-key", EnvRef(API_KEY_VAR)]
    # Secret flags in extra_server_args are refused by the settings (settings.server_argument).
    argv += list(settings.extra_server_args)
    return ServerArgv(argv, warnings)


def node_rank_for(inventory_name: str, nodes: list[str]) -> tuple[int | None, int]:
    """(node rank, node count) of a container; (None, 1) when it serves alone (``nodes`` empty)."""
    if not nodes:
        return None, 1
    # Validation refuses a name listed twice (ContainerSettings._distinct).
    if inventory_name not in nodes:
        raise ValueError(f"nodes {nodes} does not list this container ({inventory_name})")
    return nodes.index(inventory_name), len(nodes)


def dist_init_addr(address: str, port: int) -> str:
    """``host:port`` of rank 0 for ``--dist-init-addr`` (IPv6 addresses in brackets)."""
    return host_port(address, port)


def venv_python(settings: ContainerSettings) -> str:
    """The Python of the container's SGLang virtual environment."""
    return f"{settings.venv_path.rstrip('/')}/bin/python"


# --- flags the installed release accepts --------------------------------------------------
# Read statically from the release's own sources (importing sglang needs torch and CUDA), by
# the stand-alone remote/sglang_flags.py: uploaded to the container, and imported here.


class KnownFlags(set):
    """The ``--flag`` spellings of one sglang release; ``version`` names the release."""

    def __init__(self, flags: Iterable[str] = (), version: str = "unknown"):
        super().__init__(flags)
        self.version = version


def known_flags(package_dir: Path) -> KnownFlags:
    """All ``--flag`` spellings the sglang release in ``package_dir`` accepts.

    ``package_dir``: the installed ``sglang`` package or the site-packages folder holding it.
    Reads ``sglang/srt/server_args.py`` and ``sglang/srt/arg_groups/**/*.py`` (0.5.12+; from
    0.5.23 most flags are fields of ``arg_groups/fields`` namespaces), as the container's
    ``sglang_flags.py`` does.
    """
    version, flags = release_flags(package_dir)
    return KnownFlags(flags, version)


def check_flags(argv: list[str], known: set[str], version: str | None = None) -> None:
    """Raise ValueError naming every ``--flag`` in ``argv`` the release does not define.

    Spellings must match exactly: argparse's prefix matching (``--tp`` for ``--tp-size``) is not
    relied upon. ``version`` defaults to ``known.version`` (set by ``known_flags``).
    """
    version = version or getattr(known, "version", "unknown")
    unknown = []
    for arg in argv:
        if isinstance(arg, str) and arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            if flag not in known and flag not in unknown:
                unknown.append(flag)
    if unknown:
        raise ValueError(
            f"sglang {version} does not know {', '.join(unknown)} "
            f"({len(known)} flags read from its server_args.py and arg_groups)"
        )


def parse_flags_output(text: str) -> KnownFlags:
    """The ``KnownFlags`` printed by ``remote/sglang_flags.py``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    version = "unknown"
    if lines and lines[0].startswith("version "):
        version = lines.pop(0).split(" ", 1)[1]
    return KnownFlags((line for line in lines if line.startswith("--")), version)


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


def env_file_path(settings: ContainerSettings) -> str:
    """Where the deploy writes the unit's EnvironmentFile (mode 0600)."""
    return f"{ENV_DIR}/{settings.service_name}.env"


def unit_name(settings: ContainerSettings) -> str:
    return f"{settings.service_name}.service"


def unit_path(settings: ContainerSettings) -> str:
    """Where the deploy writes the server's systemd unit."""
    return f"/etc/systemd/system/{unit_name(settings)}"


def cache_environment(settings: ContainerSettings) -> dict[str, str]:
    """Persistent caches: SGLang's (FlashInfer autotune results among them) and the JIT caches.

    0.5.23 points the third-party caches under SGLANG_CACHE_DIR itself (setdefault); 0.5.9 does
    not, so they are set explicitly to the same layout. FlashInfer appends ``.cache/flashinfer``
    to FLASHINFER_WORKSPACE_BASE.
    """
    base = settings.sglang_cache_dir.rstrip("/") or "/"
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
    from_env, args = [], []
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
    settings: ContainerSettings,
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
    for secret in settings.secrets.values():
        if any(str(arg) == secret or str(arg).endswith("=" + secret) for arg in argv):
            raise ValueError("the server argv holds a secret value; it must come from the EnvironmentFile")
    env_file = env_file or env_file_path(settings)
    environment = {**cache_environment(settings), **(extra_environment or {})}
    return _templates().get_template(UNIT_TEMPLATE).render(
        description=_spec_escape(description or f"SGLang server ({settings.model_path})").replace("\n", " "),
        env_file=_plain_path("env_file", env_file),
        env_vars=sorted(settings.secrets),
        environment=[_environment_assignment(k, v) for k, v in environment.items()],
        working_directory=_plain_path("sglang_cache_dir", settings.sglang_cache_dir),
        exec_start=systemd_command(launch_argv(argv, settings.secrets, launcher)),
        launcher_config_error=sglang_launch.EX_CONFIG,
        timeout_start_s=settings.health_timeout_s,
        restart_sec=RESTART_SEC,
        start_limit_burst=START_LIMIT_BURST,
        start_limit_interval_s=start_limit_interval_s(settings),
        on_failure=fallback_unit_name(settings),
    )


def fallback_unit_name(settings: ContainerSettings) -> str:
    """The server unit's ``OnFailure=``: it switches a stack on trial back (``remote/
    stack_fallback.py``)."""
    return f"{settings.service_name}-stack-fallback.service"


def fallback_unit_path(settings: ContainerSettings) -> str:
    return f"/etc/systemd/system/{fallback_unit_name(settings)}"


def render_fallback_unit(settings: ContainerSettings, script: str = FALLBACK) -> str:
    """The oneshot unit the server's unit names in ``OnFailure=``: the container's Python runs
    SCRIPT (``remote/stack_fallback.py``) on the server's unit, link and stack record."""
    argv = ["/usr/bin/python3", script, "--unit", unit_name(settings), "--venv-path",
            settings.venv_path, "--state", switch_rules.state_path(settings.service_name)]
    return _templates().get_template(FALLBACK_TEMPLATE).render(
        server_unit=unit_name(settings), exec_start=systemd_command(argv))


def start_limit_interval_s(settings: ContainerSettings) -> int:
    """StartLimitIntervalSec: START_LIMIT_BURST tries that each load the model for up to
    ``health_timeout_s`` fit in it, so a crash after a long load still counts toward the limit."""
    return START_LIMIT_BURST * (settings.health_timeout_s + RESTART_SEC)


def render_env(settings: ContainerSettings) -> str:
    """The EnvironmentFile (deploy it with mode 0600): HF_TOKEN and SGLANG_API_KEY when set."""
    return _templates().get_template(ENV_TEMPLATE).render(
        unit=unit_name(settings),
        variables=[(key, env_quote(value)) for key, value in sorted(settings.secrets.items())],
    )
