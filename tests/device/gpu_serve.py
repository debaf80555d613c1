"""SGLang on the device machine's GPU, started, watched, checked, benchmarked and tuned the way
the deploy does it, with what it printed kept.

    python3 tests/device/gpu_serve.py serve --kit KIT --out OUT [--train-s S] [--deadline S]
    python3 tests/device/gpu_serve.py tries --kit KIT --out OUT [--train-s S] [--deadline S]
    python3 tests/device/gpu_serve.py tries --oom ...   # only the start out of memory on purpose
    python3 tests/device/gpu_serve.py both ...    # serve, then tries with the time left
    python3 tests/device/gpu_serve.py stage --kit KIT

Not part of the CPU test suite: run on the device machine (one Hopper GPU, the image's
Python 3.12 with torch 2.11.0+cu130, no network), from the kit ``tests/device/gpu_kit.py``
builds (``make gpu-kit``): ``KIT/manifest.json``, ``KIT/parts/*.tar.xz`` (the trimmed wheel
set), ``KIT/model/`` (config and tokenizer), ``KIT/code/`` (this checkout).

``stage`` keeps the parts that came with this call under ``/tmp/kit`` (outside the checkout:
the machine keeps it while it stays warm), so that a set larger than one call's carry arrives
over consecutive calls; ``serve`` and ``tries`` stage too, and go on only once every part is
there. The set is installed offline with pip into the deploy's venv path (``venv_path``,
``/opt/sglang/venv``), a venv of the image's Python that sees the image's packages (torch)
after its own, once per machine.

``serve``: the model's weights trained on the GPU (``gpu_model.py``); the server's flags as
``server/command.py`` renders them for sglang 0.5.17 on this GPU, with the deploy's defaults
(CUDA graphs on), started by ``remote/sglang_launch.py`` with the env file, as the unit's
ExecStart says, byte for byte (no systemd here: its EnvironmentFile is read by ``sh``'s
``set -a; .``, as the env file's header says both read it); its log followed line by line
through ``server/startup_log.py`` (the phases, the hints, the stall: what the verify phase makes
of the startup watch's lines) until /health answers; the generation check
(``remote/startup_watch.py generate``, judged by the verify phase's rules); ``/metrics`` read by
``remote/server_metrics.py``'s parser; the verify phase's benchmark at each level (the release's
own ``sglang.benchmark.serving`` under ``remote/bench_record.py``, ``remote/server_metrics.py``
and ``remote/gpu_sampler.py``, as ``server/bench.py`` renders it); the release's flags read by
``remote/sglang_flags.py`` against the argv; ``remote/autotune_patch.py --check`` on the
installed release.

``tries``: a short search of the tuning ``Drive`` (``tuning/drive.py``), each try a real restart
of the process, one value made to run out of memory on purpose.

Everything kept goes under OUT (at most 8 files come back): ``facts.json``, ``summary.json``,
``startup.jsonl`` (the server's lines as the watch emits them: ``{"t": us, "m": text}``),
``metrics.txt``, ``bench.txt``, ``tries.jsonl`` (the drive's record), ``tries_log.txt`` (each
try's server lines and benchmark output), ``tries_summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The checkout whose package runs: the kit's code (``gpu_kit.CODE``) first, then the
#: checkout the call sent (PVE_SGLANG_CHECKOUT, the working directory there).
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), os.environ.get("PVE_SGLANG_CHECKOUT", os.getcwd())]

from pve_sglang import remote  # noqa: E402
from pve_sglang.remote import gpu_sampler, server_metrics, bench_record  # noqa: E402
from pve_sglang.remote.file_hash import file_digest  # noqa: E402
from pve_sglang.server import startup_log  # noqa: E402

#: Where the parts are kept on the machine while it stays warm, and where they are unpacked.
KEPT = Path("/tmp/kit")
RELEASE = "0.5.17"
#: The deploy's settings for this run, over group_data's defaults: the release, CUDA graphs on
#: (the tuned preset's way; the default turns them off until tuned), an API key (so that the
#: launcher's secret path and its mask run), three benchmark levels a small model fills.
SETTINGS = {
    "sglang_version": RELEASE,
    "disable_cuda_graph": False,
    "bench_concurrencies": [1, 16, 64],
    "bench_input_len": 256,
    "bench_output_len": 128,
    "bench_num_prompts": 32,
    "bench_prompts_per_concurrency": 4,
}
GPU_CAPS = ["9.0"]
#: The tries' space: the four coordinates the issue names, few values each; 0.999 of the GPU's
#: memory for weights and KV cache leaves too little for the rest: the try that runs out of
#: memory on purpose.
TRY_SPACE = {
    "max_running_requests": (None, 8),
    "mem_fraction_static": (0.92, 0.999),
    "disable_cuda_graph": (False, True),
    "cuda_graph_max_bs": (None, 16),
}
TRY_LEVEL = 16
#: What a whole benchmark at TRY_LEVEL is expected to take here (seconds).
TRY_BENCH_S = 30.0
#: Seconds of silence (no log line, /health not 200) that the watch calls a stall here (the
#: deploy's startup_stall_s is 900: a large model's shards take minutes; this one's none).
STALL_S = 150
#: Where the deploy's scripts and the env file go, and the server module: the product's own,
#: but for ``--rehearse`` (this machine, a stand-in server: the plumbing only).
CONF = {"tools": remote.TOOLS, "env_dir": "/etc/sglang", "module": None, "settings": {}}


def tool(script: str) -> str:
    """Where SCRIPT is put (``remote.path``)."""
    return remote.path(script, CONF["tools"])


def env_file(settings) -> str:
    from pve_sglang.server.unit_text import env_file_of

    return env_file_of(settings.service_name, CONF["env_dir"])


def log(message: str) -> None:
    print(f"[gpu_serve {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Clock:
    """The call's deadline: every step asks what is left."""

    deadline: float

    def left(self) -> float:
        return self.deadline - time.monotonic()


