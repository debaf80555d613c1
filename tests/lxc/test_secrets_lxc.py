"""The API key and HF token stay out of every argv and the journal: a real container, systemd,
the real unit and launcher, and the real sglang 0.5.9 release.

The container gets a venv with sglang 0.5.9 and its own pins (torch 2.9.1, transformers 4.57.1,
openai 2.6.1; torch's CUDA libraries load without a GPU), just what importing
``sglang.srt.server_args`` needs: built once inside a container from PyPI wheels and cached under
``.cache/`` (``PVE_SGLANG_TEST_CACHE`` moves it), bind-mounted at the unit's ``venv_path``.

How far sglang runs here: with ``--device cpu`` and a tiny local ``config.json``,
``sglang.launch_server`` builds its real ServerArgs from the unit's arguments and then stops
importing ``sgl_kernel`` (``sglang/srt/mem_cache/memory_pool_host.py``, reached from
``http_server`` -> ``engine``; not installed here, and its wheel needs ``libcuda.so.1``), before
``engine.py`` logs ``server_args=``. So
``test_server_args_logged_under_the_unit_hide_the_secrets`` runs, under the same rendered unit
and launcher, a module that does what ``engine.py`` does at that point: the real
``prepare_server_args``, sglang's ``configure_logger`` and ``logger.info(f"{server_args=}")`` with
sglang's engine logger, in the main process and in a spawned process (as the scheduler ranks are).
``test_real_launch_server_exits_1_without_the_key_in_the_journal`` runs ``sglang.launch_server``
itself until it fails.

``test_benchmark_leaves_the_key_in_no_file`` runs the real serving benchmark of 0.5.9 and 0.5.23
(each in a venv of what its benchmark imports, built and cached the same way) through the verify
phase's own benchmark step against the stand-in server (tests/standin_sglang.py) under the
deploy's unit, then reads every file of the container for the secrets.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cache_dir import TEST_CACHE

from pve_sglang.facts.verify import HttpStatus
from pve_sglang import remote
from pve_sglang.server.command import server_argv, venv_python
from pve_sglang.server.unit_text import LAUNCHER, env_file_path, render_env, render_unit, unit_name
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings
from wheels import PIP_TARGET, pip_download

LAUNCHER_SOURCE = remote.source(remote.LAUNCHER)

REPO = Path(__file__).resolve().parents[2]
CACHE = TEST_CACHE
RELEASE = "0.5.9"
# What ``python -m sglang.launch_server`` of 0.5.9 imports before it needs sgl_kernel, found by
# running it until only sgl_kernel was missing; the pins are the release's own (its METADATA).
# torchvision: PyPI's wheels link libtorch_cuda, so this machine's CPU torch cannot serve.
STACK = (
    "torch==2.9.1", "torchvision==0.24.1", "transformers==4.57.1", "openai==2.6.1", "numpy",
    "tqdm", "pybase64", "requests", "pydantic", "aiohttp", "safetensors", "orjson", "pyzmq",
    "packaging", "pillow", "starlette", "partial_json_parser", "huggingface_hub", "IPython",
    "dill", "sentencepiece", "compressed_tensors", "gguf", "uvicorn", "uvloop", "fastapi",
    "setproctitle", "msgspec",
)
# Every tag the containers' glibc (Debian 12: 2.36) takes; the CUDA 13 wheels of 0.5.23's torch
# use 2_18, 2_25 and 2_27 among others.
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)),
             "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
VENV_KEY = hashlib.sha256("\n".join((RELEASE, *STACK)).encode()).hexdigest()[:12]
VENV_CACHE = CACHE / f"sglang-{RELEASE}-server-args-venv-{VENV_KEY}"

# Quotes, backslash, $ and %: every spelling the mask must catch (repr escapes them).
API_KEY = "sk-live-7Qp'quo\"te\\back$HOME%pct"
HF_TOKEN = "hf_SecretTokenXyZ1234567890"
SECRETS = (API_KEY, HF_TOKEN)
MODEL = "/models/tiny"
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 256,
}
PROBE_DIR = "/opt/pvs-probe"
READY = "/run/pvs-probe-ready"
# What sglang/srt/entrypoints/engine.py (0.5.9, line ~1031) does once the arguments are parsed,
# in the main process and in a spawned child (sglang spawns its scheduler ranks).
PROBE = '''
import hashlib, logging, multiprocessing, sys, time
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils.common import configure_logger

logger = logging.getLogger("sglang.srt.entrypoints.engine")


def rank(server_args):
    configure_logger(server_args, prefix=" TP0")
    logger.info(f"{server_args=}")
    print(f"rank sys.argv={sys.argv}", flush=True)
    open("READY", "w").write(hashlib.sha256(server_args.api_key.encode()).hexdigest())
    time.sleep(600)


if __name__ == "__main__":
    server_args = prepare_server_args(sys.argv[1:])
    configure_logger(server_args)
    logger.info(f"{server_args=}")
    print(f"sys.argv={sys.argv}", flush=True)
    child = multiprocessing.get_context("spawn").Process(target=rank, args=(server_args,))
    child.start()
    child.join()
'''.replace("READY", READY)
SPAWNED_ENVIRONS = '''
from pathlib import Path
for proc in Path("/proc").glob("[0-9]*"):
    try:
        if b"multiprocessing" in (proc / "cmdline").read_bytes():
            print(b"SGLANG_API_KEY=" in (proc / "environ").read_bytes())
    except OSError:
        pass
'''
HEALTH_SERVER = '''
import http.server, os, sys
expected = "Bearer " + os.environ["SGLANG_API_KEY"]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        import time; time.sleep(1)  # long enough to read every argv meanwhile
        self.send_response(200 if self.headers.get("Authorization") == expected else 401)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''


def settings(**overrides) -> ContainerSettings:
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    # The release the venv holds: the unit's flags are spelled for it (server.spelling).
    base = {"api_key": API_KEY, "hf_token": HF_TOKEN, "model_path": MODEL,
            "extra_server_args": ["--device", "cpu"], "sglang_version": RELEASE}
    return ContainerSettings.model_validate({**data, **base, **overrides})


def spellings(secret: str) -> set[str]:
    """SECRET as written, inside a Python repr (ServerArgs, a list) and inside JSON."""
    return {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]}


def hits(text: str) -> int:
    """How often any secret occurs in TEXT, in any of its spellings."""
    return sum(text.count(spelling) for secret in SECRETS for spelling in spellings(secret))


def host_cmdlines() -> str:
    """Every process's argv on this machine (the containers' processes included), one a line."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return "\n".join(lines)


