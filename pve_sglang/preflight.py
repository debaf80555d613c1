"""Checks on a GPU host before anything changes: driver, GPUs, virtualisation, ACS; and each
of its containers against it (GPUs, TP, CUDA, the server's files as they will be rendered).

Problems that would break the deploy raise PreflightError (``runtime/errors.py``) at prepare
time, so no host is changed; problems that only cost speed are warnings. What the checks use
has its own home: the GPU selection (``gpu/passthrough.py``), a container's stack
(``stack/identity.py``), the server's files (``server/render.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import gevent.lock
from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.facts.server import Command, Which

from pve_sglang.runtime.cache import Kind, memo
from pve_sglang.runtime.errors import PreflightError
from pve_sglang.facts.nvidia import (
    CharDeviceMajors,
    NvidiaDeviceNodes,
    GpuMinor,
    NvidiaDriverVersion,
    NvidiaGpuMinors,
    NvidiaGpus,
)
from pve_sglang.facts.pve import PveContainerVersion
from pve_sglang.facts.system import CgroupVersion, IommuAcs, VirtualMachineType
from pve_sglang.gpu.passthrough import (
    device_minors,
    pve_dev_entries,
    raw_lxc_lines,
    select_gpus,
    select_nodes,
)
from pve_sglang.pve_releases import (
    CGROUP_V1_WARNED_FROM,
    DEVN_FROM,
    MOUNT_ATTRIBUTES_BROKEN,
    VERSION_COMMAND,
    answer_problem,
    has_devn,
    mount_attributes_broken,
)
from pve_sglang.server.render import ServerFiles, server_files
from pve_sglang.config.settings import (
    HostSettings, LxcView, ServerView, StackView, tensor_parallel_size,
)
from pve_sglang.stack.cuda_driver import driver_problem, limited_features
from pve_sglang.stack.releases import ReleaseError, read_release

# Created at boot by the nvidia-uvm-devices unit this deploy installs, before containers start.
UVM_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass
class GpuHost:
    """What the host's driver and kernel say, as the passthrough and the container need it."""

    driver_version: str
    gpus: list[dict]
    majors: dict[str, int]
    nodes: list[str]
    cgroup: str
    native_dev: bool
    compute_caps: list[str] = field(default_factory=list)
    #: The host's pve-container version (None: plain LXC, or not installed).
    pve_container: str | None = None
    #: nvidia-smi's GPUs with their device minors (the ``NvidiaGpuMinors`` fact).
    minors: list[GpuMinor] = field(default_factory=list)

    def indices(self, wanted: str | list[int], where: str) -> list[int]:
        """The GPU indices a container gets; an index the host lacks is an error."""
        return [gpu["index"] for gpu in select_gpus(wanted, self.gpus, where)]

    def device_minors(self, indices: list[int], where: str) -> list[int]:
        """The device minors of GPUs INDICES (nvidia-smi's): the nodes passed are theirs,
        ``/dev/nvidia{minor}``, each present on the host with the shared ones; else a
        PreflightError naming WHERE."""
        try:
            minors = device_minors(indices, self.minors)
        except ValueError as error:
            raise PreflightError(f"{where}: {error}; nothing was changed") from None
        _passed(where, indices, minors, select_nodes, minors, self.nodes)
        return minors

    def label(self, indices: list[int], where: str) -> str:
        """The GPUs as the plan names them, index and node: ``GPU 0 = /dev/nvidia2``."""
        return _label(indices, self.device_minors(indices, where))

    def dev_entries(self, indices: list[int], where: str) -> list[str]:
        """Proxmox ``devN`` values for these GPUs (keys are chosen against the live config)."""
        minors = self.device_minors(indices, where)
        return list(_passed(where, indices, minors, pve_dev_entries, minors, self.nodes,
                            mode="0666").values())

    def raw_lines(self, indices: list[int], style: str, where: str) -> list[str]:
        """Raw ``lxc.*`` passthrough lines for these GPUs, in the host's cgroup version; on
        Proxmox (``style="pve"``) always ``lxc.cgroup2.*``: v1 keys are gone in Proxmox VE 9
        and warned about from pve-container ``CGROUP_V1_WARNED_FROM`` (``gpu_host`` refuses a v1
        Proxmox host)."""
        cgroup = "v2" if self.cgroup == "v2" or style == "pve" else "v1"
        minors = self.device_minors(indices, where)
        return _passed(where, indices, minors, raw_lxc_lines, minors, self.majors, self.nodes,
                       style=style, cgroup=cgroup)


