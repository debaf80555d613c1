"""Code that runs inside a GPU container: one stand-alone script per file, and where each goes.

Each script here imports nothing from ``pve_sglang`` (but its companions: the modules uploaded
beside it, ``COMPANIONS``) and, but for ``gpu_checks.py`` (which imports the venv's torch when
it runs), ``server_metrics.py`` (the venv's prometheus_client) and ``model_fetch.py``
(huggingface_hub), only the standard library: the deploy uploads
the file as it is (``tasks.common.upload_script``) to ``path(NAME)`` and runs it with the
container's Python. ``model_fetch.py`` lives with the rest of the model store
(``pve_sglang/model_store/``, ``ELSEWHERE``); ``source`` finds it there. This ``__init__`` is the local side only, and stays stdlib too, so that
``python -m pve_sglang.remote.autotune_patch`` needs nothing installed.

============================  ===============================================================
``autotune_patch.py``         the FlashInfer CUTLASS MoE autotune patch: ``--check|--apply
                              SGLANG_PACKAGE_DIR``; also ``python -m
                              pve_sglang.remote.autotune_patch``
``sglang_flags.py``           prints the installed release's server flags, read statically
                              (``server.command.known_flags`` uses the same code locally)
``venv_state.py``             the venv's packages, an interrupted install, the patch's state,
                              in one Python start (the ``SglangVenv`` fact; sent as ``python
                              -c``, since a fact may be read before anything is uploaded)
``sglang_launch.py``          the server unit's ExecStart: SGLang with its key from the
                              environment, every secret masked in its output
``gpu_checks.py``             CUDA init and P2P checks of the verify phase (and deploy_p2p.py)
``startup_watch.py``          follows the server unit's journal, state and /health during its
                              start; one chat completion (the verify phase)
``gpu_sampler.py``            runs the benchmark while nvidia-smi samples each GPU's power,
                              utilisation and memory; prints their averages, the mean power
                              from NVML's energy counter where pynvml can read it
``server_metrics.py``         runs the benchmark while the server's /metrics (no key) is read:
                              running and queued requests, token usage, cache hit rate
                              (``prometheus_client``'s parser, from the sglang venv)
``bench_record.py``           runs the benchmark with its record (the server's API key inside)
                              in a private file, removed after; prints the record's numbers
``model_fetch.py``            in ``model_store/``: the model, its revision pinned to a commit,
                              its files checked against the hub's sizes and hashes, the rest
                              downloaded (resumed), with progress lines (``huggingface_hub``)
``stack_fallback.py``         the server unit's ``ExecStopPost=`` and ``OnFailure=``: a stack
                              on probation that crashed, or on trial and failed for good, is
                              switched back to the previous one and started; a crash loop
                              after probation is started again, a growing pause between
``rollback_rules.py``         the rollback rule, written once: the deploy imports it, and it
                              is uploaded beside ``stack_fallback.py``, which imports it
``gateway_workers.py``        the gateway's worker list through smg's worker API (register,
                              remove what it registered), and each worker's health as the
                              gateway reports it
``gpu_textfile.py``          on a GPU host: each GPU's power, limit, utilisation and memory
                              every few seconds, for the node exporter's textfile collector
                              (the GPU sampler's query; the monitoring)
``status_read.py``            one container's status for ``make status`` (unit, stacks, model
                              marker, /health, /metrics), read-only, sent as ``python -c``
                              with ``server_metrics.py`` (``piped``)
``remote_env.py``             a value of the deploy's env file (a secret read by the script,
                              never on a command line): uploaded beside ``model_fetch.py``
                              and ``startup_watch.py``, which import it
``confine.py``                this process's writes kept to some folders (Landlock, else a
                              read-only mount namespace): beside ``model_fetch.py``
``file_hash.py``              a file's sha256 or git blob id, written once: the deploy and
                              the GPU kit import it; uploaded beside ``model_fetch.py``
============================  ===============================================================
"""

from __future__ import annotations

import json
from pathlib import Path

#: The container's folder for the deploy's own files: these scripts and the tools venv (uv).
TOOLS = "/opt/sglang"

