"""The kit that takes SGLang 0.5.17 to the device machine: its wheel set trimmed of what a small
dense model's start on sm_90 does not load, in parts under one call's carry; the model's config
and tokenizer; this checkout.

    python3 tests/device/gpu_kit.py build --out DIR [--part-mib N]   (make gpu-kit)
    python3 tests/device/gpu_kit.py check                            (make gpu-kit-check)
    python3 tests/device/gpu_kit.py lock                             (the set's lock, again)

The set is the release's own resolution for Python 3.12 on x86_64 (``LOCK``, made by
``uv pip compile sglang==0.5.17 --only-binary :all:``; 211 packages, torch 2.11.0, the device
image's), less what the image already holds (``IMAGE``: torch, triton, numpy, tokenizers, ...),
less what the start never imports: only ``CARRY`` travels, and ``sglang-kernel`` without the
kernels this start does not load (``TRIM``). Which modules the start imports is checked twice:
here before the first call (``check``: every module of ``START_MODULES`` imported with the
kit's set beside a CUDA torch on this CPU machine, where ``sgl_kernel`` and the JIT kernels
stay unloaded), and there, where every process of the server's venv records its imports
(``import_record.py``) and ``gpu_serve.py`` reports them by site.

The wheels are repacked uncompressed and put in ``tar.xz`` parts: one solid compression of all
their files is about half the size of the wheels' own zip compression. Each part is at most
``--part-mib`` (the device tool carries 64 MiB a call, the checkout's own files included);
``gpu_serve.py`` keeps the parts that came under ``/tmp/kit`` on the machine, so that more
parts than one call carries arrive over consecutive calls while it stays warm, and installs
them with pip, offline, once all are there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from pve_sglang.remote.file_hash import file_digest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RELEASE = "0.5.17"
LOCK = HERE / f"sglang-{RELEASE}-py3.12.lock"
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "linux_x86_64")
CACHE = Path(os.environ.get("PVE_SGLANG_TEST_CACHE", REPO / ".cache")) / "gpu-kit"

#: What the device image holds already (its package list, 2026-11-17), as the set names them:
#: taken from there, not carried, but for IMAGE_NOT_TAKEN.
IMAGE = frozenset("""
aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click
cuda-bindings cuda-pathfinder cuda-toolkit einops filelock frozenlist fsspec h11 hf-xet httpcore
httpx huggingface-hub idna jinja2 markdown-it-py markupsafe mdurl mpmath msgpack multidict
networkx ninja numba numpy nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx packaging pillow prometheus-client propcache psutil pygments
pyyaml regex requests rich safetensors scipy sentencepiece setuptools shellingham sympy tiktoken
tokenizers torch torchaudio torchvision tqdm triton typer urllib3 uvloop xxhash
yarl llvmlite protobuf pandas python-dateutil six tzdata pyarrow transformers
""".split())
#: The image's packages at a version the set does not take: the set's own travels (CARRY).
IMAGE_NOT_TAKEN = {
    "transformers": "5.17.0 there; the set pins 5.12.1",
    "tokenizers": "0.23.2 there; transformers 5.12.1 refuses it at import (<=0.23.0)",
}

#: What travels: the set's packages the start imports that the image lacks (found by ``check``,
#: module by module), then the deploy's own needs there (pyinfra and pydantic: the tuning
#: drive and the settings run on the machine).
CARRY = (
    # sglang itself, its kernels (trimmed), FlashInfer (the deploy's attention backend) and its
    # JIT loader
    "sglang", "sglang-kernel", "flashinfer-python", "apache-tvm-ffi",
    # the set's transformers (the image's 5.17.0 is not the set's)
    "transformers",
    # the HTTP server and its models
    "fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core", "annotated-types",
    "typing-inspection", "typing-extensions", "opentelemetry-api", "python-multipart",
    # the set's tokenizers: transformers 5.12.1 refuses the image's 0.23.2 at import
    "tokenizers",
    # the engine's processes, tokenizer and detokenizer, the OpenAI layer
    "pyzmq", "orjson", "msgspec", "pybase64", "setproctitle", "partial-json-parser",
    "xgrammar", "openai", "distro", "sniffio", "compressed-tensors", "loguru", "gguf",
    "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "soundfile", "dill",
    "ipython", "traitlets",
    # the benchmark's datasets module
    "datasets", "multiprocess",
    # the deploy's side: settings, rendering and the tuning drive
    "pyinfra", "gevent", "greenlet", "paramiko", "cryptography", "bcrypt", "pynacl", "cffi",
    "pycparser", "invoke", "typeguard", "zope-event", "zope-interface",
)
#: The deploy's own packages are not in the sglang set: their versions are the project's.
PROJECT_PINS = {
    "pyinfra": "3.10.0", "gevent": "26.9.0", "greenlet": "3.5.6", "paramiko": "4.0.0",
    "cryptography": "51.0.1", "bcrypt": "5.0.0", "pynacl": "1.6.2", "cffi": "2.1.1",
    "pycparser": "3.12", "invoke": "3.0.3", "typeguard": "4.6.1", "zope-event": "6.2",
    "zope-interface": "8.7",
}
#: Members left out of a wheel, and why: kernels a dense model on sm_90 with the FlashInfer
#: attention backend never loads (each is loaded only by the module that needs it).
TRIM = {
    "sglang-kernel": (
        (r"sgl_kernel/flash_ops\.abi3\.so", "FlashAttention 3 (1.12 GB): loaded by "
         "sgl_kernel.flash_attn, for the fa3 attention backend only"),
        (r"sgl_kernel/flashmla_ops\.abi3\.so", "FlashMLA: MLA models (DeepSeek) only"),
        (r"sgl_kernel/infllm_ops\..*\.so", "InfLLM-V2 sparse attention: its backend only"),
        (r"sgl_kernel/sm100/.*", "common_ops for sm_100 (Blackwell): sgl_kernel.load_utils "
         "loads sm90/common_ops on a Hopper GPU"),
    ),
    "xgrammar": (
        (r"xgrammar/lib/.*\.a", "the static C++ library (65 MB), for linking against it; Python "
         "loads xgrammar/libxgrammar_bindings.so"),
        (r"xgrammar/include/.*", "C++ headers, for the same"),
    ),
}
#: The modules a server's start and its benchmark import (the entry point, the HTTP server,
#: the engine's three processes, the model runner, the Llama model, the FlashInfer backend,
#: the benchmark) and FlashInfer itself.
START_MODULES = (
    "sglang.launch_server", "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager", "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner", "sglang.srt.models.llama",
    "sglang.srt.layers.attention.flashinfer_backend", "sglang.benchmark.serving", "flashinfer",
)
#: The deploy's modules ``gpu_serve.py`` imports there, on the image's Python with the set's
#: venv on its path (pyinfra and pydantic are the set's, not the image's).
DRIVER_MODULES = (
    "pve_sglang.project", "pve_sglang.remote", "pve_sglang.remote.file_hash", "pve_sglang.server",
    "pve_sglang.config.settings",
    "pve_sglang.server.addresses",
    "pve_sglang.server.bench", "pve_sglang.server.command", "pve_sglang.server.unit_text",
    "pve_sglang.tuning.deployed", "pve_sglang.tuning.drive", "pve_sglang.tuning.record",
    "pve_sglang.tuning.space",
)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """``name -> version`` of the lock's pins."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", line.strip())
        if match:
            pins[norm(match[1])] = match[2]
    return pins


