"""The SGLang server's command line (``server_argv``) and the flags a release accepts.

Everything here is pure: settings and facts in, an argv out. Its unit and env file are
``server.unit_text``; the API key stands in the argv as an ``EnvRef``, never as its value (how
it reaches the server: ``server.unit_text``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from pve_sglang.server import spelling
from pve_sglang.remote.sglang_flags import release_flags
from pve_sglang.config.settings import ServerView, tensor_parallel_size

API_KEY_VAR = "SGLANG_API_KEY"


class EnvRef(str):
    """An argument whose value the launcher takes from the environment variable NAME.

    It stands after its flag in the server argv (``--api-key``, ``EnvRef("SGLANG_API_KEY")``);
    ``launch_argv`` turns the pair into a launcher option, so the value is never in a command line.
    """

    name: str

    def __new__(cls, name: str) -> EnvRef:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"not an environment variable name: {name!r}")
        ref = super().__new__(cls, "${" + name + "}")
        ref.name = name
        return ref


class ServerArgv(list):
    """The server's argv (a plain list of str) with the warnings met while building it."""

    def __init__(self, items: Iterable[str] = (), warnings: Iterable[str] = ()):
        self.extend(items)
        self.warnings: list[str] = list(warnings)


# --- the command line ---------------------------------------------------------------------


def _major(cap: str) -> int:
    match = re.fullmatch(r"\s*(\d+)(?:\.\d+)?\s*", str(cap))
    if not match:
        raise ValueError(f"compute capability {cap!r} is not of the form MAJOR.MINOR, e.g. '12.0'")
    return int(match.group(1))


def server_argv(
    server: ServerView,
    gpu_count: int,
    compute_caps: list[str],
    node_rank: int | None,
    nnodes: int,
    dist_init_addr: str | None,
    python: str,
) -> ServerArgv:
    """The ExecStart argv of ``python -m sglang.launch_server`` for one node.

    ``tp_size`` None means one rank per GPU on every node (``gpu_count * nnodes``). Every flag is
    spelled as ``sglang_version`` spells it (``server.spelling``), so none of them makes
    that release log a deprecation warning. Returns a ``ServerArgv``: a list of str whose
    ``warnings`` say what was changed and why (today: allreduce fusion dropped on compute
    capability 12.x).
    """
    if gpu_count < 1:
        raise ValueError(f"gpu_count {gpu_count}: the container sees no GPU")
    if nnodes < 1:
        raise ValueError(f"nnodes {nnodes}: must be >= 1")
    # SM12x GPUs refuse the allreduce fusion (below); a malformed capability is refused with
    # the other inputs, before any flag.
    sm12 = (sorted({cap for cap in compute_caps if _major(cap) == 12})
            if server.enable_flashinfer_allreduce_fusion else [])
    argv = ServerArgv([python, "-m", "sglang.launch_server"])
    tp = tensor_parallel_size(server.tp_size, gpu_count, nnodes)
    release = server.sglang_version

    argv += ["--model-path", server.model_path]
    argv += ["--host", server.server_host, "--port", str(server.server_port)]
    argv += ["--tp-size", str(tp)]
    argv += ["--moe-runner-backend", server.moe_runner_backend]
    argv += ["--attention-backend", spelling.attention_backend(server.attention_backend, release)]
    argv += ["--mem-fraction-static", repr(float(server.mem_fraction_static))]
    if server.max_running_requests is not None:
        argv += ["--max-running-requests", str(server.max_running_requests)]
    if server.cuda_graph_max_bs is not None:
        argv += [*spelling.flag("cuda_graph_max_bs", release), str(server.cuda_graph_max_bs)]
    if server.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(server.chunked_prefill_size)]
    if server.schedule_policy is not None:
        problem = spelling.schedule_policy_problem(server.schedule_policy, release)
        if problem:
            raise ValueError(f"schedule_policy: {problem}")
        argv += ["--schedule-policy", server.schedule_policy]
    if server.enable_metrics:
        # The same spelling in every release from 0.5.9 to 0.5.23 (a plain store_true).
        argv += ["--enable-metrics"]
    if server.disable_cuda_graph:
        argv += spelling.flag("disable_cuda_graph", release)
    if server.enable_flashinfer_allreduce_fusion:
        fusion = spelling.flag("flashinfer_allreduce_fusion", release)
        if sm12:
            argv.warnings.append(
                "enable_flashinfer_allreduce_fusion is set but the GPUs have compute capability "
                f"{', '.join(sm12)} (SM12x): {' '.join(fusion)} left out (sglang "
                "0.5.23 refuses it there: 'requires SM90 or SM10X'; it proved problematic on SM120)"
            )
        else:
            if not compute_caps:
                argv.warnings.append(
                    "enable_flashinfer_allreduce_fusion is set and the GPUs' compute capability is "
                    "unknown: kept, but sglang 0.5.23 refuses it on SM12x"
                )
            argv += fusion
    if server.served_model_name:
        argv += ["--served-model-name", server.served_model_name]
    if nnodes > 1:
        if node_rank is None or not 0 <= node_rank < nnodes:
            raise ValueError(f"node_rank {node_rank!r} is not in 0..{nnodes - 1} (nnodes {nnodes})")
        if not dist_init_addr:
            raise ValueError(f"nnodes {nnodes} needs dist_init_addr (rank 0's address:port)")
        argv += ["--nnodes", str(nnodes), "--node-rank", str(node_rank)]
        argv += ["--dist-init-addr", dist_init_addr]
    if server.api_key is not None:
        argv += ["--api-key", EnvRef(API_KEY_VAR)]
    # Secret flags in extra_server_args are refused by the settings (settings.server_argument).
    argv += list(server.extra_server_args)
    return argv


def venv_python(server: ServerView) -> str:
    """The Python of the container's SGLang virtual environment."""
    return f"{server.venv_path.rstrip('/')}/bin/python"


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
