"""What the SGLang server's own log says about its start: phases, progress, known failures.

Pure: journal lines in, words out. The line formats are those of every tested release, 0.5.9
to 0.5.23, read from their sources (``model_loader/weight_utils.py`` and ``utils/common.py``'s
``BAR_FORMAT`` for the shards bar, ``model_executor/model_runner.py``, ``mem_cache/``,
``distributed/bootstrap.py``, ``model_executor/runner/flashinfer_autotune.py``,
``model_executor/model_runner_components/cuda_graph_setup.py``, ``entrypoints/http_server.py``);
what changed on the way: distributed init logs ``Init parallel begin.`` from 0.5.21 (was ``Init
torch distributed begin.``), graph capture ``Capture target decode CUDA graph begin. backend=...``
(and ``target prefill``, ``draft ...``, ``... verify``) from 0.5.14 (was ``Capture cuda graph
begin.``), autotune ``Running FlashInfer autotune with cache: PATH`` from 0.5.12 (was ``Running
FlashInfer autotune...``), the KV cache line gained ``dtype: ...`` and the log prefix ranks such
as ``ATTN_CP0``. Real logs, and logs
built from the release's format strings (``*_from_source.log``), are kept in
``tests/fixtures/sglang_logs/``. ``HINTS`` is the one table of known causes
of a failed start; every alternative of every row is tested on real lines from public reports,
or on the failing library's own message text where no report was at hand.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

READY_LINE = "The server is fired up and ready to roll!"

# sglang's log prefix: ``[2025-10-16 09:06:22 TP5] `` (``DP1 PP0 TP3`` and the like too).
_PREFIX = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?P<ranks>(?: [A-Z][A-Z_]*\d+)*)\] ")
#: The weights' bars as sglang's ``model_loader/weight_utils.py`` names them: one thread's
#: (``Loading safetensors checkpoint shards``) or several's (``Multi-thread loading shards``,
#: what 0.5.17 drew on an H100 by default), of safetensors, pt or np_cache files.
SHARDS_BAR = (r"(?:Loading (?:safetensors |pt |np_cache )?checkpoint|"
              r"Multi-thread loading(?: pt checkpoint)?) shards")
SHARDS = re.compile(
    SHARDS_BAR + r":\s+(?P<pct>\d+)% Completed \| (?P<n>\d+)/(?P<total>\d+)"
    r" \[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+),\s*(?P<rate>[^\]]*)\]")
KV_CACHE = re.compile(
    r"KV Cache is allocated\. (?:dtype: \S+, )?#tokens: (?P<tokens>\d+), "
    r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)")

#: The phases of a start, in order: (name, what starts it). A phase ends when a later one
#: starts; the server is ready at READY_LINE.
PHASES: list[tuple[str, re.Pattern]] = [
    ("init", re.compile(r"Init torch distributed begin|Init parallel begin")),
    ("weights", re.compile(r"Load weight begin|" + SHARDS_BAR)),
    ("kv cache", re.compile(r"KV Cache is allocated|Memory pool end")),
    ("autotune", re.compile(r"Running FlashInfer autotune")),
    ("cuda graph", re.compile(r"Capture (?:cuda|piecewise CUDA|(?:target|draft) (?:decode|prefill|"
                              r"verify) CUDA) graph begin")),
    ("warmup", re.compile(r"Uvicorn running on|Application startup complete|"
                          r"max_total_num_tokens=")),
    ("ready", re.compile(re.escape(READY_LINE))),
]
#: Shard progress is logged every SHARDS_STEPS-th of the shards (every 10%), at the last shard,
#: and after SHARDS_QUIET_S seconds since the last shards line, whichever comes first.
SHARDS_STEPS = 10
SHARDS_QUIET_S = 60.0
#: The summary leaves out a phase shorter than this, in seconds: it would read ``0s``.
SUMMARY_MIN_S = 0.5


def strip(line: str) -> str:
    """A journal line without tqdm's carriage returns and sglang's time and rank prefix."""
    line = line.replace("\r", "").strip()
    return _PREFIX.sub("", line)


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``; half a second rounds up."""
    seconds = max(0, math.floor(seconds + 0.5))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _clock(text: str) -> int | None:
    """tqdm's ``MM:SS`` or ``H:MM:SS`` in seconds (None for ``?``)."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return None
    total = 0
    for part in parts:
        total = total * 60 + part
    return total


@dataclass
class Progress:
    """The start followed line by line: ``feed`` returns what is worth a log line now."""

    start: float  # the unit's start, seconds (the journal's clock)
    phase: str = "starting"
    phase_start: float = 0.0
    times: dict[str, float] = field(default_factory=dict)  # phase -> seconds spent
    last_line: float = 0.0
    ready: bool = False
    kv_logged: bool = False
    # (shards, when) of the last shards line; none yet: the first one is logged at once
    _shards_logged: tuple[int, float] = (-1, -math.inf)

    def __post_init__(self) -> None:
        self.phase_start = self.last_line = self.start

    def _enter(self, phase: str, when: float) -> list[str]:
        names = [name for name, _ in PHASES]
        if phase == self.phase or (self.phase in names and names.index(phase) < names.index(self.phase)):
            return []  # another rank's line of a phase already entered
        self.times[self.phase] = self.times.get(self.phase, 0.0) + when - self.phase_start
        self.phase, self.phase_start = phase, when
        if phase == "ready":
            self.ready = True
            return [f"ready after {duration(when - self.start)}"]
        return [f"{phase} (at {duration(when - self.start)})"]

    def feed(self, line: str, when: float) -> list[str]:
        """The messages LINE (logged at WHEN, seconds) gives: a phase entered, shard progress
        (``SHARDS_STEPS``, ``SHARDS_QUIET_S``), the KV cache's size."""
        self.last_line = max(self.last_line, when)
        text = strip(line)
        messages = []
        for name, pattern in PHASES:
            if pattern.search(text):
                messages += self._enter(name, when)
                break
        # A bar's updates joined by carriage returns arrive as one line: the last one counts.
        shards = next(reversed(list(SHARDS.finditer(text))), None)
        if shards:
            n, total = int(shards["n"]), int(shards["total"])
            logged, logged_at = self._shards_logged
            step = max(1, total // SHARDS_STEPS)
            if n > logged and (n == total or n - logged >= step
                               or when - logged_at >= SHARDS_QUIET_S):
                self._shards_logged = (n, when)
                eta = _clock(shards["eta"])
                messages.append(
                    f"weights: {n}/{total} shards ({shards['pct']}%), {shards['rate'].strip()}"
                    + (f", ETA {duration(eta)}" if eta is not None and n < total else ""))
        kv = KV_CACHE.search(text)
        if kv and not self.kv_logged:  # every rank logs it: once
            size = (float(kv["k"]) + float(kv["v"])) if kv["k"] else float(kv["kv"])
            self.kv_logged = True
            messages.append(f"KV cache: {int(kv['tokens']):,} tokens, {size:.2f} GB per GPU")
        if "FlashInfer autotune completed" in text:
            messages.append(f"autotune finished (at {duration(when - self.start)})")
        return messages

    def silent_for(self, now: float) -> float:
        """Seconds since the last line (or the start)."""
        return now - self.last_line

    def summary(self, now: float) -> str:
        """Time per phase, in order, the current one up to NOW."""
        times = dict(self.times)
        if not self.ready:
            times[self.phase] = times.get(self.phase, 0.0) + now - self.phase_start
        parts = [f"{name} {duration(seconds)}" for name, seconds in times.items()
                 if name != "ready" and seconds >= SUMMARY_MIN_S]
        return ", ".join(parts) or "no phase seen"


# --- known causes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hint:
    name: str
    pattern: re.Pattern
    hint: str


def _hint(name: str, pattern: str, hint: str) -> Hint:
    return Hint(name, re.compile(pattern, re.IGNORECASE), hint)


#: Known causes of a failed or stuck start: the first lines they match name them.
HINTS: list[Hint] = [
    # torch says "CUDA driver initialization failed" for cudaGetDeviceCount's error 3 (its
    # "Unexpected error from cudaGetDeviceCount()... Error N" is for the other codes).
    _hint("cuda-init", r"CUDA_ERROR_NOT_INITIALIZED|cuInit\S* (?:failed|returned?)\D*3\b|"
          r"CUDA driver initialization failed|cuda driver library init failure: 3",
          "CUDA did not initialise (cuInit error 3) while the driver is loaded: on the open "
          "kernel modules this is nvidia_uvm's HMM; set uvm_disable_hmm (the host phase's "
          "warning says how) and reload nvidia_uvm"),
    _hint("driver-mismatch", r"Driver/library version mismatch",
          "the container's user-space NVIDIA driver is not the host's kernel module version: "
          "run the deploy again so it installs the host's exact version"),
    _hint("driver-too-old", r"NVIDIA driver on your system is too old|"
          r"CUDA driver version is insufficient for CUDA runtime version",
          "the host's NVIDIA driver is older than the CUDA runtime of the installed stack (CUDA "
          "13, sglang 0.5.11 and later, needs driver R580 or newer): update the host's driver "
          "and run the deploy again (the container's user-space driver follows it), or choose "
          "a sglang_version whose set uses CUDA 12"),
    _hint("cuda-oom", r"CUDA out of memory|torch\.OutOfMemoryError",
          "the GPUs ran out of memory: lower mem_fraction_static (or max_running_requests / "
          "the context length), or use more GPUs; a process left on the GPU also takes memory "
          "(nvidia-smi)"),
    _hint("address-in-use", r"address already in use|Errno 98|EADDRINUSE|Port is already in use",
          "a port the server needs is taken (another server or an old one still running): free "
          "it (ss -ltnp) or change server_port / dist_init_port"),
    _hint("nccl", r"NCCL error|NCCL WARN|ncclCommInitRank|ncclUnhandledCudaError|"
          r"DistBackendError|Watchdog caught collective operation timeout",
          "NCCL between the GPUs failed or hung: in a VM P2P is often missing, and ACS/IOMMU "
          "can route it through the root complex; see the P2P report above, try iommu=pt or "
          "disabling ACS, NCCL_P2P_DISABLE=1 as a last resort"),
    _hint("sm120-autotune", r"Skipping tactic|Failed to initialize cutlass TMA WS grouped gemm|"
          r"Failed to initialize the TMA descriptor|illegal instruction",
          "FlashInfer's MoE autotune failed tactics (known on SM120, RTX PRO 6000): if the "
          "start hangs or output is corrupt, add --disable-flashinfer-autotune to "
          "extra_server_args or choose another moe_runner_backend"),
    _hint("flashinfer-arch", r"Unsupported gpu architecture 'compute_|"
          r"No supported CUDA architectures found for major versions|"
          r"FlashInfer requires GPUs with sm75 or higher",
          "FlashInfer's JIT cannot build for these GPUs' architecture: its nvcc is from a CUDA "
          "toolkit older than the GPU (SM120 needs 12.8 or newer), or the kernel exists only for "
          "other architectures (SM90/SM100): use the toolkit of the set's CUDA major, or choose "
          "another attention_backend / moe_runner_backend"),
    # CUDA's cudaErrorNoKernelImageForDevice, as torch and sgl-kernel print it: a wheel built
    # before the GPU existed (RTX 50 / SM120 on a set of CUDA 12.6 or older).
    _hint("kernel-arch", r"no kernel image is available for execution on the device",
          "a kernel of the installed set has no code for these GPUs' architecture (compute "
          "capability, nvidia-smi --query-gpu=compute_cap): its wheels predate the GPU. Choose "
          "a sglang_version whose set is built for it (Blackwell, SM100/SM120: a set of CUDA "
          "12.8 or later, such as the default CUDA 13 set; torch.cuda.get_arch_list() in the "
          "venv lists what its torch has); a kernel built from source needs "
          "TORCH_CUDA_ARCH_LIST to name the GPU's capability (e.g. 12.0)"),
    _hint("nvcc-missing", r"Could not find nvcc|No such file or directory: '[^']*/nvcc'|"
          r"/nvcc: not found",
          "FlashInfer's JIT found no nvcc (CUDA_HOME, PATH, /usr/local/cuda): the CUDA toolkit "
          "of the set's CUDA major is missing in the container; run the deploy again (its stack "
          "step installs it) or point CUDA_HOME at a toolkit"),
    _hint("hf-access", r"You are trying to access a gated repo|Cannot access gated repo|"
          r"Repository Not Found for url|Invalid credentials in Authorization header",
          "Hugging Face refused the model: it is gated or private and hf_token cannot read it "
          "(accept the model's terms on its page with the token's account; a read token is "
          "enough), the token is wrong, or the repo id is misspelled"),
    _hint("disk-full", r"No space left on device|Not enough free disk space to download the file",
          "a filesystem is full (the model download, the venv, sglang_cache_dir's JIT and "
          "autotune caches, or /dev/shm): see df -h in the container, then free space or grow "
          "the container's disk"),
    _hint("model-path", r"Repo id must be in the form|Incorrect path_or_model_id|"
          r"is not a local folder and is not a valid model identifier|"
          r"No such file or directory: '[^']*config\.json'|Can't load the configuration of",
          "the model is not where model_path says: check model_path (or set model_download) "
          "and that the directory holds config.json and the weights"),
]


def diagnose(lines: list[str]) -> list[tuple[Hint, str]]:
    """The hints whose pattern a line of LINES matches, each once with its first line."""
    found: dict[str, tuple[Hint, str]] = {}
    for line in lines:
        text = strip(line)
        for hint in HINTS:
            if hint.name not in found and hint.pattern.search(text):
                found[hint.name] = (hint, text)
    return [found[h.name] for h in HINTS if h.name in found]


# --- the generation check -----------------------------------------------------------------


#: The generation check's thresholds (``degenerate``; characters are counted spaces aside):
#: shorter text is not judged;
JUDGED_CHARS = 6
#: from this length on, one character, few distinct ones or one word can tell;
COUNTED_CHARS = 8
#: "most of the text": more than this share of it;
MOST = 0.6
#: this many distinct characters or fewer;
FEW_DISTINCT = 2
#: one word: among this many words or more;
COUNTED_WORDS = 6
#: one unit of 1 to UNIT_CHARS characters (a token's text) repeated REPEATS times or more in a
#: row. Three do not count: real words and answers have them (``hahaha``, ``blablabla``), and a
#: collapse fills the check's 48 tokens with many more.
UNIT_CHARS = 16
REPEATS = 4
_REPEATED_UNIT = re.compile(rf"(.{{1,{UNIT_CHARS}}}?)\1{{{REPEATS - 1},}}", re.DOTALL)


def degenerate(text: str, share: float = MOST) -> str | None:
    """Why TEXT looks like collapsed decoding, or None.

    Collapsed: one character or word repeated for more than SHARE of it (``!!!!!!!``, ``the the
    the``), ``FEW_DISTINCT`` distinct characters or fewer, or one unit (``UNIT_CHARS``,
    ``REPEATS``) repeated in a row, spaces aside, covering more than SHARE of the characters
    (``的的的的的的``, ``abcabcabcabc``, ``<|x|><|x|><|x|><|x|>``).
    """
    chars = [c for c in text if not c.isspace()]
    if len(chars) < JUDGED_CHARS:
        return None
    if len(chars) >= COUNTED_CHARS:
        char, count = Counter(chars).most_common(1)[0]
        if count / len(chars) > share and not char.isalnum():
            return f"{count} of {len(chars)} characters are {char!r}"
        if len(set(chars)) <= FEW_DISTINCT:
            return f"only {sorted(set(chars))} repeated"
        words = text.split()
        if len(words) >= COUNTED_WORDS:
            word, count = Counter(words).most_common(1)[0]
            if count / len(words) > share:
                return f"{count} of {len(words)} words are {word!r}"
    dense = "".join(chars)
    runs = list(_REPEATED_UNIT.finditer(dense))
    covered = sum(len(run.group(0)) for run in runs)
    if runs and covered / len(dense) > share:
        longest = max(runs, key=lambda run: len(run.group(0)))
        unit = longest.group(1)
        return (f"{covered} of {len(dense)} characters are a repeated unit "
                f"({unit!r} x{len(longest.group(0)) // len(unit)})")
    return None


def bad_logprobs(values: list[str]) -> int:
    """How many logprobs (as the generate command's reprs) are NaN, inf or missing."""
    bad = 0
    for value in values:
        try:
            number = float(value)
        except (TypeError, ValueError):
            bad += 1
            continue
        bad += not math.isfinite(number)
    return bad