def run(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """ARGV's output (stdout and stderr together, text); a timeout is an exit status of 124."""
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=max(1.0, timeout), **kwargs)
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        out = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
        return subprocess.CompletedProcess(argv, 124, out + f"\n[timed out after {timeout:.0f}s]")
    except OSError as error:
        return subprocess.CompletedProcess(argv, 127, f"{argv[0]}: {error}")


class Summary(dict):
    """summary.json, written again after each step so that a cut call still returns it."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def put(self, key: str, value) -> None:
        self[key] = value
        self.path.write_text(json.dumps(self, indent=1, default=str) + "\n")


# --- the machine -------------------------------------------------------------------------


def facts() -> dict:
    """The GPU, driver, Python, torch and init system this ran on."""
    query = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap,"
                 "power.limit,clocks.max.sm", "--format=csv,noheader"], 20).stdout.strip()
    torch = run([sys.executable, "-c", "import torch; print(torch.__version__, "
                 "torch.version.cuda)"], 60).stdout.strip().splitlines()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": query,
        "python": sys.version.split()[0],
        "python_path": sys.executable,
        "torch": torch[-1] if torch else None,
        "pid1": Path("/proc/1/comm").read_text().strip() if Path("/proc/1/comm").exists() else None,
        "systemctl": shutil.which("systemctl"),
        "journalctl": shutil.which("journalctl"),
        "nvcc": run(["nvcc", "--version"], 20).stdout.strip().splitlines()[-1:],
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
    }


# --- the kit -----------------------------------------------------------------------------


def stage(kit: Path) -> tuple[dict, list[str]]:
    """The manifest, and the parts still missing once those that came are kept in KEPT."""
    manifest = json.loads((kit / "manifest.json").read_text())
    (KEPT / "parts").mkdir(parents=True, exist_ok=True)
    missing = []
    for part in manifest["parts"]:
        kept = KEPT / "parts" / part["name"]
        if kept.exists() and file_digest(kept) == part["sha256"]:
            continue
        came = kit / "parts" / part["name"]
        if came.exists() and file_digest(came) == part["sha256"]:
            shutil.copyfile(came, kept)
            log(f"kept part {part['name']} ({part['bytes'] / 2**20:.1f} MiB)")
            continue
        missing.append(part["name"])
    return manifest, missing


def venv_site(venv: str) -> Path:
    return Path(venv) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def install(manifest: dict, venv: str, clock: Clock) -> dict:
    """The parts unpacked and installed offline into VENV (once per machine): a venv of the
    image's Python whose own site-packages (the set) come before the image's (torch)."""
    marker = Path(venv) / f".kit-{manifest['id']}"
    if marker.exists():
        return {"reused": True}
    began = time.monotonic()
    wheels = KEPT / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    for part in manifest["parts"]:
        done = run(["tar", "-xJf", str(KEPT / "parts" / part["name"]), "-C", str(wheels)],
                   min(240, clock.left()))
        if done.returncode:
            raise RuntimeError(f"unpacking {part['name']}: {done.stdout[-2000:]}")
    unpacked = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    made = run([sys.executable, "-m", "venv", "--without-pip", venv], 120)
    if made.returncode:
        raise RuntimeError(f"venv: {made.stdout[-2000:]}")
    site = venv_site(venv)
    # The image's packages (torch, triton, numpy, ...) after the set's own.
    (site / "zz-image-site.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    (site / "sitecustomize.py").write_text((HERE / "import_record.py").read_text())
    names = sorted(str(p) for p in wheels.glob("*.whl"))
    done = run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                "--disable-pip-version-check", "--no-warn-script-location", "--target",
                str(site), *names], min(400, clock.left()))
    if done.returncode:
        raise RuntimeError(f"pip install: {done.stdout[-3000:]}")
    stage_scripts()
    marker.write_text(json.dumps(manifest["wheels"]) + "\n")
    return {"reused": False, "wheels": len(names), "unpack_s": round(unpacked - began, 1),
            "pip_s": round(time.monotonic() - unpacked, 1)}


def stage_scripts() -> None:
    """The deploy's remote scripts where it uploads them (``remote.TOOLS``)."""
    for script in (remote.LAUNCHER, remote.STARTUP_WATCH, remote.GPU_SAMPLER,
                   remote.BENCH_RECORD, remote.SERVER_METRICS, remote.AUTOTUNE_PATCH,
                   remote.FLAG_LISTER):
        remote.stage(script, Path(CONF["tools"]))