def pins() -> dict[str, str]:
    """``name -> version`` of every carried package; a name the lock and the project both lack
    is an error naming it."""
    locked = read_lock()
    out = {}
    for name in CARRY:
        version = PROJECT_PINS.get(name) or locked.get(norm(name))
        if version is None:
            raise SystemExit(f"gpu_kit: {name} is in CARRY but neither in {LOCK.name} nor in "
                             "PROJECT_PINS")
        out[name] = version
    return out


def download(name: str, version: str, folder: Path, python: str = PYTHON) -> Path:
    """The wheel of NAME==VERSION for Python PYTHON on x86_64 Linux, in FOLDER (cached)."""
    tag = python.replace(".", "")
    found = [p for p in folder.glob("*.whl") if norm(p.name.split("-")[0]) == norm(name)
             and p.name.split("-")[1] == version and _fits(p.name, tag)]
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", "-d", str(folder)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    subprocess.run([*argv, f"{name}=={version}"], check=True)
    return download(name, version, folder, python)


def _fits(filename: str, tag: str) -> bool:
    """Whether wheel FILENAME installs on CPython TAG (``312``)."""
    python_tag, abi = filename[:-4].split("-")[-3:-1]
    return ("py3" in python_tag or f"cp{tag}" in python_tag
            or (abi == "abi3" and int(python_tag.split("cp")[-1]) <= int(tag)))


def trimmed(wheel: Path, rules: tuple, folder: Path) -> tuple[Path, list[dict]]:
    """WHEEL less the members RULES name (its RECORD too), in FOLDER; what was left out."""
    patterns = [(re.compile(pattern), why) for pattern, why in rules]
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / wheel.name
    dropped = []
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dest:
        for info in source.infolist():
            why = next((w for p, w in patterns if p.fullmatch(info.filename)), None)
            if why:
                dropped.append({"member": info.filename, "bytes": info.file_size, "why": why})
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in data.decode().splitlines()
                        if not any(p.fullmatch(line.split(",")[0]) for p, _ in patterns)]
                data = ("\n".join(kept) + "\n").encode()
            dest.writestr(_stored(info), data)
    return out, dropped