def _label(indices: list[int], minors: list[int]) -> str:
    return ", ".join(f"GPU {index} = /dev/nvidia{minor}"
                     for index, minor in zip(indices, minors)) or "no GPU"


def _passed(where: str, indices: list[int], minors: list[int], build, *args, **kwargs):
    """BUILD(*ARGS, **KWARGS) of the passthrough, its ValueError (a node or a major the host
    lacks) a PreflightError naming WHERE and the GPUs."""
    try:
        return build(*args, **kwargs)
    except ValueError as error:
        raise PreflightError(f"{where}: GPU passthrough of {_label(indices, minors)}: {error}; "
                             "nothing was changed") from None


def check_container_tools(host: Host, settings: HostSettings) -> None:
    """The host must have the container tools of its platform, and the deploy must be root."""
    tool = "pct" if settings.platform == "pve" else "lxc-start"
    if not host.get_fact(Which, command=tool):
        hint = (
            "is this a Proxmox VE host? set platform: lxc for a plain LXC host"
            if settings.platform == "pve"
            else "install them as root: apt-get install lxc debootstrap"
        )
        raise PreflightError(f"host {host.name}: {tool} not found ({hint}); nothing was changed")
    if host.get_fact(Command, command="id -u").strip() != "0":
        raise PreflightError(
            f"host {host.name}: containers are managed as root: connect as root "
            "(ssh_user: root) or run pyinfra as root for the local host"
        )


def driver_and_gpus(host: Host) -> tuple[str | None, list[dict]]:
    """HOST's NVIDIA driver version and GPUs (none without a driver), read once per run: the
    host phase's preflight asks, and every container of the host, in its container and verify
    phases (the host phase installs no driver)."""
    known = memo(Kind.DRIVER_AND_GPUS, of=host)
    # pyinfra prepares hosts in parallel greenlets: the host and its containers ask at once.
    with known.setdefault("lock", gevent.lock.BoundedSemaphore()):
        if "facts" not in known:
            driver = host.get_fact(NvidiaDriverVersion)
            known["facts"] = (driver, host.get_fact(NvidiaGpus) if driver else [])
    return known["facts"]


def gpu_host(host: Host, settings: HostSettings) -> GpuHost | None:
    """Read the host's GPU facts; None when it has no driver and ``require_gpu`` is off."""
    driver, gpus = driver_and_gpus(host)
    if driver is None:
        if settings.require_gpu:
            raise PreflightError(
                f"host {host.name}: no NVIDIA driver loaded (/proc/driver/nvidia/version is "
                "missing). Install the driver on the host and reboot, then run again; nothing "
                "was changed."
            )
        logger.warning(
            f"{host.name}: no NVIDIA driver: skipping the driver, nvidia_uvm and GPU "
            "passthrough steps (require_gpu: false)"
        )
        return None
    if not gpus:
        raise PreflightError(
            f"host {host.name}: driver {driver} is loaded but nvidia-smi lists no GPU; check "
            "`nvidia-smi` on the host"
        )
    versions = {gpu["driver_version"] for gpu in gpus} - {driver}
    if versions:
        raise PreflightError(
            f"host {host.name}: kernel module {driver} but nvidia-smi reports {versions}: "
            "reboot the host after the driver upgrade"
        )
    nodes = sorted({node["path"] for node in host.get_fact(NvidiaDeviceNodes)} | set(UVM_NODES))
    pve_container = pve_container_of(host) if settings.platform == "pve" else None
    if settings.platform == "pve" and pve_container is None:
        raise PreflightError(f"{unread_pve_container(host.name)}. Its version decides how "
                             f"the GPUs are passed (devN entries from {DEVN_FROM}, raw lxc "
                             "lines before) and whether adding one restarts the container, so "
                             "the deploy does not guess; nothing was changed")
    native = has_devn(pve_container, settings.pve_container_native_dev_min)
    cgroup = host.get_fact(CgroupVersion) or "v2"
    if settings.platform == "pve" and not native and cgroup != "v2":
        raise PreflightError(
            f"host {host.name}: pve-container {pve_container or '(not installed)'} passes GPUs "
            f"as raw lxc lines (devN from {settings.pve_container_native_dev_min}), and this "
            f"host's cgroup is {cgroup!r}: its devices controller is v1, where LXC ignores the "
            "lxc.cgroup2.* rules, and the deploy writes no lxc.cgroup.* (v1) key on Proxmox "
            f"(gone in Proxmox VE 9, deprecated from pve-container {CGROUP_V1_WARNED_FROM}). Boot "
            "with the unified cgroup hierarchy (drop systemd.unified_cgroup_hierarchy=0 from the "
            f"kernel command line) or update pve-container to {DEVN_FROM} or later (Proxmox VE "
            "8.1+); nothing was changed"
        )
    _warn_about_p2p(host, len(gpus))
    return GpuHost(
        driver_version=driver,
        gpus=gpus,
        majors=host.get_fact(CharDeviceMajors),
        nodes=nodes,
        cgroup=cgroup,
        native_dev=native,
        compute_caps=sorted({gpu["compute_cap"] for gpu in gpus}),
        pve_container=pve_container,
        minors=host.get_fact(NvidiaGpuMinors),
    )


