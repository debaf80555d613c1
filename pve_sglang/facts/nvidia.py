"""
Facts about the NVIDIA driver and GPUs of a host (the Proxmox host, or any Linux machine).

Every fact here answers with its ``default()`` when the driver or its tools are absent, rather than
failing the host: "no driver yet" is a state the deploy has to handle, not an error. The shell
guards live in the commands themselves (``command -v``, ``2>/dev/null``, ``|| true``) instead of
``requires_command``, because pyinfra 3.10 warns at execute time (and v4 will raise) when a
``requires_command`` binary is missing.
"""

from __future__ import annotations

import json
import re
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang.gpu.p2p import parse_p2p_matrix, parse_topo_matrix
from pve_sglang.gpu.passthrough import PROC_GPUS


# Tokens that look like a driver version: 570.133.20, 535.104.05, 580.159.04, 470.82
_VERSION_TOKEN = re.compile(r"^\d{2,4}\.\d{1,3}(?:\.\d{1,3})?$")

GPU_QUERY_FIELDS = "index,name,pci.bus_id,compute_cap,memory.total,driver_version"


def parse_driver_version(lines: list[str]) -> str | None:
    """The version from ``/proc/driver/nvidia/version``'s ``NVRM version:`` line, or None."""
    for line in lines:
        if not line.startswith("NVRM version:"):
            continue
        for token in line.split():
            if _VERSION_TOKEN.match(token):
                return token
    return None


class NvidiaDriverVersion(FactBase[str | None]):
    """
    Returns the version of the loaded NVIDIA kernel module, read from
    ``/proc/driver/nvidia/version`` (e.g. ``"570.133.20"``), or ``None`` when no NVIDIA driver is
    loaded. Readable inside LXC containers too: it is the host's module.

    .. code:: python

        "580.159.04"
    """

    @override
    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_driver_version(output)


class NvidiaGpu(TypedDict):
    index: int
    name: str
    bus_id: str
    compute_cap: str
    memory_mib: int
    driver_version: str


def parse_gpu_query(lines: list[str]) -> list[NvidiaGpu]:
    """Rows of ``nvidia-smi --query-gpu=GPU_QUERY_FIELDS --format=csv,noheader,nounits``."""
    gpus: list[NvidiaGpu] = []
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 6 or not fields[0].isdigit():
            # nvidia-smi's own failure messages ("NVIDIA-SMI has failed because it couldn't
            # communicate with the NVIDIA driver...", "No devices were found") land here.
            continue
        # A GPU name could hold a comma: the first field and the last four are fixed.
        index, name = fields[0], ", ".join(fields[1:-4])
        bus_id, compute_cap, memory, driver_version = fields[-4:]
        try:
            memory_mib = int(memory)
        except ValueError:  # "[N/A]"
            memory_mib = 0
        gpus.append(
            NvidiaGpu(
                index=int(index),
                name=name,
                bus_id=bus_id,
                compute_cap=compute_cap,
                memory_mib=memory_mib,
                driver_version=driver_version,
            )
        )
    return gpus


class NvidiaGpus(FactBase[list[NvidiaGpu]]):
    """
    Returns the GPUs that ``nvidia-smi`` sees, from one ``--query-gpu`` call: index, name, PCI bus
    id, compute capability (a string such as ``"9.0"`` or ``"12.0"``), total memory in MiB and
    driver version. ``[]`` when ``nvidia-smi`` is missing or cannot talk to the driver.

    .. code:: python

        [{"index": 0, "name": "NVIDIA H200", "bus_id": "00000000:00:05.0",
          "compute_cap": "9.0", "memory_mib": 143771, "driver_version": "580.159.04"}]
    """

    @override
    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null 2>&1; then "
            f"nvidia-smi --query-gpu={GPU_QUERY_FIELDS} --format=csv,noheader,nounits || true; "
            "fi"
        )

    @staticmethod
    @override
    def default() -> list[NvidiaGpu]:
        return []

    @override
    def process(self, output: list[str]) -> list[NvidiaGpu]:
        return parse_gpu_query(output)