def model(kit: Path, path: str, seconds: float, python: str, clock: Clock) -> dict:
    """The model's files from the kit and its weights trained here (once per machine)."""
    folder = Path(path)
    if (folder / "model.safetensors").exists():
        return {"reused": True}
    folder.mkdir(parents=True, exist_ok=True)
    for item in (kit / "model").iterdir():
        shutil.copyfile(item, folder / item.name)
    done = run([python, str(HERE / "gpu_model.py"), "train", "--model", path,
                "--seconds", str(seconds)], min(seconds + 180, clock.left()))
    found = remote.marked_json("TRAIN_JSON ", done.stdout)
    if done.returncode or found is None:
        raise RuntimeError(f"training: {done.stdout[-3000:]}")
    return found


# --- the server, as the unit runs it -----------------------------------------------------


def settings_of(overrides: dict):
    from pve_sglang.project import load_defaults
    from pve_sglang.config.settings import ContainerSettings, settings_for

    return settings_for({**load_defaults(), **SETTINGS, **CONF["settings"], **overrides},
                        ContainerSettings)


def rendered(settings) -> dict:
    """What the container phase would write: the server argv, the unit, the env file; and the
    unit's ExecStart argv (the launcher's)."""
    from pve_sglang.server.command import server_argv, venv_python
    from pve_sglang.server.unit_text import (launch_argv, render_env, render_unit,
                                             systemd_command)

    argv = server_argv(settings, 1, GPU_CAPS, None, 1, None, venv_python(settings))
    unit = render_unit(settings, argv, env_file=env_file(settings),
                       launcher=tool(remote.LAUNCHER))
    exec_argv = [str(a) for a in launch_argv(argv, settings.secrets, tool(remote.LAUNCHER))]
    start = "ExecStart=" + systemd_command(exec_argv)
    if start not in unit:
        raise RuntimeError("the ExecStart argv is not the unit's")
    run_argv = list(exec_argv)
    if CONF["module"]:  # --rehearse: the stand-in in the server module's place
        run_argv[run_argv.index("sglang.launch_server")] = CONF["module"]
    return {"argv": [str(a) for a in argv], "exec": exec_argv, "run": run_argv, "unit": unit,
            "env": render_env(settings), "warnings": argv.warnings}


@dataclass
class Server:
    """One start of the server: its process group, and its lines as they came."""

    proc: subprocess.Popen
    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    sink: object = None

    def read(self) -> None:
        for raw in self.proc.stdout:
            when = time.time()
            text = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append((when, text))
            if self.sink is not None:
                self.sink.write(json.dumps({"t": int(when * 1e6), "m": text}) + "\n")
                self.sink.flush()