def pve_container_of(host: Host) -> str | None:
    """HOST's pve-container version (the ``PveContainerVersion`` fact), one the rules can
    compare; None when dpkg-query names no installed package. Any other answer (one no rule
    can compare, several lines) is refused, naming the host and the command: a guess would
    pick the wrong rule."""
    version = host.get_fact(PveContainerVersion)
    problem = answer_problem(version) if version is not None else None
    if problem:
        raise PreflightError(f"host {host.name}: `{VERSION_COMMAND}` answered pve-container "
                             f"version {version!r}: {problem}; nothing was changed")
    return version


def unread_pve_container(host_name: str) -> str:
    """What to say when a host with pct names no installed pve-container (an empty or
    unreadable dpkg-query answer)."""
    return (f"host {host_name}: pct is here, but `{VERSION_COMMAND}` names no installed "
            "pve-container (dpkg's database locked or damaged, or the package half-installed "
            "by an interrupted upgrade; see `dpkg -s pve-container` and `dpkg --audit` on the "
            "host, `dpkg --configure -a` finishes an interrupted upgrade)")


def bind_mount_sources(values: list[str]) -> list[str]:
    """The host paths of the bind mounts among ``mpN`` values (``/tank/models,mp=/models``):
    a source that is a path, not a storage volume (``local-lvm:vm-105-disk-1``)."""
    return [value.split(",", 1)[0] for value in values if value.split(",", 1)[0].startswith("/")]


def mount_attributes_warning(where: str, pve_container: str | None, bind_mounts: list[str]) -> str | None:
    """The warning for bind mounts on a pve-container whose mount points take the owner and
    mode of the directory in the container (6.0.19, 6.1.0), or None. Nothing is refused: a
    mount over a directory that does not exist yet, or that root owns, starts as before."""
    if not bind_mounts or not mount_attributes_broken(pve_container):
        return None
    low, fixed = MOUNT_ATTRIBUTES_BROKEN
    return (
        f"{where}: pve-container {pve_container} (from {low}) gives a mount point the owner and "
        "mode of the directory already in the container; bind mounts may then fail to start or "
        f"be unreadable ({', '.join(bind_mounts)}). Fixed for the root disk in 6.1.0 and for "
        f"bind mounts in {fixed}: update pve-container (apt full-upgrade) before the container "
        "next starts"
    )