GPU_MINOR_QUERY_FIELDS = "index,pci.bus_id,uuid"


class GpuMinor(TypedDict):
    index: int
    bus_id: str
    uuid: str
    minor: int | None


_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def bus_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """A PCI bus id as numbers: nvidia-smi's ``00000000:8A:00.0`` and the driver's
    ``0000:8a:00.0`` are the same device. None for anything else."""
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function)


def parse_gpu_minors(lines: list[str]) -> list[GpuMinor]:
    """``NvidiaGpuMinors``' output: nvidia-smi's ``index, bus id, uuid`` rows, then each
    ``PROC_GPUS/BUS/information`` line as ``grep -H`` prints it (``PATH:Key: value``). Each
    GPU's minor is found through its bus id (the driver's ``Bus Location``, else its folder's
    name), else through its UUID; None when neither is there."""
    rows: list[tuple[int, str, str]] = []
    files: dict[str, dict[str, str]] = {}
    for line in lines:
        path, sep, rest = line.partition("/information:")
        if sep and path.startswith(PROC_GPUS + "/"):
            key, colon, value = rest.partition(":")
            if colon:
                files.setdefault(path[len(PROC_GPUS) + 1:], {})[key.strip()] = value.strip()
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 3 and fields[0].isdigit():
            rows.append((int(fields[0]), fields[1], fields[2]))
    by_bus: dict[tuple[int, int, int, int], int] = {}
    by_uuid: dict[str, int] = {}
    for folder, info in files.items():
        minor = info.get("Device Minor", "")
        if not minor.isdigit():
            continue  # drivers before 2017 printed no minor: that GPU stays unknown
        bus = bus_key(info.get("Bus Location", "")) or bus_key(folder)
        if bus is not None:
            by_bus[bus] = int(minor)
        uuid = info.get("GPU UUID", "")
        if uuid.startswith("GPU-") and "?" not in uuid:  # "GPU-????..." before its first use
            by_uuid[uuid] = int(minor)
    gpus: list[GpuMinor] = []
    for index, bus_id, uuid in rows:
        bus = bus_key(bus_id)
        at_bus = by_bus.get(bus) if bus is not None else None
        gpus.append(GpuMinor(index=index, bus_id=bus_id, uuid=uuid,
                             minor=at_bus if at_bus is not None else by_uuid.get(uuid)))
    return gpus


class NvidiaGpuMinors(FactBase[list[GpuMinor]]):
    """
    Returns each GPU ``nvidia-smi`` lists with its device minor: the N of ``/dev/nvidiaN``.
    nvidia-smi's index follows PCI bus order; the minor is the order the driver probed the GPUs
    in (``Device Minor`` in ``/proc/driver/nvidia/gpus/BUS/information``, NVML's
    ``nvmlDeviceGetMinorNumber``), and the two differ on real hosts (an A100 host whose GPU 0 is
    ``/dev/nvidia2``). Matched through the PCI bus id, else the UUID; ``minor`` None where no
    information file names it. One command reads both; ``[]`` without nvidia-smi.

    .. code:: python

        [{"index": 0, "bus_id": "00000000:07:00.0", "uuid": "GPU-6f0f...", "minor": 2}]
    """

    @override
    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null 2>&1; then "
            f"nvidia-smi --query-gpu={GPU_MINOR_QUERY_FIELDS} --format=csv,noheader,nounits "
            "|| true; fi; "
            f"grep -H '' {PROC_GPUS}/*/information 2>/dev/null; true"
        )

    @staticmethod
    @override
    def default() -> list[GpuMinor]:
        return []

    @override
    def process(self, output: list[str]) -> list[GpuMinor]:
        return parse_gpu_minors(output)