# --- the venv ---------------------------------------------------------------------------


def _download_wheelhouse(dest: Path, release: str, stack: tuple[str, ...], sglang_wheel) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    # The containers' Python (tests/wheels.py's target), on every platform tag their wheels use.
    target = [arg for i, arg in enumerate(PIP_TARGET) if "--platform" not in (arg, PIP_TARGET[i - 1])]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    # With retries; what a failed try fetched stays in DEST and is not fetched again.
    pip_download(["--only-binary=:all:", *target, *platforms, "--abi", "abi3", "--abi", "none",
                  "-d", str(dest), *stack, f"uv=={load_defaults()['uv_version']}"],
                 f"the sglang {release} stack")
    shutil.copy(sglang_wheel(release), dest)


@pytest.fixture(scope="session")
def server_args_venv(lxc_env, sglang_wheel) -> Path:
    """The cached venv (host path) holding sglang 0.5.9 and what its ServerArgs import needs."""
    return cached_venv(lxc_env, RELEASE, STACK, VENV_CACHE, sglang_wheel)


def cached_venv(lxc_env, release: str, stack: tuple[str, ...], folder: Path, sglang_wheel) -> Path:
    """FOLDER: a venv of sglang RELEASE (no dependencies) and STACK, built once in a container."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others then reuse it
        return _build_venv(lxc_env, release, stack, folder, sglang_wheel)


def _build_venv(lxc_env, release: str, stack: tuple[str, ...], folder: Path, sglang_wheel) -> Path:
    venv_path = settings().venv_path
    stamp = folder / ".pvs-complete"
    if stamp.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    wheelhouse = CACHE / f"wheelhouse-{folder.name}"
    if not (wheelhouse / ".pvs-complete").exists():
        _download_wheelhouse(wheelhouse, release, stack, sglang_wheel)
        (wheelhouse / ".pvs-complete").write_text("")
    folder.mkdir(parents=True)
    builder = lxc_env.create(extra_config=[
        f"lxc.mount.entry = {wheelhouse} opt/wheelhouse none bind,ro,create=dir 0 0",
        f"lxc.mount.entry = {folder} {venv_path.strip('/')} none bind,create=dir 0 0",
    ])
    try:
        build = (
            "set -e; python3 -m venv /opt/uv && /opt/uv/bin/pip install -q --no-index /opt/wheelhouse/uv-*.whl; "
            f"/opt/uv/bin/uv venv --python /usr/bin/python3 {venv_path}; "
            f"UV_LINK_MODE=copy /opt/uv/bin/uv pip install -q --python {venv_path}/bin/python "
            "--offline --no-index --no-deps /opt/wheelhouse/*.whl"
        )
        done = builder.attach(build, check=False, timeout=1800)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        builder.destroy()
    stamp.write_text(f"sglang {release}\n" + "\n".join(stack) + "\n")
    shutil.rmtree(wheelhouse, ignore_errors=True)  # GBs; the venv is what is kept
    return folder


# --- the container ----------------------------------------------------------------------


@pytest.fixture
def container(lxc_container_factory, server_args_venv):
    """A booted container with the venv mounted, the launcher and a tiny model config."""
    (box,) = lxc_container_factory(extra_config=[
        f"lxc.mount.entry = {server_args_venv} {settings().venv_path.strip('/')} none bind,create=dir 0 0",
    ])
    put(box, LAUNCHER, LAUNCHER_SOURCE.read_text())
    put(box, f"{MODEL}/config.json", json.dumps(TINY_CONFIG))
    put(box, f"{PROBE_DIR}/pvs_server_args_probe.py", PROBE)
    return box


def put(box, path: str, text: str, mode: str = "644") -> None:
    """Write TEXT to PATH in the container through stdin (never through an argv)."""
    box.attach(f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)} && "
               f"chmod {mode} {shlex.quote(path)}", input=text)


def install_unit(box, s: ContainerSettings, argv: list[str], env_text: str | None = None,
                 extra_environment: dict | None = None) -> str:
    """The deploy's env file (0600) and unit, rendered by the deploy's functions; the unit name."""
    put(box, env_file_path(s), render_env(s) if env_text is None else env_text, mode="600")
    text = render_unit(s, argv, extra_environment=extra_environment)
    assert hits(text) == 0
    put(box, f"/etc/systemd/system/{unit_name(s)}", text)
    box.attach(f"mkdir -p {s.sglang_cache_dir} && systemctl daemon-reload")
    return unit_name(s)


def journal(box, unit: str) -> str:
    return box.attach(["journalctl", "-u", unit, "--no-pager", "-o", "verbose"], check=False).stdout


def wait_for(box, condition: str, timeout: float, what: str, unit: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if box.attach(condition, check=False).returncode == 0:
            return
        time.sleep(0.5)
    pytest.fail(f"{what} not seen within {timeout}s:\n" + journal(box, unit)[-4000:])


def probe_argv(s: ContainerSettings) -> list[str]:
    argv = server_argv(s, 1, [], None, 1, None, venv_python(s))
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return [argv[0], "-m", "pvs_server_args_probe", *argv[3:]]


# --- the tests --------------------------------------------------------------------------


def test_server_args_logged_under_the_unit_hide_the_secrets(container):
    s = settings()
    unit = install_unit(container, s, probe_argv(s), extra_environment={"PYTHONPATH": PROBE_DIR})
    container.attach(["systemctl", "start", unit])
    wait_for(container, f"test -s {READY} && journalctl -u {unit} -o cat | grep -c "
             "'server_args=ServerArgs(' | grep -qx 2", 240, "both server_args logs", unit)

    inside_ps = container.attach(["ps", "-eo", "pid,args", "--width", "100000"]).stdout
    inside_cmdlines = container.attach(
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done", check=False).stdout
    on_host = host_cmdlines()
    status = container.attach(["systemctl", "status", "--no-pager", "-l", "-n", "200", unit],
                              check=False).stdout
    log = journal(container, unit)
    whole_journal = container.attach(["journalctl", "--no-pager", "-o", "verbose"]).stdout
    counts = {"ps": hits(inside_ps), "cmdline": hits(inside_cmdlines), "host cmdline": hits(on_host),
              "systemctl status": hits(status), "journal": hits(whole_journal)}
    print(f"secrets found while the unit runs: {counts}")
    assert counts == dict.fromkeys(counts, 0)

    # It did run the real thing: sglang's ServerArgs repr, through sglang's logger, from the
    # main process and the spawned one, with the real key inside (its digest) but masked.
    assert "launch_server" not in inside_ps and "pvs_server_args_probe" in inside_ps
    assert "--arg-from-env=--api-key=SGLANG_API_KEY" in inside_ps
    assert "multiprocessing" in inside_ps  # the spawned rank
    logged = [line for line in log.splitlines() if "server_args=ServerArgs(" in line]
    assert len(logged) == 2, log[-4000:]
    for line in logged:
        assert "api_key='<hidden SGLANG_API_KEY>'" in line and "device='cpu'" in line
    assert "'--api-key', '<hidden SGLANG_API_KEY>'" in log  # sys.argv of both processes
    digest = container.attach(["cat", READY]).stdout.strip()
    assert digest == hashlib.sha256(API_KEY.encode()).hexdigest()
    # The processes the server starts do not inherit the key's variable (the launcher and its
    # fork still have it in /proc/PID/environ, readable by root only).
    environs = container.attach(["python3", "-c", SPAWNED_ENVIRONS]).stdout.split()
    assert environs and set(environs) == {"False"}, environs

    container.attach(["systemctl", "stop", unit], timeout=180)
    state = sorted(container.attach(["systemctl", "show", "-p", "ActiveState,Result", unit]).stdout.split())
    assert state == ["ActiveState=inactive", "Result=success"]  # the launcher ended as its child did


def test_real_launch_server_exits_1_without_the_key_in_the_journal(container):
    s = settings()
    unit = install_unit(container, s, server_argv(s, 1, [], None, 1, None, venv_python(s)))
    container.attach(["systemctl", "start", unit])
    wait_for(container, f"journalctl -u {unit} -o cat | grep -q 'code=exited, status=1/FAILURE'",
             240, "the server's exit 1", unit)
    log = journal(container, unit)
    whole_journal = container.attach(["journalctl", "--no-pager", "-o", "verbose"]).stdout
    counts = {"journal": hits(whole_journal), "host cmdline": hits(host_cmdlines())}
    print(f"secrets found after the real sglang.launch_server failed: {counts}")
    assert counts == dict.fromkeys(counts, 0)
    # It got past the argument parsing of the real release (or this test proves nothing).
    # systemd saw exit 1 from the launcher (the child's code, so Restart=on-failure applies),
    # after the release had parsed the unit's arguments and imported its HTTP server.
    assert "Traceback" in log and "No module named 'sgl_kernel'" in log, log[-4000:]
    assert "sglang/srt/entrypoints/http_server.py" in log, log[-4000:]
    container.attach(["systemctl", "stop", unit], check=False)


def test_empty_key_refuses_to_start_and_does_not_loop(container):
    s = settings()
    env_text = render_env(settings(api_key=None)) + 'SGLANG_API_KEY=""\n'
    unit = install_unit(container, s, server_argv(s, 1, [], None, 1, None, venv_python(s)), env_text)
    container.attach(["systemctl", "start", unit], check=False)
    wait_for(container, f"systemctl show -p ExecMainStatus --value {unit} | grep -qx 78", 60,
             "exit 78", unit)
    log = journal(container, unit)
    assert "SGLANG_API_KEY is empty or unset" in log and hits(log) == 0
    # failed, not activating (auto-restart): RestartPreventExitStatus=78 held.
    state = sorted(container.attach(["systemctl", "show", "-p", "ActiveState,NRestarts", unit]).stdout.split())
    assert state == ["ActiveState=failed", "NRestarts=0"]


def test_health_check_sends_the_key_without_an_argv(container):
    s = settings()
    env_file = env_file_path(s)
    put(container, env_file, render_env(s), mode="600")
    put(container, f"{PROBE_DIR}/health_server.py", HEALTH_SERVER)
    port = 38000 + os.getpid() % 1000
    # The test's server reads the key as the unit does: systemd's EnvironmentFile.
    container.attach(["systemd-run", "--unit", "pvs-health", "-p", f"EnvironmentFile={env_file}",
                      "/usr/bin/python3", f"{PROBE_DIR}/health_server.py", str(port)])
    url = f"http://127.0.0.1:{port}/health"
    command = HttpStatus().command(url, env_file).get_raw_value()
    assert hits(command) == 0
    wait_for(container, f"curl -s -o /dev/null http://127.0.0.1:{port}/", 30, "the health server", "pvs-health")
    attach = [
        "lxc-attach", "-P", str(container.lxc_path), "-n", container.name, "--clear-env",
        "-v", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "--", "sh", "-c", command,
    ]
    running = subprocess.Popen(attach, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # curl waits for the answer now
    during = host_cmdlines()
    out, err = running.communicate(timeout=60)
    assert "curl" in during and hits(during) == 0
    assert HttpStatus().process(out.splitlines()) == 200, err
    # Without the key the same server refuses: the header really carried it.
    put(container, env_file, "# no key\n", mode="600")
    done = container.attach(["sh", "-c", command])
    assert HttpStatus().process(done.stdout.splitlines()) == 401
    container.attach(["systemctl", "stop", "pvs-health"], check=False)


# --- the serving benchmark --------------------------------------------------------------
# Each tested release's real benchmark (``python -m sglang.bench_serving``, 0.5.9;
# ``python -m sglang.benchmark.serving``, 0.5.23) run by the verify phase's own benchmark step
# (``tasks.verify.benchmark_check``, through the pyinfra CLI, tests/deploys/benchmark.py)
# against the stand-in server (tests/standin_sglang.py) under the deploy's unit, the key set.
# Both releases write a record holding the server's /get_server_info (/server_info) answer:
# the key, in the stand-in as in SGLang. Then every file of the container and the history on
# this machine are searched for the secrets.

# What importing each release's benchmark module needs, found by importing it until nothing
# was missing; pins are the release's own (its METADATA) where it has them. 0.5.9's imports no
# torch; huggingface_hub<1.0: transformers 4.57.1 refuses the 1.x that datasets would bring.
# 0.5.23's imports sglang.srt (torch, its CUDA libraries, triton), which loads without a GPU.
BENCH_STACKS = {
    "0.5.9": ("transformers==4.57.1", "huggingface_hub<1.0", "datasets", "aiohttp", "numpy",
              "pybase64", "requests", "pillow", "tqdm", "IPython", "pydantic",
              # What the server metrics sampler reads /metrics with (make tune's test).
              "prometheus-client>=0.20.0"),
    "0.5.23": ("torch==2.14.1", "torchvision", "transformers==5.19.0", "tokenizers==0.23.2",
               "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0", "sentencepiece==0.2.1",
               "python-dateutil<3", "aiohttp", "msgspec", "numpy", "orjson", "requests", "tqdm",
               "psutil", "pyzmq", "pybase64", "pillow", "starlette", "IPython", "datasets", "gguf"),
}
STANDIN_DIR = "/opt/standin"
LOGS = REPO / "tests" / "fixtures" / "sglang_logs"
BENCH_PORT = 39400 + os.getpid() % 500
# A word-level tokenizer (transformers loads it with PreTrainedTokenizerFast): the benchmark
# makes its random-ids prompts with it and counts the stand-in's words with it.
VOCAB = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(255)}}
TOKENIZER = {
    "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
    "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}],
    "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
    "model": {"type": "WordLevel", "vocab": VOCAB, "unk_token": "[UNK]"},
}
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
                    "model_max_length": 4096}
# Every regular file of the container (its root file system, /run, /tmp, the venv's mount),
# read in full; the patterns come on stdin, never in an argv or a file.
# Only the files changed since SINCE are read: a file whose inode did not change since the
# test began (ctime: any write, and any utime that would hide one, sets it) cannot hold the
# test's key; the cached venvs' gigabytes it binds in are walked, not read.
FIND_SECRETS = r'''
import json, os, stat, sys
asked = json.load(sys.stdin)
patterns = [p.encode() for p in asked["patterns"]]
longest = max(map(len, patterns))
found, files, read = {}, 0, 0
for root, dirs, names in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        files += 1
        if info.st_ctime < asked["since"]:
            continue
        read += 1
        count, tail = 0, b""
        try:
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    data = tail + chunk
                    count += sum(data.count(p) - tail.count(p) for p in patterns)
                    tail = data[-(longest - 1):] if longest > 1 else b""
        except OSError:
            continue
        if count:
            found[path] = count
print(json.dumps({"files": files, "read": read, "found": found}))
'''


def bench_venv_folder(release: str) -> Path:
    key = hashlib.sha256("\n".join((release, *BENCH_STACKS[release])).encode()).hexdigest()[:12]
    return CACHE / f"sglang-{release}-bench-venv-{key}"


def bench_settings(release: str, history: Path) -> dict:
    """The host's settings overrides (the inventory's): a quick run of two small levels."""
    return {"api_key": API_KEY, "hf_token": HF_TOKEN, "model_path": "/models/standin",
            "server_port": BENCH_PORT, "sglang_version": release, "bench": True,
            "bench_preset": "quick", "bench_quick_concurrencies": [1, 2], "bench_num_prompts": 4,
            "bench_prompts_per_concurrency": 2, "bench_input_len": 16, "bench_output_len": 8,
            "bench_gpu_sample_ms": 100, "bench_history_dir": str(history)}


def standin_started(box, unit: str, service: str) -> None:
    """UNIT started with SERVICE's lines (a drop-in's) putting the stand-in in the place of
    sglang, its ready line seen."""
    put(box, f"/etc/systemd/system/{unit}.d/standin.conf", f"[Service]\n{service}\n")
    box.attach(f"systemctl daemon-reload && systemctl start {unit}")
    wait_for(box, f"journalctl -u {unit} -o cat | grep -q 'The server is fired up'", 120,
             "the stand-in server's ready line", unit)


def deploy_argv(deploy: str, *hosts: tuple) -> list[str]:
    """The pyinfra CLI running the test deploy DEPLOY (tests/deploys/) on HOSTS, each a
    container and its host data (the inventory written beside the first)."""
    inventory = hosts[0][0].dir / "inventory.py"
    inventory.write_text("hosts = [" + "".join(
        f"({box.inventory_name!r}, {{**{box.host_data()!r}, **{data!r}}}), "
        for box, data in hosts) + "]\n")
    return [str(Path(sys.executable).parent / "pyinfra"), str(inventory), deploy, "-y"]


def test_deploy(deploy: str, *hosts: tuple) -> tuple[str, float]:
    """``deploy_argv`` run from the checkout; its output and seconds, once it succeeded."""
    started = time.monotonic()
    done = subprocess.run(deploy_argv(deploy, *hosts), cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    return log, time.monotonic() - started


test_deploy.__test__ = False  # a helper, not a test


def find_secrets(box, since: float) -> dict:
    """``{"files": N, "read": N, "found": {path: hits}}``: every spelling of every secret in the
    files of the container changed since SINCE (epoch seconds), of the N files it holds."""
    patterns = sorted({spelling for secret in SECRETS for spelling in spellings(secret)})
    put(box, f"{PROBE_DIR}/find_secrets.py", FIND_SECRETS)
    done = box.attach(["python3", f"{PROBE_DIR}/find_secrets.py"],
                      input=json.dumps({"patterns": patterns, "since": since}), timeout=900)
    return json.loads(done.stdout)


@pytest.mark.parametrize("release", sorted(BENCH_STACKS))
def test_benchmark_leaves_the_key_in_no_file(release, lxc_env, lxc_container_factory, tmp_path,
                                             sglang_wheel):
    began = time.time() - 1  # ctime's clock: the kernel's, the container's too
    venv = cached_venv(lxc_env, release, BENCH_STACKS[release], bench_venv_folder(release),
                       sglang_wheel)
    history = tmp_path / "bench-history"
    overrides = bench_settings(release, history)
    s = settings(**overrides)
    (box,) = lxc_container_factory(extra_config=[
        f"lxc.mount.entry = {venv} {s.venv_path.strip('/')} none bind,create=dir 0 0",
    ])
    put(box, f"{STANDIN_DIR}/standin_sglang.py", (REPO / "tests" / "standin_sglang.py").read_text())
    for log in LOGS.glob("*.log"):
        put(box, f"{STANDIN_DIR}/logs/{log.name}", log.read_text())
    put(box, f"{s.model_path}/tokenizer.json", json.dumps(TOKENIZER))
    put(box, f"{s.model_path}/tokenizer_config.json", json.dumps(TOKENIZER_CONFIG))
    # The deploy's env file and unit; the stand-in in the place of sglang (a drop-in), so that it
    # reads the key from the env file as the server does.
    unit = install_unit(box, s, server_argv(s, 1, [], None, 1, None, venv_python(s)))
    standin_started(box, unit, "ExecStart=\nExecStart=/usr/bin/python3 "
                    f"{STANDIN_DIR}/standin_sglang.py --logs {STANDIN_DIR}/logs --port {BENCH_PORT} "
                    "--case normal --event-file /run/standin-event")
    log, elapsed = test_deploy("tests/deploys/benchmark.py", (box, {"settings": overrides}))
    assert "benchmark summary" in log and "median ITL ms" in log, log[-4000:]

    # The figures came from the real record: every prompt of each level completed.
    [saved] = sorted(history.glob("*/*.json"))
    rows = json.loads(saved.read_text())["rows"]
    assert [(r["concurrency"], r["successful_requests"]) for r in rows] == [(1, 4), (2, 4)]
    assert all(r["output_token_throughput"] > 0 and r["median_itl_ms"] > 0 for r in rows)
    assert (saved.parent / "output_tok_s.png").exists()

    searched = find_secrets(box, began)
    mine = {str(path): hits(path.read_text(errors="replace"))
            for path in tmp_path.rglob("*") if path.is_file()}
    print(f"sglang {release}: benchmark deploy {elapsed:.0f}s; {searched['files']} files in the "
          f"container, {searched['read']} changed in the test, secrets found: "
          f"{searched['found']}; pyinfra's output: {hits(log)}; "
          f"history on this machine: {sum(mine.values())} in {len(mine)} files")
    # Only the env file (0600) holds them: no record, no cache, no log of the benchmark.
    assert set(searched["found"]) == {env_file_path(s)}
    assert searched["files"] > 10_000  # it did walk the venv and the system
    # It read what the benchmark wrote: its record, the venv's bytecode, the container's files.
    assert 0 < searched["read"] < searched["files"], searched
    assert hits(log) == 0 and sum(mine.values()) == 0, mine
    assert "BENCH_RECORD_JSON" not in log  # read by the deploy, not shown
    box.attach(["systemctl", "stop", unit], check=False)