AUTOTUNE_PATCH = "autotune_patch.py"
FLAG_LISTER = "sglang_flags.py"
VENV_STATE = "venv_state.py"
LAUNCHER = "sglang_launch.py"
GPU_CHECKS = "gpu_checks.py"
STARTUP_WATCH = "startup_watch.py"
GPU_SAMPLER = "gpu_sampler.py"
BENCH_RECORD = "bench_record.py"
SERVER_METRICS = "server_metrics.py"
MODEL_FETCH = "model_fetch.py"
REMOTE_ENV = "remote_env.py"
CONFINE = "confine.py"
FILE_HASH = "file_hash.py"
STACK_FALLBACK = "stack_fallback.py"
ROLLBACK_RULES = "rollback_rules.py"
GATEWAY_WORKERS = "gateway_workers.py"
STATUS_READ = "status_read.py"
GPU_TEXTFILE = "gpu_textfile.py"

#: The modules a script imports from beside it: uploaded with it, to the same folder.
COMPANIONS: dict[str, tuple[str, ...]] = {MODEL_FETCH: (REMOTE_ENV, CONFINE, FILE_HASH),
                                          STARTUP_WATCH: (REMOTE_ENV,),
                                          GATEWAY_WORKERS: (REMOTE_ENV,),
                                          STATUS_READ: (SERVER_METRICS,),
                                          GPU_SAMPLER: (SERVER_METRICS,),
                                          STACK_FALLBACK: (ROLLBACK_RULES,),
                                          GPU_TEXTFILE: (GPU_SAMPLER,)}


def companions(script: str) -> tuple[str, ...]:
    """What goes beside SCRIPT where it runs: its companions and theirs (``gpu_textfile.py``
    imports ``gpu_sampler.py``, which imports ``server_metrics.py``), each once, a module before
    those that import it."""
    out: list[str] = []
    for name in COMPANIONS.get(script, ()):
        out += [n for n in (*companions(name), name) if n not in out]
    return tuple(out)

_HERE = Path(__file__).resolve().parent
#: The scripts kept in another folder of the package, with the code of their topic: the same
#: rules hold for them (tests/unit/test_layout.py).
ELSEWHERE: dict[str, Path] = {MODEL_FETCH: _HERE.parent / "model_store"}


def source(script: str) -> Path:
    """The local file of SCRIPT (one of the names above)."""
    folder = ELSEWHERE.get(script, _HERE)
    path = folder / script
    if path.parent != folder or not path.is_file():
        raise ValueError(f"no remote script {script!r} in {folder}")
    return path


def stage(script: str, folder: Path) -> Path:
    """SCRIPT and its companions copied into FOLDER, as the deploy leaves them where they run
    (the tests and the bench run a script from there: its companions are not beside it in the
    package); returns the script's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (script, *companions(script)):
        (folder / name).write_bytes(source(name).read_bytes())
    return folder / script


def piped(script: str) -> str:
    """SCRIPT with its companions as one program for ``python -c``, for a read that uploads
    nothing (``make status``): each companion becomes the module its name says, then SCRIPT
    runs as ``__main__``; each keeps its own file name in a traceback."""
    lines = ["import sys, types"]
    for name in companions(script):
        module = name.removesuffix(".py")
        lines += [f"_m = types.ModuleType({module!r})", f"sys.modules[{module!r}] = _m",
                  f"exec(compile({source(name).read_text()!r}, {name!r}, 'exec'), _m.__dict__)"]
    lines.append(f"exec(compile({source(script).read_text()!r}, {script!r}, 'exec'), "
                 "{'__name__': '__main__'})")
    return "\n".join(lines)


def path(script: str, tools: str = TOOLS) -> str:
    """Where the deploy puts SCRIPT in the container (under TOOLS)."""
    return f"{tools.rstrip('/')}/{script}"


def json_objects(output: list[str]) -> list[dict]:
    """The JSON objects among the output lines of a script that prints them one a line (the
    startup watch, the model fetcher), in order; any other line (a warning a library printed,
    a partial line) is passed over. The facts that run those scripts read them with this."""
    objects = []
    for line in output:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects


def marked_json(prefix: str, text: str) -> dict | None:
    """The last line of TEXT that starts with PREFIX (a script's summary line: the GPU
    sampler's ``GPU_SAMPLES_JSON``, the metrics sampler's ``SERVER_METRICS_JSON``, the
    benchmark record's ``BENCH_RECORD_JSON``), its JSON decoded; None when there is none."""
    for line in reversed(text.splitlines()):
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    return None