def _warn_about_p2p(host: Host, gpu_count: int) -> None:
    vm = host.get_fact(VirtualMachineType)
    if vm and vm != "none":
        logger.warning(
            f"{host.name}: this host is a virtual machine ({vm}): GPUs passed through VFIO lose "
            "the PCIe topology, and P2P between them falls back or hangs. Run on the bare-metal "
            "Proxmox host (LXC sees the real topology)."
        )
    if gpu_count < 2:
        return
    acs = host.get_fact(IommuAcs)
    if acs and acs.get("src_valid") and not acs.get("iommu_passthrough"):
        logger.warning(
            f"{host.name}: ACS source validation is on for {len(acs['src_valid'])} PCIe bridges "
            "and the IOMMU is not in passthrough mode: P2P traffic may be routed through the "
            "root complex (slow or hanging). Consider iommu=pt on the kernel command line or "
            "clearing ACS; NCCL_P2P_DISABLE=1 only as a last resort."
        )


# Blackwell (compute capability 10.x and 12.x) needs torch built for CUDA 12.8 or later.
_CUDA_BUILD = re.compile(r"/cu(\d{2})(\d)\b")


def _check_torch_build(where: str, stack: StackView, caps: list[str]) -> None:
    """A torch index for a CUDA build older than 12.8 cannot drive Blackwell GPUs."""
    match = _CUDA_BUILD.search(stack.torch_index_url or "")
    # nvidia-smi prints "[N/A]" where it cannot tell: such a GPU is not known to be Blackwell.
    blackwell = [cap for cap in caps if re.match(r"(\d+)\.", cap) and int(cap.split(".")[0]) >= 10]
    if match and blackwell and (int(match.group(1)), int(match.group(2))) < (12, 8):
        raise PreflightError(
            f"{where}: field 'torch_index_url' = {stack.torch_index_url!r} serves CUDA "
            f"{match.group(1)}.{match.group(2)} builds, but the GPUs have compute capability "
            f"{', '.join(blackwell)} (Blackwell): allowed: a CUDA 12.8+ index (cu128, cu129, "
            "cu130), or null for torch's PyPI build"
        )


def _check_cuda_driver(where: str, stack: StackView, driver: str) -> None:
    """The pinned set's CUDA (its release's cuda-python) against the host's driver."""
    if stack.stack_install != "pinned":
        return  # the set is not ours to judge: sglang alone, its CUDA from elsewhere
    try:
        release = read_release(stack.sglang_version, stack.pip_index_url)
    except ReleaseError as error:
        raise PreflightError(f"{where}: field 'sglang_version': {error}") from None
    words = (f"sglang {stack.sglang_version} (torch {stack.torch_version}, CUDA "
             f"{release.cuda_text})")
    problem = driver_problem(release.cuda, driver, words)
    if problem:
        raise PreflightError(f"{where}: {problem}; nothing was changed")
    note = limited_features(release.cuda, driver)
    if note:
        logger.warning(f"{where}: {note}")


def check_container(where: str, lxc: LxcView, server: ServerView, stack: StackView,
                    gpu: GpuHost | None) -> list[int]:
    """The container's GPU indices (LXC's ``gpus``), after checking them against the host, and
    the SERVER's TP and MoE backend and the STACK's build against the host's GPUs and driver."""
    if gpu is None:
        return []
    indices = gpu.indices(lxc.gpus, where)
    gpu.device_minors(indices, where)  # each GPU's node known and present, before any change
    try:
        tensor_parallel_size(server.tp_size, len(indices), len(server.nodes))
    except ValueError as error:
        raise PreflightError(f"{where}: {error}") from None
    _check_torch_build(where, stack, gpu.compute_caps)
    _check_cuda_driver(where, stack, gpu.driver_version)
    if any(cap.startswith("12.") for cap in gpu.compute_caps):
        if server.moe_runner_backend == "flashinfer_cutlass":
            logger.warning(
                f"{where}: SM120 GPUs (compute capability 12.x): FlashInfer's CUTLASS MoE "
                "autotune has printed failed tactics or illegal instructions there (flashinfer "
                "issues 2077, 3558, 4049); watch the first start's log"
            )
    return indices


def check_server_files(
    where: str, name: str, server: ServerView, gpus: list[dict], inventory: Inventory
) -> ServerFiles:
    """``server_files``, with a render error as a PreflightError naming WHERE."""
    try:
        return server_files(name, server, gpus, inventory)
    except ValueError as error:
        raise PreflightError(f"{where}: the server's command line, unit or env file: {error}") from None