def start(settings, sink=None) -> tuple[Server, dict]:
    """The server started as its unit would start it (the env file, Environment=,
    WorkingDirectory=, ExecStart), in a session of its own."""
    from pve_sglang.server.unit_text import cache_environment

    files = rendered(settings)
    path = Path(env_file(settings))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    os.chmod(path, 0o600)
    path.write_text(files["env"])
    workdir = Path(settings.sglang_cache_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, **cache_environment(settings)}
    # systemd's EnvironmentFile= and sh's `set -a; .` read the file the same way (its header).
    argv = ["sh", "-c", 'set -a; . "$0"; set +a; exec "$@"', str(path), *files["run"]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=workdir, env=environment, start_new_session=True)
    server = Server(proc, time.time(), sink=sink)
    threading.Thread(target=server.read, daemon=True).start()
    return server, files


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=4) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def follow(server: Server, url: str, stall_s: float, timeout_s: float) -> dict:
    """The start followed as the verify phase follows it (``verify.watch_start``): phases and
    progress from each line, /health asked each second, a stall on silence of both."""
    progress = startup_log.Progress(start=server.started)
    messages, seen, code = [], 0, None
    ended = "timeout"
    while True:
        now = time.time()
        for when, line in server.lines[seen:]:
            messages += [(round(when - server.started, 2), m) for m in progress.feed(line, when)]
        seen = len(server.lines)
        code = health(url)
        if code == 200:
            ended = "ready"
            time.sleep(0.5)  # the lines logged just before it
            for when, line in server.lines[seen:]:
                messages += [(round(when - server.started, 2), m) for m in progress.feed(line, when)]
            break
        if server.proc.poll() is not None:
            time.sleep(1)
            ended = f"exited {server.proc.returncode}"
            break
        if progress.silent_for(now) >= stall_s:
            ended = "stall"
            break
        if now - server.started >= timeout_s:
            break
        time.sleep(1)
    now = time.time()
    texts = [line for _, line in server.lines]
    return {
        "ended": ended,
        "seconds": round(now - server.started, 2),
        "ready_line": progress.ready,
        "phases": {name: round(s, 2) for name, s in progress.times.items()},
        "summary": progress.summary(now),
        "messages": messages,
        "hints": [(hint.name, line) for hint, line in startup_log.diagnose(texts)],
        "lines": len(texts),
    }


def stop(server: Server, wait_s: float = 40) -> dict:
    """SIGTERM to the whole group (KillMode=control-group), SIGKILL after WAIT_S; then wait for
    the GPU to hold no process."""
    began = time.monotonic()
    try:
        os.killpg(server.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        server.proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass
    killed = False
    try:
        os.killpg(server.proc.pid, 0)
        os.killpg(server.proc.pid, signal.SIGKILL)
        killed = True
    except ProcessLookupError:
        pass
    server.proc.wait()
    left = []
    for _ in range(60):
        apps = run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], 20).stdout
        left = [int(p) for p in apps.split() if p.strip().isdigit()]
        if not left:
            break
        time.sleep(0.5)
    for pid in left:  # a rank of this server's session still on the GPU
        try:
            if os.getsid(pid) == server.proc.pid:
                os.kill(pid, signal.SIGKILL)
                killed = True
        except ProcessLookupError:
            pass
    return {"stop_s": round(time.monotonic() - began, 1), "killed": killed,
            "exit": server.proc.returncode, "gpu_processes_left": left}


def generation(settings, timeout_s: float = 60) -> dict:
    """The generation check: ``startup_watch.py generate`` as ``facts.verify.GenerationCheck``
    runs it (the container's python3), judged by ``verify.generation_answers``' rules."""
    from pve_sglang.server.addresses import base_url

    done = run(["python3", tool(remote.STARTUP_WATCH), "generate", "--url",
                base_url(settings.server_host, settings.server_port), "--env-file",
                env_file(settings), "--max-tokens", "48", "--timeout",
                str(int(timeout_s))], timeout_s + 30)
    found = remote.json_objects(done.stdout.splitlines())
    result = found[-1] if found else None
    return {"result": result, "verdict": judge(result)}