def parse_char_device_majors(lines: list[str]) -> dict[str, int]:
    """The ``Character devices:`` section of ``/proc/devices`` as name -> major."""
    majors: dict[str, int] = {}
    in_chars = False
    for line in lines:
        stripped = line.strip()
        if stripped == "Character devices:":
            in_chars = True
            continue
        if stripped.endswith("devices:"):  # "Block devices:"
            in_chars = False
            continue
        if not in_chars or not stripped:
            continue
        major, _, name = stripped.partition(" ")
        if major.isdigit() and name:
            # A name listed twice keeps its first (lowest) major, as /proc/devices sorts by major.
            majors.setdefault(name.strip(), int(major))
    return majors


class CharDeviceMajors(FactBase[dict[str, int]]):
    """
    Returns the character device majors that the kernel has registered, from the
    ``Character devices:`` section of ``/proc/devices``, as name -> major. The NVIDIA ones: 195
    for the GPUs, nvidiactl and nvidia-modeset (listed as ``nvidia-frontend`` by older drivers,
    as ``nvidia`` and ``nvidiactl`` by the 580 open module), and the dynamic ``nvidia-uvm``,
    ``nvidia-caps``, ``nvidia-caps-imex-channels``, ``nvidia-nvswitch`` and ``nvidia-nvlink``,
    whose numbers move between kernels and boots. A name listed twice keeps its first major.

    .. code:: python

        {"mem": 1, "nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 238, "nvidia-caps": 241}
    """

    @override
    def command(self) -> str:
        return "cat /proc/devices"

    @staticmethod
    @override
    def default() -> dict[str, int]:
        return {}

    @override
    def process(self, output: list[str]) -> dict[str, int]:
        return parse_char_device_majors(output)


class DeviceNode(TypedDict):
    path: str
    major: int
    minor: int
    mode: str


# %t and %T are the device major and minor in hex (coreutils has no decimal form before 9.x).
_STAT_FORMAT = "%n %t %T %A"


def parse_device_nodes(lines: list[str]) -> list[DeviceNode]:
    """Lines of ``stat -c '%n %t %T %A'``; character devices only (skips /dev/nvidia-caps itself)."""
    nodes: list[DeviceNode] = []
    for line in lines:
        parts = line.split()
        if len(parts) != 4 or not parts[3].startswith("c"):
            continue
        path, major, minor, mode = parts
        try:
            nodes.append(DeviceNode(path=path, major=int(major, 16), minor=int(minor, 16), mode=mode))
        except ValueError:
            continue
    return nodes


class NvidiaDeviceNodes(FactBase[list[DeviceNode]]):
    """
    Returns the NVIDIA character device nodes that exist under ``/dev`` (``/dev/nvidia*`` and
    ``/dev/nvidia-caps/*``), each with its major and minor (decimal) and mode string, from one
    ``stat`` call. ``[]`` when there are none.

    .. code:: python

        [{"path": "/dev/nvidia0", "major": 195, "minor": 0, "mode": "crw-rw-rw-"},
         {"path": "/dev/nvidia-uvm", "major": 510, "minor": 0, "mode": "crw-rw-rw-"}]
    """

    @override
    def command(self) -> str:
        return f"stat -c '{_STAT_FORMAT}' /dev/nvidia* /dev/nvidia-caps/* 2>/dev/null || true"

    @staticmethod
    @override
    def default() -> list[DeviceNode]:
        return []

    @override
    def process(self, output: list[str]) -> list[DeviceNode]:
        return parse_device_nodes(output)


UVM_DISABLE_HMM_PATH = "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"


def parse_bool_param(lines: list[str]) -> bool | None:
    """A kernel bool module parameter as sysfs prints it (``Y``/``N``; ``1``/``0`` for ints)."""
    value = "".join(lines).strip()
    if value in ("Y", "y", "1"):
        return True
    if value in ("N", "n", "0"):
        return False
    return None