def _stored(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    copy = zipfile.ZipInfo(info.filename, info.date_time)
    copy.external_attr = info.external_attr
    copy.compress_type = zipfile.ZIP_STORED
    return copy


def stored(wheel: Path, folder: Path) -> Path:
    """WHEEL repacked uncompressed (the same members and RECORD), in FOLDER."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dest:
        for info in source.infolist():
            dest.writestr(_stored(info), source.read(info))
    return out


def pack(wheels: list[Path], out: Path, part_mib: float) -> list[dict]:
    """The wheels in ``tar.xz`` parts of at most PART_MIB each, each wheel whole in one part:
    packed largest first by each wheel's own compressed size (``_alone``), then each part
    compressed at once (solid: a little smaller than the sum). SystemExit for a wheel that
    alone is larger than a part, or a part that came out larger."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.tar.xz"):
        old.unlink()
    limit = part_mib * 2**20
    sizes = {wheel: _alone(wheel) for wheel in wheels}
    groups: list[list[Path]] = []
    for wheel in sorted(wheels, key=lambda w: -sizes[w]):
        if sizes[wheel] > limit:
            raise SystemExit(f"gpu_kit: {wheel.name} alone is {sizes[wheel] / 2**20:.1f} MiB "
                             f"compressed, over the part's {part_mib} MiB")
        room = [g for g in groups if sum(sizes[w] for w in g) + sizes[wheel] <= limit]
        (room[0] if room else groups.append([]) or groups[-1]).append(wheel)
    parts = []
    for number, group in enumerate(groups, 1):
        name = f"wheels-{number}.tar.xz"
        size = _part(group, out / name)
        if size > limit:
            raise SystemExit(f"gpu_kit: {name} came out {size / 2**20:.1f} MiB")
        parts.append({"name": name, "bytes": size, "sha256": file_digest(out / name),
                      "wheels": sorted(w.name for w in group)})
    return parts


def _alone(wheel: Path) -> int:
    """WHEEL's size compressed alone (cached by its contents' hash)."""
    memo = CACHE / "xz-sizes" / (file_digest(wheel) + ".txt")
    if memo.exists():
        return int(memo.read_text())
    memo.parent.mkdir(parents=True, exist_ok=True)
    size = _xz([wheel], CACHE / "xz-sizes" / "trial.tar.xz")
    memo.write_text(str(size))
    return size


def _part(wheels: list[Path], dest: Path) -> int:
    """WHEELS compressed into DEST, the same wheels' part reused (cached by their hashes)."""
    key = hashlib.sha256("".join(sorted(file_digest(w) for w in wheels)).encode()).hexdigest()[:24]
    kept = CACHE / "parts" / f"{key}.tar.xz"
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        _xz(wheels, kept.with_suffix(".tmp"))
        kept.with_suffix(".tmp").rename(kept)
    shutil.copyfile(kept, dest)
    return dest.stat().st_size


def _xz(wheels: list[Path], dest: Path) -> int:
    with tarfile.open(dest, "w:xz", preset=9) as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    return dest.stat().st_size


#: What of this checkout travels beside the wheels: this folder. The package, its defaults and
#: templates are the device machine's copy of the checkout the call sends (the carry is 64 MiB
#: a call, the checkout's own files and the wheels most of it); a product change not in that
#: checkout yet goes in CODE too, and comes first on ``sys.path`` there.
CODE = ("tests/device",)


def code_files() -> list[str]:
    """The checkout's files under CODE as git sees them (tracked, and new ones it does not
    ignore)."""
    done = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard",
                           "--", *CODE], capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if (REPO / line).is_file()]