def judge(result: dict | None) -> str:
    """``verify.generation_answers``' verdict on RESULT, in words ("ok" when it passes)."""
    if not result or result.get("timed_out"):
        return f"failed: {(result or {}).get('error') or 'no result'}"
    if result.get("status") != 200 or result.get("error"):
        return f"failed: HTTP {result.get('status')}: {result.get('error')}"
    text = result.get("text") or ""
    if not text.strip():
        return "failed: HTTP 200 with no text"
    why = startup_log.degenerate(text)
    bad = startup_log.bad_logprobs(result.get("logprobs") or [])
    if why or bad:
        return f"degenerate: {why or f'{bad} logprobs NaN, inf or missing'}"
    return "ok"


def metrics(settings) -> tuple[str, dict]:
    """/metrics as served, and the figures the metrics sampler reads from it."""
    from pve_sglang.server.addresses import base_url

    url = base_url(settings.server_host, settings.server_port) + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode("utf-8")
    try:
        figures = server_metrics.figures(text)
    except server_metrics.MetricsError as error:
        figures = {"error": str(error)}
    return text, figures


def bench(settings, level: int, share: float, timeout_s: float) -> tuple[dict, str]:
    """The verify phase's benchmark at LEVEL (``verify.benchmark_row``): its row and output."""
    from pve_sglang.server.bench import (bench_exit_status, bench_runs, bench_shell,
                                         gpu_columns, metric_columns, record_row)
    from pve_sglang.server.command import venv_python

    [argv] = bench_runs(settings, venv_python(settings), settings.server_host, RELEASE,
                        tool(remote.GPU_SAMPLER), tool(remote.BENCH_RECORD),
                        tool(remote.SERVER_METRICS), levels=[level], share=share).values()
    command = bench_shell(argv, env_file(settings)).get_raw_value()
    done = run(["sh", "-c", command], timeout_s)
    output = done.stdout
    row: dict = {"concurrency": level}
    try:
        status = bench_exit_status(output)
        if status != 0:
            raise ValueError(f"the benchmark exited with status {status}")
        row.update(record_row(remote.marked_json(bench_record.RECORD_PREFIX, output)))
        row.update(gpu_columns(remote.marked_json(gpu_sampler.SUMMARY_PREFIX, output)))
        row.update(metric_columns(remote.marked_json(server_metrics.SUMMARY_PREFIX, output)))
    except ValueError as error:
        row["error"] = str(error)
    return row, output


def flags_check(settings, argv: list[str]) -> dict:
    """The installed release's flags (``remote/sglang_flags.py``) against the argv."""
    from pve_sglang.server.command import check_flags, parse_flags_output, venv_python

    done = run([venv_python(settings), tool(remote.FLAG_LISTER),
                str(venv_site(settings.venv_path))], 120)
    known = parse_flags_output(done.stdout)
    try:
        check_flags(argv, known)
        verdict = "ok"
    except ValueError as error:
        verdict = str(error)
    return {"version": known.version, "flags": len(known), "verdict": verdict}


def autotune(settings) -> dict:
    done = run(["python3", tool(remote.AUTOTUNE_PATCH), "--check",
                str(venv_site(settings.venv_path) / "sglang")], 60)
    return {"exit": done.returncode, "said": done.stdout.strip()}