class UvmDisableHmm(FactBase[bool | None]):
    """
    Returns the running value of the ``nvidia_uvm`` module's ``uvm_disable_hmm`` parameter:
    ``True`` (``Y``: HMM disabled), ``False`` (``N``: HMM in use), or ``None`` when nvidia_uvm is
    not loaded or the driver is too old to have the parameter. The value is read-only at run
    time: changing it needs the module reloaded (see ``NvidiaGpuProcesses``).
    """

    @override
    def command(self) -> str:
        return f"cat {UVM_DISABLE_HMM_PATH} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> bool | None:
        return parse_bool_param(output)


class GpuProcess(TypedDict):
    pid: int
    name: str
    used_memory_mib: int | None
    devices: list[str]


def parse_gpu_processes(lines: list[str]) -> list[GpuProcess]:
    """
    Tagged lines of ``NvidiaGpuProcesses``' command: ``smi, PID, NAME, MIB`` from nvidia-smi's
    compute-apps query and ``dev, PID, DEVICE, COMM`` from fuser; merged by PID.
    """
    by_pid: dict[int, GpuProcess] = {}

    def get(pid: int, name: str) -> GpuProcess:
        if pid not in by_pid:
            by_pid[pid] = GpuProcess(pid=pid, name=name, used_memory_mib=None, devices=[])
        elif name and not by_pid[pid]["name"]:
            by_pid[pid]["name"] = name
        return by_pid[pid]

    for line in lines:
        tag, _, rest = line.partition(",")
        tag = tag.strip()
        if tag == "smi":
            pid_s, _, rest = rest.partition(",")
            name, _, memory = rest.rpartition(",")
            pid_s, name, memory = pid_s.strip(), name.strip(), memory.strip()
            if not pid_s.isdigit():
                continue
            process = get(int(pid_s), name)
            process["name"] = name or process["name"]
            try:
                process["used_memory_mib"] = int(memory.split()[0])
            except (ValueError, IndexError):  # "[N/A]" (MIG, or no permission)
                pass
        elif tag == "dev":
            parts = [part.strip() for part in rest.split(",", 2)]
            if len(parts) < 2:
                continue
            pid_s = re.sub(r"\D", "", parts[0])  # fuser may append access letters (1234m)
            if not pid_s:
                continue
            process = get(int(pid_s), parts[2] if len(parts) > 2 else "")
            if parts[1] not in process["devices"]:
                process["devices"].append(parts[1])
    return sorted(by_pid.values(), key=lambda process: process["pid"])


class NvidiaGpuProcesses(FactBase[list[GpuProcess]]):
    """
    Returns the processes that use the GPUs: the compute apps that ``nvidia-smi`` lists (with
    their GPU memory in MiB) merged with every process that holds a ``/dev/nvidia*`` node open
    (from ``fuser``, which also finds nvidia-persistenced and processes in containers). Check it is
    empty before reloading ``nvidia_uvm``; ``[]`` when nothing uses the GPUs or no tool is there.

    .. code:: python

        [{"pid": 4242, "name": "python3", "used_memory_mib": 80123,
          "devices": ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"]}]
    """

    @override
    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null 2>&1; then "
            "nvidia-smi --query-compute-apps=pid,process_name,used_memory "
            "--format=csv,noheader,nounits 2>/dev/null | sed -n 's/^ *[0-9]/smi, &/p'; "
            "fi; "
            "if command -v fuser >/dev/null 2>&1; then "
            "for f in /dev/nvidia* /dev/nvidia-caps/*; do "
            '[ -c "$f" ] || continue; '
            'for p in $(fuser "$f" 2>/dev/null); do '
            'p=$(echo "$p" | tr -cd 0-9); '
            '[ -n "$p" ] && echo "dev, $p, $f, $(cat /proc/$p/comm 2>/dev/null)"; '
            "done; "
            "done; "
            "fi; true"
        )

    @staticmethod
    @override
    def default() -> list[GpuProcess]:
        return []

    @override
    def process(self, output: list[str]) -> list[GpuProcess]:
        return parse_gpu_processes(output)