def build(out: Path, part_mib: float) -> dict:
    """The kit in OUT: ``parts/``, ``model/``, ``code/``, ``manifest.json``."""
    began = time.monotonic()
    versions = pins()
    raw, repacked = CACHE / "wheels", CACHE / "stored"
    shutil.rmtree(repacked, ignore_errors=True)
    wheels, dropped = [], {}
    for name, version in versions.items():
        wheel = download(name, version, raw)
        if name in TRIM:
            small, dropped[name] = trimmed(wheel, TRIM[name], repacked)
            wheels.append(small)
        else:
            wheels.append(stored(wheel, repacked))
    parts = pack(wheels, out / "parts", part_mib)
    model = out / "model"
    shutil.rmtree(model, ignore_errors=True)
    made = subprocess.run([sys.executable, str(HERE / "gpu_model.py"), "files", "--out",
                           str(model)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(_tools())})
    code = out / "code"
    shutil.rmtree(code, ignore_errors=True)
    for relative in code_files():
        target = code / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, target)
    manifest = {
        "release": RELEASE,
        "id": hashlib.sha256("".join(p["sha256"] for p in parts).encode()).hexdigest()[:16],
        "parts": parts,
        "wheels": versions,
        "trimmed": dropped,
        "model": json.loads(made.stdout.strip().splitlines()[-1].split(" ", 1)[1]),
        "built": time.strftime("%Y-%m-%d %H:%M:%S"),
        "build_s": round(time.monotonic() - began, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _tools() -> Path:
    """A folder with the ``tokenizers`` library for the model's tokenizer (the lock's version),
    installed once; the project's venv does not hold it."""
    folder = CACHE / "tools"
    if not (folder / "tokenizers").is_dir():
        version = read_lock()["tokenizers"]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(folder),
                        f"tokenizers=={version}"], check=True)
    return folder


def check(venv: Path | None = None) -> int:
    """Import START_MODULES with the kit's set beside a CUDA build of torch on this CPU machine
    (``CACHE/check-venv``, Python of this machine): the image's packages at the lock's versions,
    the carried ones as the kit has them. 0 when every module imports."""
    venv = venv or CACHE / "check-venv"
    python = venv / "bin" / "python"
    versions = pins()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # torch and torchvision as this machine's disk has them (a CUDA build: its torchvision
        # imports, which the CPU build's does not); the image's own 2.11.0 is the set's.
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.14.1",
                        "torchvision==0.29.1"], check=True)
    tag = f"{sys.version_info.major}.{sys.version_info.minor}"
    # The image's packages at the release's own resolution for this Python (its versions for
    # 3.12 may need a newer one: networkx 3.7).
    here_lock = CACHE / f"sglang-{RELEASE}-py{tag}.lock"
    if not here_lock.exists():
        lock(here_lock, tag)
    locked = read_lock(here_lock)
    # The CUDA libraries and torch are the CUDA torch's own here (nvidia-ml-py is no library).
    image = [f"{n}=={locked[n]}" for n in sorted(IMAGE) if n in locked and (
             n == "nvidia-ml-py" or not n.startswith(("nvidia-", "cuda-", "torch")))]
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *image], check=True)
    here = CACHE / f"wheels-py{tag}"
    files = []
    for name, version in versions.items():
        wheel = download(name, version, here, tag)
        files.append(trimmed(wheel, TRIM[name], CACHE / f"trimmed-py{tag}")[0]
                     if name in TRIM else wheel)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    *map(str, files)], check=True)
    code = ("import importlib, sys\nfailed = 0\n"
            "for name in sys.argv[1:]:\n"
            "    try:\n        importlib.import_module(name); print('imported', name)\n"
            "    except Exception as error:\n"
            "        failed += 1; print('FAILED', name, type(error).__name__, error)\n"
            "sys.exit(1 if failed else 0)\n")
    done = subprocess.run([str(python), "-c", code, *START_MODULES, *DRIVER_MODULES],
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)})
    return done.returncode


def lock(out: Path = LOCK, python: str = PYTHON) -> None:
    """``LOCK`` again (or OUT): the release's resolution for Python 3.12 (PYTHON) on x86_64,
    wheels only."""
    requirement = CACHE / "sglang.in"
    requirement.parent.mkdir(parents=True, exist_ok=True)
    requirement.write_text(f"sglang=={RELEASE}\n")
    subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "compile",
                    str(requirement), "--python-version", python, "--python-platform",
                    "x86_64-manylinux_2_34", "--only-binary", ":all:", "--no-header",
                    "--no-annotate", "-q", "-o", str(out)], check=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("build")
    made.add_argument("--out", type=Path, required=True)
    made.add_argument("--part-mib", type=float, default=40)
    checking = commands.add_parser("check")
    checking.add_argument("--venv", type=Path, help="the check's venv (made when missing)")
    commands.add_parser("lock")
    args = parser.parse_args(argv)
    if args.command == "build":
        manifest = build(args.out, args.part_mib)
        for part in manifest["parts"]:
            print(f"{part['name']}: {part['bytes'] / 2**20:.1f} MiB, {len(part['wheels'])} wheels")
        print(f"kit {manifest['id']} in {args.out} ({manifest['build_s']} s)")
        return 0
    if args.command == "lock":
        lock()
        return 0
    return check(args.venv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