def imports(settings) -> dict:
    """The distributions whose modules the server's processes imported (``import_record.py``),
    by where they came from: the set or the image."""
    from pve_sglang.server.command import venv_python

    code = ("import json, sys, importlib.metadata as m\n"
            "names = set(json.load(sys.stdin))\n"
            "owners = m.packages_distributions()\n"
            "out = {}\n"
            "for name in sorted(names):\n"
            "    for dist in owners.get(name, []):\n"
            "        d = m.distribution(dist)\n"
            "        out.setdefault(str(d.locate_file('')), set()).add(d.metadata['Name'])\n"
            "print(json.dumps({k: sorted(v) for k, v in out.items()}))\n")
    names = set()
    for path in Path("/tmp/kit/imports").glob("*.txt"):
        names |= set(path.read_text().split())
    done = run([venv_python(settings), "-c", code], 120, input=json.dumps(sorted(names)))
    try:
        return {"top_level": len(names), "by_site": json.loads(done.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"error": done.stdout[-2000:]}


# --- the commands ------------------------------------------------------------------------


def prepare(args, summary: Summary, clock: Clock) -> dict | None:
    summary.put("facts", facts())
    if args.rehearse:
        stage_scripts()
        return {}
    manifest, missing = stage(args.kit)
    if missing:
        summary.put("staged", {"missing": missing})
        log(f"parts still missing: {', '.join(missing)}: send them in the next call")
        return None
    summary.put("install", install(manifest, "/opt/sglang/venv", clock))
    log(f"installed: {summary['install']}")
    # This script runs on the image's Python, which lacks the deploy's own packages (pyinfra,
    # pydantic): the set's venv carries them, after the checkout and before the image's.
    site_dir = str(venv_site("/opt/sglang/venv"))
    if site_dir not in sys.path:
        sys.path.insert(2, site_dir)
    settings = settings_of({})
    from pve_sglang.server.command import venv_python

    summary.put("model", model(args.kit, settings.model_path, args.train_s,
                               venv_python(settings), clock))
    log(f"model: {summary['model']}")
    return manifest


def serve(args) -> int:
    clock = Clock(args.ends)
    out = args.out
    summary = Summary(out / "summary.json")
    if prepare(args, summary, clock) is None:
        return 3
    key = secrets.token_urlsafe(24)
    settings = settings_of({"api_key": key})
    with (out / "startup.jsonl").open("w") as sink:
        server, files = start(settings, sink)
        summary.put("rendered", {k: v for k, v in files.items() if k != "env"})
        summary.put("flags", flags_check(settings, files["argv"]))
        log(f"started: {' '.join(files['exec'])}")
        from pve_sglang.server.addresses import base_url

        url = base_url(settings.server_host, settings.server_port)
        try:
            watched = follow(server, url, STALL_S, min(420, clock.left() - 60))
            summary.put("start", watched)
            log(f"start: {watched['ended']} after {watched['seconds']}s: {watched['summary']}")
            if watched["ended"] == "ready":
                summary.put("generation", generation(settings))
                log(f"generation: {summary['generation']['verdict']}: "
                    f"{(summary['generation']['result'] or {}).get('text')!r}")
                rows, outputs = [], []
                for level in settings.bench_concurrencies:
                    if clock.left() < 60:
                        break
                    row, output = bench(settings, level, 1.0, min(150, clock.left() - 40))
                    rows.append(row)
                    outputs.append(f"### concurrency {level}\n{output}")
                    summary.put("bench", rows)
                    log(f"bench {level}: {row.get('output_token_throughput')} output tok/s")
                (out / "bench.txt").write_text("\n".join(outputs))
                text, figures = metrics(settings)
                (out / "metrics.txt").write_text(text)
                summary.put("metrics", figures)
        finally:
            summary.put("stop", stop(server))
    leaked = [line for _, line in server.lines if key in line]
    summary.put("key_in_output", len(leaked))
    summary.put("autotune", autotune(settings))
    summary.put("imports", imports(settings))
    log("done")
    return 0


def tries(args) -> int:
    clock = Clock(args.ends)
    out = args.out
    summary = Summary(out / "tries_summary.json")
    if prepare(args, summary, clock) is None:
        return 3
    # The deploy's side (pyinfra, pydantic) comes with the set: importable once it is installed.
    from pve_sglang.server.addresses import base_url
    from pve_sglang.tuning.deployed import tried
    from pve_sglang.tuning.drive import Drive, Server as DriveServer, ending_of
    from pve_sglang.tuning.space import start_of

    settings = settings_of({"api_key": secrets.token_urlsafe(24)})
    url = base_url(settings.server_host, settings.server_port)
    state: dict = {"server": None, "n": 0, "starts": []}
    logs = (out / "tries_log.txt").open("w")

    def apply(candidate: dict) -> str:
        if state["server"] is not None:
            stop(state["server"])
        state["n"] += 1
        cs = tried(settings, candidate)
        logs.write(f"### start {state['n']}: {json.dumps(candidate)}\n")
        server, files = start(cs)
        state["server"] = server
        watched = follow(server, url, STALL_S, max(30, min(300, clock.left() - 30)))
        for _, line in server.lines:
            logs.write(line + "\n")
        logs.flush()
        entry = {"n": state["n"], "candidate": candidate, "argv": files["argv"][3:],
                 "start": {k: watched[k] for k in ("ended", "seconds", "phases", "hints")}}
        if watched["ended"] != "ready":
            ended = ending_of([line for _, line in server.lines], watched["ended"] == "stall",
                              answer=None)
        else:
            checked = generation(cs)
            entry["generation"] = checked["verdict"]
            text = (checked["result"] or {}).get("text")
            ended = "" if checked["verdict"] == "ok" else ending_of(
                [line for _, line in server.lines], False, text if text else None)
        entry["ended"] = ended
        state["starts"].append(entry)
        summary.put("starts", state["starts"])
        log(f"start {state['n']} {candidate}: {ended or 'serves'} ({watched['seconds']}s)")
        return ended

    def measure(length: float, limit_s: float, level: int = TRY_LEVEL) -> dict:
        # The drive's Server.measure: LENGTH of the whole, hung after LIMIT_S, at LEVEL.
        row, output = bench(settings, level, length, max(30, min(limit_s, clock.left() - 30)))
        logs.write(f"### bench at {length}\n{output}\n")
        return row

    tuned = Path("/tmp/tune/gpu-sglang.yml")
    shutil.rmtree(tuned.parent, ignore_errors=True)
    tuned.parent.mkdir(parents=True)
    found = start_of(settings.tuning, TRY_SPACE)
    if args.oom:
        # The try that runs out of memory on purpose, alone (the search may not reach it in
        # a short call): its ending read from the real log by the drive's own ending_of.
        try:
            apply({**found, "mem_fraction_static": max(TRY_SPACE["mem_fraction_static"])})
        finally:
            if state["server"] is not None:
                summary.put("stop", stop(state["server"]))
            logs.close()
        log("done")
        return 0
    try:
        # The drive finds the server running on the flags it was found with (the deploy's):
        # started here first.
        apply(found)
        budget = max(60.0, clock.left() - args.reserve)
        # The drive's expected costs are the seed's (a 400 GB model: 600 s a start, 600 s a
        # benchmark) until it measures its own; at those no part fits a few minutes (the first
        # call tried none): this small model's start as just measured, and a whole benchmark
        # at TRY_LEVEL (about 20 s on an H100 in the serve phase), with room.
        first_start_s = state["starts"][0]["start"]["seconds"] or 60.0
        drive = Drive(space=TRY_SPACE, found=found, budget_s=budget, tuned=tuned,
                      objective_level=TRY_LEVEL, start_s=first_start_s + 10, bench_s=TRY_BENCH_S)
        search = drive.run(DriveServer(apply=apply, measure=measure))
        summary.put("search", {"stopped": search.stopped, "best": search.best,
                               "best_score": search.best_score, "noise": search.noise,
                               "tries": len(search.tries), "budget_s": round(budget)})
    finally:
        if state["server"] is not None:
            summary.put("stop", stop(state["server"]))
        logs.close()
        from pve_sglang.tuning.record import record_path

        if record_path(tuned).exists():
            shutil.copyfile(record_path(tuned), out / "tries.jsonl")
        if tuned.exists():
            summary.put("tuned_file", tuned.read_text())
    log("done")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("serve", "tries", "both", "stage"))
    parser.add_argument("--kit", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    parser.add_argument("--train-s", type=float, default=75)
    parser.add_argument("--deadline", type=float, default=540)
    parser.add_argument("--reserve", type=float, default=70,
                        help="seconds kept from the tries' budget for the last restart")
    parser.add_argument("--oom", action="store_true",
                        help="tries: only the start that runs out of memory on purpose")
    parser.add_argument("--rehearse", type=Path, metavar="DIR",
                        help="on a machine without a GPU: the settings' venv, model and paths "
                        "under DIR/settings.json, a stand-in server in sglang's place")
    args = parser.parse_args(argv)
    if args.rehearse:
        CONF.update(tools=str(args.rehearse / "tools"), env_dir=str(args.rehearse / "etc"),
                    module="standin_launch",
                    settings=json.loads((args.rehearse / "settings.json").read_text()))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "stage":
        _, missing = stage(args.kit)
        log(f"missing: {missing or 'none'}")
        return 0
    args.ends = time.monotonic() + args.deadline
    if args.command == "tries":
        return tries(args)
    done = serve(args)
    if args.command == "both" and done == 0 and args.ends - time.monotonic() > args.reserve + 60:
        log(f"tries with the {args.ends - time.monotonic():.0f} s left")
        return tries(args)
    return done


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