class NvidiaTopoMatrix(FactBase["dict | None"]):
    """
    Returns ``nvidia-smi topo -m`` parsed: ``{"gpus": [0, 1], "matrix": [["X", "NV18"], ["NV18",
    "X"]], "affinity": {"0": {"CPU Affinity": ..., "NUMA Affinity": ...}}, "nics": {...}}``, where
    ``matrix[i][j]`` is the link between ``gpus[i]`` and ``gpus[j]`` (``X``, ``NV#``, ``PIX``,
    ``PXB``, ``PHB``, ``NODE``, ``SYS``). ``None`` without nvidia-smi or GPUs.
    """

    @override
    def command(self) -> str:
        return "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi topo -m || true; fi"

    @override
    def process(self, output: list[str]) -> dict | None:
        parsed = parse_topo_matrix("\n".join(output))
        return parsed if parsed["gpus"] else None


_P2P_MODES = {"r", "w", "n", "a", "p"}


class NvidiaP2pMatrix(FactBase["dict | None"]):
    """
    Returns ``nvidia-smi topo -p2p MODE`` parsed (MODE ``r`` read, ``w`` write, ``n`` NVLink,
    ``a`` atomics, ``p`` prop): ``{"gpus": [0, 1], "matrix": [["X", "OK"], ["OK", "X"]]}`` with the
    driver's status per pair (``OK``, ``CNS`` chipset / ``GNS`` GPU / ``TNS`` topology not
    supported, ``NS``, ``U``). ``None`` without nvidia-smi or GPUs.
    """

    @override
    def command(self, mode: str = "r") -> str:
        if mode not in _P2P_MODES:
            raise ValueError(f"nvidia-smi topo -p2p takes one of {sorted(_P2P_MODES)}, not {mode!r}")
        return (
            "if command -v nvidia-smi >/dev/null 2>&1; then "
            f"nvidia-smi topo -p2p {mode} || true; fi"
        )

    @override
    def process(self, output: list[str]) -> dict | None:
        parsed = parse_p2p_matrix("\n".join(output))
        return parsed if parsed["gpus"] else None


_CHECKS = {"cuda", "p2p"}


def parse_gpu_check(lines: list[str]) -> dict:
    """The last JSON object line that gpu_checks.py printed; else the output as an error."""
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    return {"ok": False, "error": "gpu_checks.py printed no JSON: " + " | ".join(lines[-20:])}


class GpuCheck(FactBase[dict]):
    """
    Runs ``PYTHON SCRIPT CHECK ARGS...`` (SCRIPT: ``remote/gpu_checks.py`` uploaded to the host,
    PYTHON: one that holds torch) under ``timeout TIMEOUT`` and returns the JSON it prints:
    for ``cuda`` the device list and CUDA init result, for ``p2p`` per-pair peer access and copy
    GB/s. A check that fails still answers (``ok`` false, ``error``, ``hint``); nothing printed
    becomes ``{"ok": False, "error": ...}``. Not cached: it measures, so call it at execute time
    (``python.call``), after the script is uploaded.
    """

    @override
    def command(
        self,
        python: str,
        script: str,
        check: str = "p2p",
        args: tuple[str, ...] | list[str] = (),
        timeout: int = 600,
    ) -> StringCommand:
        if check not in _CHECKS:
            raise ValueError(f"gpu_checks.py has no check {check!r}: {sorted(_CHECKS)}")
        run = StringCommand(QuoteString(python), QuoteString(script), check,
                            *(QuoteString(str(arg)) for arg in args), "2>&1;")
        return StringCommand("if command -v timeout >/dev/null 2>&1; then timeout",
                             str(int(timeout)), run, "else", run, "fi; true")

    @staticmethod
    @override
    def default() -> dict:
        return {"ok": False, "error": "gpu_checks.py printed nothing"}

    @override
    def process(self, output: list[str]) -> dict:
        return parse_gpu_check(output)
