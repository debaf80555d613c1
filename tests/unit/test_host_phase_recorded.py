"""The whole host phase on recorded outputs: a real GPU host's driver, GPUs and device nodes
(captured on an H200 machine, tests/fixtures/h200) and Proxmox's pct/pveam answers (recorded
from public sources, tests/fixtures/public). No Proxmox host exists here; pyinfra's real API
plans the deploy on ``@fake`` hosts that answer with those outputs. The CUDA 13 set on the
recorded driver, its lock made for real: tests/network/test_host_phase_cuda_13.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Which

from harness import plan_deploy
from pve_sglang.facts.nvidia import (
    CharDeviceMajors,
    NvidiaDeviceNodes,
    NvidiaDriverVersion,
    NvidiaGpuMinors,
    NvidiaGpuProcesses,
    NvidiaGpus,
    UvmDisableHmm,
)
from pve_sglang.facts.pve import PctConfig, PctPending, PctStatus, PveamTemplates, PveContainerVersion
from pve_sglang.facts.system import CgroupVersion, DebianArchitecture, IommuAcs, VirtualMachineType
from pve_sglang.preflight import PreflightError
from pve_sglang.project import load_defaults
from tasks.host import host_phase

FIXTURES = Path(__file__).parents[1] / "fixtures"
H200 = FIXTURES / "h200" / "raw_idle"
PUBLIC = FIXTURES / "public"
# The H200 machine's nodes in passthrough order: the GPU, then ctl, uvm, uvm-tools, caps.
DEVICES_ALL = ["/dev/nvidia0,mode=0666", "/dev/nvidiactl,mode=0666", "/dev/nvidia-uvm,mode=0666",
               "/dev/nvidia-uvm-tools,mode=0666", "/dev/nvidia-caps/nvidia-cap1,mode=0666",
               "/dev/nvidia-caps/nvidia-cap2,mode=0666"]

# The raw passthrough lines for the H200 machine's recorded majors (195, nvidia-uvm 238,
# nvidia-caps 241) and nodes, in Proxmox's style.
NVIDIA_PVE = [
    "lxc.cgroup2.devices.allow: c 195:0 rwm",
    "lxc.cgroup2.devices.allow: c 195:255 rwm",
    "lxc.cgroup2.devices.allow: c 238:* rwm",
    "lxc.cgroup2.devices.allow: c 241:* rwm",
    "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
]


def h200(fact: str) -> str:
    return (H200 / f"fact_{fact}.txt").read_text()


def h200_minors() -> str:
    """The ``NvidiaGpuMinors`` answer of the H200 machine, constructed: its recorded bus id
    (``fact_NvidiaGpus``) and UUID (``run3``), minor 0, in the driver's information layout."""
    return (FIXTURES / "synthetic" / "h200_fact_NvidiaGpuMinors.txt").read_text()


def gpu_host_responses(pve_container: str = "installed 5.2.3") -> dict:
    """Recorded answers of a GPU host (the H200 machine) and its Proxmox tools."""
    return {
        NvidiaDriverVersion().command(): h200("NvidiaDriverVersion"),
        NvidiaGpus().command(): h200("NvidiaGpus"),
        # Constructed for the H200 machine (its bus id and UUID as recorded, the driver's layout):
        # not recorded there (tests/fixtures/README.md).
        NvidiaGpuMinors().command(): h200_minors(),
        CharDeviceMajors().command(): h200("CharDeviceMajors"),
        NvidiaDeviceNodes().command(): h200("NvidiaDeviceNodes"),
        UvmDisableHmm().command(): "Y",
        NvidiaGpuProcesses().command(): "",
        IommuAcs().command(): h200("IommuAcs"),
        CgroupVersion().command(): "cgroup2fs",  # Proxmox VE 7+ is pure cgroup2
        VirtualMachineType().command(): "none",
        PveContainerVersion().command(): pve_container,
        # The template's architecture: dpkg as recorded on this machine (dev-docker).
        DebianArchitecture().command():
            (FIXTURES / "dev-docker" / "dpkg_print_architecture.txt").read_text(),
        PveamTemplates().command("local").get_raw_value(): (PUBLIC / "pve_pveam_list_local_notes-ru.txt").read_text(),
        Which().command("pct").get_raw_value(): "/usr/sbin/pct",
        "id -u": "0",
    }


def container_answers(config: str | None, status: str | None, pending: str = "") -> dict:
    missing = (PUBLIC / "pve_pct_missing_ct_pve-nas-issue6.txt").read_text()
    return {
        PctConfig().command(105): config if config is not None else missing,
        PctStatus().command(105): f"status: {status}" if status else missing,
        # pct pending prints every key, "cur" where nothing waits (tests/fixtures/pve/README.md).
        PctPending().command(105): (pending or "".join(f"cur {line}\n" for line in
                                                        (config or "").splitlines()))
        if config is not None else missing,
    }


def plan(responses: dict, host_fields: dict | None = None, **container: object) -> dict:
    # The @fake connector answers the first key contained in a command: the longer commands of
    # the pct facts (which contain "command -v pct") go first.
    responses = dict(sorted(responses.items(), key=lambda item: -len(str(item[0]))))
    defaults = load_defaults()
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve",
          "hostname": "glm5", "cores": 64, "memory_mib": 524288, **container}
    return plan_deploy(
        host_phase,
        hosts=[("pve1", {**defaults, "containers": ["@fake/ct105"], **(host_fields or {})}),
               ("ct105", ct)],
        responses=responses,
        groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"]},
    )["pve1"]


def commands(ops: list, needle: str) -> list[str]:
    return [c for _, cmds in ops for c in cmds if needle in c]


def converged_config(devices: list[str]) -> str:
    lines = ["arch: amd64", "cores: 64", "features: nesting=1", "hostname: glm5", "memory: 524288",
             "net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:32:0C:59,ip=dhcp,type=veth",
             "onboot: 1", "ostype: debian", "rootfs: local-lvm:vm-105-disk-0,size=200G",
             "swap: 0", "unprivileged: 1",
             # The host's wheel store, read-only (the container installs the locked set from it).
             "mp0: /var/cache/pve-sglang/wheels,mp=/var/cache/pve-sglang/wheels,ro=1"]
    lines += [f"dev{i}: {d}" for i, d in enumerate(devices)]
    return "\n".join(sorted(lines)) + "\n"


def test_new_container_is_created_given_gpus_as_devn_and_started_once():
    ops = plan({**gpu_host_responses(), **container_answers(None, None)})
    [create] = commands(ops, "pct create 105")
    assert "--unprivileged 1" in create and "--rootfs local-lvm:200" in create
    assert "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst" in create
    [dev_set] = commands(ops, "--dev0 ")
    for index, device in enumerate(DEVICES_ALL):
        assert f"--dev{index} {device}" in dev_set
    assert commands(ops, "pct start 105") == ["pct start 105"]
    assert commands(ops, "pct reboot") == []


def test_converged_host_and_container_plan_no_pct_command():
    responses = {**gpu_host_responses(),
                 **container_answers(converged_config(DEVICES_ALL), "running")}
    ops = plan(responses)
    assert commands(ops, "pct ") == []
    # ...because every container operation was planned and found nothing to do (a plan with
    # none of them would pass the line above too).
    container_ops = [(name.rsplit(" | ", 1)[-1], cmds) for name, cmds in ops if "ontainer" in name]
    assert container_ops == [
        ("Container template debian-12-standard", []),
        ("Create container 105", []),
        ("Container 105 size and network", []),
        ("Container 105 disk size", []),
        ("Container 105 features and mounts", []),
        ("Container 105 GPU 0 = /dev/nvidia0 (devN: unchanged)", []),
        ("Container 105 running", []),
    ]


def test_pct_config_is_read_once_per_container_until_an_operation_changes_it(monkeypatch):
    reads = []
    process = PctConfig.process
    monkeypatch.setattr(PctConfig, "process", lambda self, output: reads.append(1) or process(self, output))
    converged = {**gpu_host_responses(), **container_answers(converged_config(DEVICES_ALL), "running")}
    plan(converged)
    # The preflight of the host phase and pct.config (twice) and pct.rootfs_size: one read.
    assert len(reads) == 1
    reads.clear()
    plan(converged, cores=96)
    # `pct set` changed the config: the operations after it read it again (once).
    assert len(reads) == 2


def test_gpu_subset_changed_on_running_container_restarts_exactly_once():
    two_gpus = ["/dev/nvidia1,mode=0666", *DEVICES_ALL]
    responses = {**gpu_host_responses(),
                 **container_answers(converged_config(two_gpus), "running")}
    ops = plan(responses)
    assert commands(ops, "pct set 105") == ["pct set 105 --delete dev0"]
    assert commands(ops, "pct reboot 105") == ["pct reboot 105"]


def test_cores_changed_on_running_container_is_set_live_without_restart():
    responses = {**gpu_host_responses(),
                 **container_answers(converged_config(DEVICES_ALL), "running")}
    ops = plan(responses, cores=96)
    assert commands(ops, "pct set 105") == ["pct set 105 --cores 96"]
    assert commands(ops, "pct reboot") == []


def test_old_pve_container_gets_raw_lines_with_recorded_majors():
    responses = {**gpu_host_responses("installed 4.4-6"), **container_answers(None, None),
                 FileContents().command(path="/etc/pve/lxc/105.conf").get_raw_value(): "arch: amd64\n"}
    ops = plan(responses)
    assert commands(ops, "--dev0") == []
    [upload] = commands(ops, "upload /etc/pve/lxc/105.conf")
    # Majors as the H200 machine's /proc/devices has them: 195, nvidia-uvm 238, nvidia-caps 241.
    assert upload.splitlines()[1:] == ["arch: amd64", *NVIDIA_PVE]


def test_hmm_on_in_running_module_warns_without_reload(caplog):
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 UvmDisableHmm().command(): h200("UvmDisableHmm")}  # the H200 machine: N
    ops = plan(responses)
    assert commands(ops, "modprobe -r nvidia_uvm") == []
    assert "uvm_disable_hmm is N in the running nvidia_uvm" in caplog.text


def test_hmm_reload_when_allowed_and_idle():
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 UvmDisableHmm().command(): "N"}
    defaults = load_defaults()
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve"}
    ops = plan_deploy(
        host_phase,
        hosts=[("pve1", {**defaults, "reload_modules": True, "containers": ["@fake/ct105"]}),
               ("ct105", ct)],
        responses=responses,
        groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"]},
    )["pve1"]
    assert len(commands(ops, "modprobe -r nvidia_uvm")) == 1


def test_driver_missing_stops_before_any_change():
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 NvidiaDriverVersion().command(): ""}
    with pytest.raises(PreflightError, match="no NVIDIA driver loaded.*nothing was changed"):
        plan(responses)


def test_gpu_index_not_on_host_names_field_and_allowed_values():
    with pytest.raises(PreflightError, match=r"field 'gpus' = \[0, 3\].*allowed: 'all' or a subset of \[0\]"):
        plan({**gpu_host_responses(), **container_answers(None, None)}, gpus=[0, 3])


def test_tp_larger_than_host_gpus_stops():
    with pytest.raises(PreflightError, match=r"host @fake/pve1, container @fake/ct105: tp_size 8 "
                       r"is larger than the 1 GPUs passed through .*allowed: 1\.\.1"):
        plan({**gpu_host_responses(), **container_answers(None, None)}, tp_size=8)


def test_vm_host_warns_about_p2p(caplog):
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 VirtualMachineType().command(): "kvm"}
    plan(responses)
    assert "this host is a virtual machine (kvm)" in caplog.text


def test_old_cuda_torch_index_on_blackwell_is_refused():
    # An nvidia-smi line in the recorded H200 layout, with a Blackwell GPU's values (no such
    # GPU here to record from).
    blackwell = "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 00000000:01:00.0, 12.0, 97887, 580.159.04"
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 NvidiaGpus().command(): blackwell}
    with pytest.raises(PreflightError, match="torch_index_url.*CUDA 12.6 builds.*12.0.*cu128"):
        plan(responses, torch_index_url="https://download.pytorch.org/whl/cu126")
    # A lock of the set is given: with another index the deploy would make one (network).
    from pve_sglang.stack.lock import SHIPPED, default_key
    lock = SHIPPED / default_key().name
    plan(responses, torch_index_url="https://download.pytorch.org/whl/cu128", stack_lock=str(lock))


# --- preflight renders the container phase's files: --dry tells what a run would ------------

EXISTING = {"config": converged_config(DEVICES_ALL), "status": "running"}
NEW = {"config": None, "status": None}


@pytest.mark.parametrize("container", [NEW, EXISTING], ids=["new container", "existing container"])
def test_server_files_render_error_stops_the_host_phase_before_any_change(container):
    """A value only rendering the unit can refuse (a secret that is also a command-line value)
    stops the host phase at prepare time, for a container created in this run (whose container
    phase is deferred until it runs) as for an existing one; the secret is not in the message."""
    responses = {**gpu_host_responses(), **container_answers(container["config"], container["status"])}
    with pytest.raises(PreflightError) as error:
        plan(responses, hf_token="glm-5-token", served_model_name="glm-5-token")
    message = str(error.value)
    assert message.startswith("host @fake/pve1, container @fake/ct105: the server's command line")
    assert "holds a secret value" in message and "glm-5-token" not in message


@pytest.mark.parametrize("container", [NEW, EXISTING], ids=["new container", "existing container"])
def test_compute_capability_the_server_flags_cannot_read_stops_the_host_phase(container):
    """The recorded H200 line with its compute capability as nvidia-smi prints an unknown field
    ("[N/A]", a variation of the recording): with allreduce fusion on, the flags depend on it."""
    h200_na = h200("NvidiaGpus").replace(", 9.0, ", ", [N/A], ")
    responses = {**gpu_host_responses(), **container_answers(container["config"], container["status"]),
                 NvidiaGpus().command(): h200_na}
    with pytest.raises(PreflightError, match=r"container @fake/ct105: .*compute capability '\[N/A\]'"):
        plan(responses, enable_flashinfer_allreduce_fusion=True)
    plan(responses)  # without the flag nothing depends on it


def test_tp_counts_the_nodes_against_the_host_gpus():
    """One recorded H200 GPU per node: TP 2 over two nodes fits, TP 4 does not (one rule)."""
    responses = {**gpu_host_responses(), **container_answers(None, None)}
    nodes = ["@fake/ct105", "@fake/ct106"]
    ops = plan(responses, nodes=nodes, tp_size=2)
    assert commands(ops, "pct create 105")
    with pytest.raises(PreflightError, match=r"tp_size 4 is larger than the 2 GPUs passed through "
                       r"\(1 GPU\(s\) per node x 2 node\(s\)\); allowed: multiples of 2 up to 2"):
        plan(responses, nodes=nodes, tp_size=4)


def test_gpu_index_missing_is_refused_for_an_existing_container_too():
    responses = {**gpu_host_responses(), **container_answers(converged_config(DEVICES_ALL), "running")}
    with pytest.raises(PreflightError, match=r"container @fake/ct105: field 'gpus' = \[1\]: GPU \[1\] "
                       r"not on the host; allowed: 'all' or a subset of \[0\]"):
        plan(responses, gpus=[1])


def test_plain_lxc_unprivileged_container_gets_userns_before_recorded_h200_gpu_lines():
    """A plain LXC host (Debian, pure cgroup2) with the H200 machine's driver and nodes: the
    new container's config maps ids from root's range, and the GPU rules come after LXC's
    userns.conf (which empties the device lists it follows)."""
    from pve_sglang.facts.lxc_host import CgroupLimits, LxcNetState, NetworkBridges, RootSubIds
    from pve_sglang.facts.pve import LxcContainerStatus

    config = "/var/lib/lxc/glm5/config"
    responses = {**gpu_host_responses(),
                 Which().command("lxc-start").get_raw_value(): "/usr/bin/lxc-start",
                 LxcContainerStatus().command("glm5", "/var/lib/lxc").get_raw_value(): "",
                 CgroupLimits().command(): "cgroup2fs\ncpus: 96\nmemsw: no",
                 RootSubIds().command(): "uid root:100000:65536\ngid root:100000:65536",
                 NetworkBridges().command(): "lxcbr0",
                 LxcNetState().command(): "serving",
                 FileContents().command(path=config).get_raw_value(): ""}
    responses = dict(sorted(responses.items(), key=lambda item: -len(str(item[0]))))
    defaults = load_defaults()
    ct = {**defaults, "lxc_name": "glm5", "lxc_path": "/var/lib/lxc", "pve_host": "@fake/lxc1",
          "platform": "lxc", "net0": "name=eth0,bridge=lxcbr0,ip=dhcp", "cores": 64}
    ops = plan_deploy(
        host_phase,
        hosts=[("lxc1", {**defaults, "platform": "lxc", "containers": ["@fake/ct"]}), ("ct", ct)],
        responses=responses,
        groups={"pve_hosts": ["lxc1"], "gpu_containers": ["ct"]},
    )["lxc1"]
    [create] = [cmd for _, cmds in ops for cmd in cmds if "lxc-usernsexec -m b:0:100000:65536 -- tar" in cmd]
    uploads = [cmd for _, cmds in ops for cmd in cmds if cmd.startswith(f"upload {config}")]
    lines = [line for upload in uploads for line in upload.splitlines()[1:]]
    userns = lines.index("lxc.include = /usr/share/lxc/config/userns.conf")
    first_gpu = next(i for i, line in enumerate(lines) if "devices.allow" in line)
    assert userns < first_gpu
    assert "lxc.idmap = u 0 100000 65536" in lines
    assert "lxc.cgroup2.devices.allow = c 195:0 rwm" in lines  # recorded majors, key = value
    assert "lxc.cgroup2.cpuset.cpus = 0-63" in lines and "lxc.cgroup2.memory.max = 262144M" in lines


# --- the set's CUDA against the host's driver (issue 21) ------------------------------------

@pytest.mark.parametrize("driver, sglang, needed", [
    ("570.172.08", "0.5.23", "CUDA 13.x needs driver >= 580"),
    ("520.61.05", "0.5.9", "CUDA 12.x needs driver >= 525.60.13"),
])
def test_a_set_whose_cuda_needs_a_newer_driver_stops_before_any_change(driver, sglang, needed):
    """The recorded H200 answers with an older driver's version in their place (no such host
    to record from): preflight names the driver, the set and the way out."""
    responses = {**gpu_host_responses(), **container_answers(None, None),
                 NvidiaDriverVersion().command(): h200("NvidiaDriverVersion").replace("580.159.04", driver),
                 NvidiaGpus().command(): h200("NvidiaGpus").replace("580.159.04", driver)}
    with pytest.raises(PreflightError) as error:
        plan(responses, sglang_version=sglang)
    message = str(error.value)
    assert message.startswith(f"host @fake/pve1, container @fake/ct105: the NVIDIA driver {driver} "
                              f"cannot run sglang {sglang} (torch ")
    assert needed in message and "install driver" in message and "nothing was changed" in message


def test_initramfs_older_than_the_uvm_option_is_updated_again():
    """The option's file converged (unchanged) and an initramfs not rebuilt since it was
    written (an update-initramfs that failed, a run killed after the write): the plan updates
    it; with every image newer, nothing."""
    import hashlib

    from pyinfra.facts.files import Directory, File, Sha1File

    from pve_sglang.facts.system import InitramfsOlderThan
    from tasks.host import UVM_CONF

    body = (Path(__file__).resolve().parents[2] / "templates" / "nvidia-uvm.conf.j2").read_text()
    converged = {
        **gpu_host_responses(), **container_answers(None, None),
        Directory().command("/etc/modprobe.d").get_raw_value():
            "user=root group=root mode=drwxr-xr-x atime=0 mtime=0 ctime=0 size=4096 "
            "'/etc/modprobe.d'",
        File().command(UVM_CONF).get_raw_value(): f"user=root group=root mode=-rw-r--r-- atime=0 mtime=0 "
                                  f"ctime=0 size={len(body)} '{UVM_CONF}'",
        Sha1File().command(UVM_CONF).get_raw_value(): f"{hashlib.sha1(body.encode()).hexdigest()}  {UVM_CONF}",
    }
    stale = InitramfsOlderThan().command(UVM_CONF).get_raw_value()
    assert commands(plan({**converged, stale: "/boot/initrd.img-6.8.12-4-pve"}),
                    "update-initramfs") == ["update-initramfs -u -k all"]
    assert commands(plan({**converged, stale: ""}), "update-initramfs") == []
    # The option written in this run updates it without asking the images.
    assert commands(plan({**gpu_host_responses(), **container_answers(None, None)}),
                    "update-initramfs") == ["update-initramfs -u -k all"]


# --- each Proxmox VE release (tests/fixtures/pve: its pve-container version, recorded format) --

from pve_sglang.pve_releases import RELEASES, has_devn  # noqa: E402

PVE = FIXTURES / "pve"
RELEASE_NAMES = [r.name for r in RELEASES]


def release_responses(name: str) -> dict:
    """The H200 machine's answers on a Proxmox host of release NAME."""
    return gpu_host_responses((PVE / name / "dpkg_query_pve_container.txt").read_text())


def all_commands(ops: list) -> list[str]:
    return [c for _, cmds in ops for c in cmds]


@pytest.mark.parametrize("release", RELEASE_NAMES)
def test_new_container_on_each_release_recorded_format(release):
    """A new container planned on each release: devN from 8.1 (pve-container 5.0.7), raw
    lxc.cgroup2 lines before; never a v1 lxc.cgroup. key; --unprivileged always explicit; the
    template of the host's architecture."""
    responses = {**release_responses(release), **container_answers(None, None),
                 FileContents().command(path="/etc/pve/lxc/105.conf").get_raw_value(): "arch: amd64\n"}
    ops = plan(responses)
    [create] = commands(ops, "pct create 105")
    assert "--unprivileged 1" in create
    version = (PVE / release / "dpkg_query_pve_container.txt").read_text().split()[1]
    uploads = commands(ops, "upload /etc/pve/lxc/105.conf")
    if has_devn(version):
        assert commands(ops, "--dev0 /dev/nvidia0,mode=0666") and uploads == []
    else:
        assert commands(ops, "--dev0") == []
        [upload] = uploads
        assert upload.splitlines()[1:] == ["arch: amd64", *NVIDIA_PVE]
    assert not any("lxc.cgroup." in c for c in all_commands(ops))
    assert commands(ops, "pct start 105") == ["pct start 105"]
    assert commands(ops, "pct reboot") == []


@pytest.mark.parametrize("release", [r.name for r in RELEASES if has_devn(r.pve_container)])
def test_gpu_added_to_running_container_on_each_release_recorded_format(release, caplog):
    """A device the running container lacks (the second nvidia-caps node): pve-container
    6.0.4+ (Proxmox VE 9) hot-plugs it, no restart; before, one reboot; the plan says which."""
    version = (PVE / release / "dpkg_query_pve_container.txt").read_text().split()[1]
    responses = {**release_responses(release),
                 **container_answers(converged_config(DEVICES_ALL[:-1]), "running")}
    ops = plan(responses)
    assert commands(ops, "pct set 105") == [f"pct set 105 --dev5 {DEVICES_ALL[-1]}"]
    names = [name.rsplit(" | ", 1)[-1] for name, _ in ops]
    if release.startswith("9."):
        assert commands(ops, "pct reboot") == []
        assert (f"Container 105 GPU 0 = /dev/nvidia0 (devN: dev5 added: hot-plugged, no "
                f"restart (pve-container "
                f"{version} >= 6.0.4))") in names
        assert "will restart" not in caplog.text
    else:
        assert commands(ops, "pct reboot 105") == ["pct reboot 105"]
        assert (f"Container 105 GPU 0 = /dev/nvidia0 (devN: dev5 added: applied at a "
                f"restart (pve-container "
                f"{version} < 6.0.4 hot-plugs no device))") in names
        assert "container 105 (pct reboot) will restart because: Container 105 GPU 0 = " \
            "/dev/nvidia0 (devN: dev5" \
            in caplog.text


@pytest.mark.parametrize("release", ["9.0", "9.2"])
def test_gpu_removed_or_edited_restarts_once_even_with_hotplug_recorded_format(release):
    responses = {**release_responses(release),
                 **container_answers(converged_config(["/dev/nvidia1,mode=0666", *DEVICES_ALL]), "running")}
    ops = plan(responses)
    assert commands(ops, "pct set 105") == ["pct set 105 --delete dev0"]
    assert commands(ops, "pct reboot 105") == ["pct reboot 105"]
    edited = converged_config(DEVICES_ALL).replace("dev1: /dev/nvidiactl,mode=0666",
                                                   "dev1: /dev/nvidiactl,mode=0660")
    ops = plan({**release_responses(release), **container_answers(edited, "running")})
    assert commands(ops, "pct set 105") == ["pct set 105 --dev1 /dev/nvidiactl,mode=0666"]
    assert commands(ops, "pct reboot 105") == ["pct reboot 105"]


@pytest.mark.parametrize("release", ["8.2", "9.2"])
def test_gpu_swapped_for_another_names_both_keys_recorded_format(release):
    """The container had GPU 1, now gets GPU 0 (the H200 machine's only one): dev0's node is
    new (a key added) and /dev/nvidia1's key goes; the plan names both, and reboots once."""
    had = ["/dev/nvidia1,mode=0666", *DEVICES_ALL[1:]]
    ops = plan({**release_responses(release), **container_answers(converged_config(had), "running")})
    assert commands(ops, "pct set 105") == ["pct set 105 --dev6 /dev/nvidia0,mode=0666 --delete dev0"]
    names = [name.rsplit(" | ", 1)[-1] for name, _ in ops]
    assert ("Container 105 GPU 0 = /dev/nvidia0 (devN: dev6 added, dev0 removed: applied at a "
            "restart)") in names
    assert commands(ops, "pct reboot 105") == ["pct reboot 105"]


@pytest.mark.parametrize("status, reboots", [("running", True), ("stopped", False)])
def test_a_removal_left_pending_by_a_killed_run_is_finished_recorded_format(status, reboots, caplog):
    """A run killed between `pct set 105 --delete dev6` and `pct reboot`: pct config shows the
    GPU gone (as wanted), pct pending shows its deletion waiting. The next run reboots the
    running container once to apply it (issue 33, item 9); a stopped one applies it at start."""
    pending = (PVE / "9.2" / "pct_pending_105_gpu_removal_pending.txt").read_text()
    responses = {**release_responses("9.2"),
                 **container_answers(converged_config(DEVICES_ALL), status, pending)}
    ops = plan(responses)
    assert commands(ops, "pct set 105") == []  # the config is as wanted
    assert commands(ops, "pct reboot 105") == (["pct reboot 105"] if reboots else [])
    names = [name.rsplit(" | ", 1)[-1] for name, _ in ops]
    if reboots:
        assert "Container 105 running (dev6 pending: applied at a restart)" in names
        assert "container 105: dev6 set but not applied yet (pct pending)" in caplog.text
    else:
        assert commands(ops, "pct start 105") == ["pct start 105"]


@pytest.mark.parametrize("answer", [
    "",  # dpkg-query failed (its database locked, 2>/dev/null || true): no line at all
    "half-configured 6.1.10",  # an upgrade interrupted in its postinst
    "unpacked 6.1.10",
])
def test_no_installed_pve_container_on_a_host_with_pct_is_refused_recorded_format(answer):
    """pct is there but dpkg-query names no installed pve-container: the GPUs are not passed
    on a guess (raw lines, a restart per device), nothing is planned (issue 33, item 8)."""
    responses = {**release_responses("9.2"), **container_answers(converged_config(DEVICES_ALL), "running"),
                 PveContainerVersion().command(): answer}
    with pytest.raises(PreflightError) as caught:
        plan(responses)
    message = str(caught.value)
    assert message.startswith("host @fake/pve1: pct is here, but `dpkg-query -W -f")
    assert "names no installed pve-container" in message and "dpkg --audit" in message
    assert "devN entries from 5.0.7, raw lxc lines before" in message
    assert message.endswith("nothing was changed")


@pytest.mark.parametrize("answer, shown", [("installed 6.1.x", "'6.1.x'"), ("installed abc", "'abc'")])
def test_a_pve_container_version_the_rules_cannot_compare_is_refused_recorded_format(answer, shown):
    """An answer no rule can compare (was a bare ValueError, "An internal exception occurred"):
    refused naming the host, the command and the value (issue 33, item 7)."""
    responses = {**release_responses("9.2"), **container_answers(None, None),
                 PveContainerVersion().command(): answer}
    with pytest.raises(PreflightError, match=(
            rf"^host @fake/pve1: `dpkg-query -W -f .*pve-container .*` answered pve-container "
            rf"version {shown}: not a pve-container version; allowed: .*'4\.4-3'.*; nothing "
            "was changed$")):
        plan(responses)


@pytest.mark.parametrize("release, refused", [("7.4", True), ("8.0", True), ("8.1", False), ("9.2", False)])
def test_hybrid_cgroup_on_proxmox_before_devn_is_refused_recorded_format(release, refused):
    """A Proxmox host booted with the v1 devices controller (hybrid) on a release without
    devN: the deploy would need lxc.cgroup.* keys, which it never writes on Proxmox."""
    responses = {**release_responses(release), **container_answers(None, None),
                 CgroupVersion().command(): "tmpfs\ncgroup2fs",
                 FileContents().command(path="/etc/pve/lxc/105.conf").get_raw_value(): "arch: amd64\n"}
    if refused:
        with pytest.raises(PreflightError, match=r"host @fake/pve1: pve-container 4\.4-3|5\.0\.3"):
            plan(responses)
        with pytest.raises(PreflightError, match="this host's cgroup is 'hybrid'.*nothing was changed"):
            plan(responses)
    else:
        ops = plan(responses)
        assert not any("lxc.cgroup" in c for c in all_commands(ops))


@pytest.mark.parametrize("version, warned", [
    ("6.0.18", False), ("6.0.19", True), ("6.1.0", True), ("6.1.1", False),
])
def test_bind_mounts_on_pve_container_6_0_19_to_6_1_0_warn_recorded_format(version, warned, caplog):
    """9.1 hosts updated between January and February 2026: a warning naming the bind mounts
    (the wheel store here, and a user's models) and the fixed versions; nothing refused."""
    responses = {**release_responses("9.1"), **container_answers(None, None),
                 PveContainerVersion().command(): f"installed {version}"}
    ops = plan(responses, mounts=[{"host_path": "/tank/models", "path": "/models", "read_only": True}])
    assert commands(ops, "pct create 105")
    if warned:
        assert (f"host @fake/pve1, container 105: pve-container {version} (from 6.0.19) gives a "
                "mount point the owner and mode") in caplog.text
        assert "(/tank/models, /var/cache/pve-sglang/wheels)" in caplog.text
        assert "Fixed for the root disk in 6.1.0 and for bind mounts in 6.1.1" in caplog.text
    else:
        assert "gives a mount point the owner" not in caplog.text


def test_proxmox_raw_lines_are_cgroup2_whatever_the_host_cgroup():
    """The one place raw passthrough lines get their cgroup key: on Proxmox always
    lxc.cgroup2 (v1 keys are gone in Proxmox VE 9); on plain LXC the host's own version."""
    from pve_sglang.preflight import GpuHost

    majors = {"nvidia": 195, "nvidia-uvm": 238, "nvidia-caps": 241}
    nodes = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    for cgroup in ("v2", "hybrid", "v1"):
        gpu = GpuHost(driver_version="580.159.04", gpus=[], majors=majors, nodes=nodes,
                      cgroup=cgroup, native_dev=False,
                      minors=[{"index": 0, "bus_id": "00000000:00:06.0", "minor": 0}])
        pve = gpu.raw_lines([0], style="pve", where="host pve1")
        assert [line for line in pve if "devices.allow" in line] == [
            "lxc.cgroup2.devices.allow: c 195:0 rwm", "lxc.cgroup2.devices.allow: c 195:255 rwm",
            "lxc.cgroup2.devices.allow: c 238:* rwm"]
        lxc_key = "lxc.cgroup2.devices.allow" if cgroup == "v2" else "lxc.cgroup.devices.allow"
        assert all(line.startswith(lxc_key)
                   for line in gpu.raw_lines([0], style="lxc", where="host pve1")
                   if "devices.allow" in line)


def test_model_store_fetched_by_the_host_once_then_mounted_read_only():
    ops = plan({**gpu_host_responses(), **container_answers(None, None)},
               model_store="/tank/models", model_download="Org/Model-7B", hf_token="hf_s3cret")
    names = [name.rsplit(" | ", 1)[-1] for name, _ in ops]
    from pve_sglang.stack.lock import default_key, lock_for
    hub = lock_for(default_key()).packages["huggingface-hub"]  # the containers' own client
    tools, token, fetch = (names.index(f"huggingface_hub {hub} in /opt/pve-sglang/model-tools"),
                           names.index("Hub token for Org/Model-7B (mode 0600)"),
                           names.index("Model store /tank/models: Org/Model-7B"))
    assert tools < token < fetch < names.index("Create container 105")
    mounts = commands(ops, "/tank/models/Org--Model-7B/serving/_default,mp=/models/model,ro=1")
    assert mounts and all("--mp1 /tank/models/" in c for c in mounts), mounts
    # The token only in the 0600 file's upload (the harness shows its content), never in a command.
    assert [c for _, cmds in ops for c in cmds if "hf_s3cret" in c] == [
        'upload /etc/pve-sglang/Org--Model-7B.env\nHF_TOKEN="hf_s3cret"\n']


# --- nvidia-smi's index is not the device number (issue 47, item 6) ------------------------

SYNTHETIC = FIXTURES / "synthetic"


def host_of(shape: str) -> dict:
    """The GPU facts of a constructed host SHAPE (tests/fixtures/synthetic, in the recorded
    formats): ``a100x8_index_not_minor`` (the public reports' A100 host: GPU 0 is
    /dev/nvidia2, GPU 2 is /dev/nvidia0) or ``l40sx3_one_excluded`` (GPU 1 is /dev/nvidia2)."""
    read = lambda fact: (SYNTHETIC / f"{shape}_fact_{fact}.txt").read_text()  # noqa: E731
    driver = read("NvidiaGpus").split(", ")[-1].strip()
    return {NvidiaGpus().command(): read("NvidiaGpus"),
            NvidiaGpuMinors().command(): read("NvidiaGpuMinors"),
            NvidiaDeviceNodes().command(): read("NvidiaDeviceNodes"),
            NvidiaDriverVersion().command(): f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  "
                                             f"{driver}  Release Build"}


@pytest.mark.parametrize("gpus, nodes, label", [
    ([0], ["/dev/nvidia2"], "GPU 0 = /dev/nvidia2"),
    ([2, 0], ["/dev/nvidia0", "/dev/nvidia2"], "GPU 2 = /dev/nvidia0, GPU 0 = /dev/nvidia2"),
    ([1], ["/dev/nvidia1"], "GPU 1 = /dev/nvidia1"),
])
def test_a_gpu_gets_its_own_node_where_index_and_minor_differ_constructed_from_public_reports(
        gpus, nodes, label):
    """GPU 0 of the A100 host is /dev/nvidia2: the container gets that node (was
    /dev/nvidia0: another GPU, perhaps one another container uses), and the plan names both."""
    responses = {**gpu_host_responses("installed 6.1.10"), **host_of("a100x8_index_not_minor"),
                 **container_answers(None, None)}
    ops = plan(responses, gpus=gpus, tp_size=len(gpus))
    [dev_set] = commands(ops, "pct set 105 --dev0 ")
    assert re.findall(r"--dev\d+ (/dev/nvidia\d+),mode=0666", dev_set) == nodes
    names = [name.rsplit(" | ", 1)[-1] for name, _ in ops]
    assert f"Container 105 {label} (devN: applied when the container starts)" in names


def test_raw_lines_pass_the_gpus_own_minor_constructed_from_public_reports():
    """Before devN (Proxmox VE 8.0): the cgroup rule and the bind mount of /dev/nvidia2."""
    responses = {**release_responses("8.0"), **host_of("a100x8_index_not_minor"),
                 **container_answers(None, None),
                 FileContents().command(path="/etc/pve/lxc/105.conf").get_raw_value(): "arch: amd64\n"}
    ops = plan(responses, gpus=[0])
    [upload] = commands(ops, "upload /etc/pve/lxc/105.conf")
    lines = upload.splitlines()[1:]
    assert "lxc.cgroup2.devices.allow: c 195:2 rwm" in lines
    assert "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file" in lines
    assert not any("195:0 " in line or "/dev/nvidia0 " in line for line in lines)
    names = [name.rsplit(" | ", 1)[-1] for name, _ in ops]
    assert ("Container 105 GPU passthrough (GPU 0 = /dev/nvidia2; raw lxc lines, NVIDIA majors "
            "from /proc/devices)") in names


def test_a_gap_in_the_device_minors_is_mapped_not_a_crash_constructed():
    """Nodes /dev/nvidia0 and /dev/nvidia2 (the GPU between them excluded): ``gpus: all`` was
    a bare ValueError ("/dev/nvidia1 is missing"); now both GPUs get their nodes."""
    responses = {**gpu_host_responses(), **host_of("l40sx3_one_excluded"),
                 **container_answers(None, None)}
    ops = plan(responses, gpus="all")
    [dev_set] = commands(ops, "pct set 105 --dev0 ")
    assert re.findall(r"--dev\d+ (/dev/nvidia\d+),mode=0666", dev_set) == [
        "/dev/nvidia0", "/dev/nvidia2"]


@pytest.mark.parametrize("minors, expected", [
    # nvidia-smi's rows, no information file read (/proc/driver/nvidia unreadable)
    (lambda text: "\n".join(line for line in text.splitlines() if not line.startswith("/proc")),
     r"GPU 0 \(PCI bus 00000000:41:00\.0\): no /proc/driver/nvidia/gpus/BUS/information names "
     r"its device minor, so which /dev/nvidiaN it is cannot be told"),
    # the driver names a node the host lacks
    (lambda text: text.replace("Device Minor: \t 0", "Device Minor: \t 5"),
     r"GPU passthrough of GPU 0 = /dev/nvidia5, GPU 1 = /dev/nvidia2: host device node "
     r"/dev/nvidia5 \(device minor 5\) is missing \(`nvidia-modprobe -c 5` creates it\)"),
])
def test_a_gpu_node_that_cannot_be_told_is_refused_before_any_change_constructed(minors, expected):
    shape = host_of("l40sx3_one_excluded")
    command = NvidiaGpuMinors().command()
    responses = {**gpu_host_responses(), **shape, **container_answers(None, None),
                 command: minors(shape[command])}
    with pytest.raises(PreflightError, match=rf"^host @fake/pve1, container @fake/ct105: "
                       rf"{expected}.*; nothing was changed$"):
        plan(responses, gpus="all")


# --- an answer of two lines from dpkg-query (issue 47, item 7) ------------------------------

@pytest.mark.parametrize("answer", ["installed 5.0.8\ninstalled 6.1.10\n",
                                    "installed 6.1.10\ninstalled 5.0.8\n",
                                    "installed 6.1.10\nconfig-files 5.0.8\n"])
def test_a_two_line_pve_container_answer_is_refused_recorded_format(answer):
    """Two lines in the recorded format (was: the first line won, so swapping them flipped
    devN hot-plug and the restart): refused, naming the host and the command."""
    responses = {**release_responses("9.2"),
                 **container_answers(converged_config(DEVICES_ALL), "running"),
                 PveContainerVersion().command(): answer}
    with pytest.raises(PreflightError) as caught:
        plan(responses)
    message = str(caught.value)
    assert message.startswith("host @fake/pve1: `dpkg-query -W -f '${db:Status-Status} "
                              "${Version}\\n' pve-container 2>/dev/null || true` answered ")
    assert "2 lines where one is expected: ambiguous" in message
    assert message.endswith("nothing was changed")


# --- raw lines written, the run killed before the reboot (issue 47, item 7) ------------------

from pyinfra.facts.files import File  # noqa: E402

from pve_sglang.operations.pct import restart_marker  # noqa: E402


def raw_lines_on(config: str, status: str | None, marker: bool) -> dict:
    """Proxmox VE 8.0 (raw lines) with container 105's config CONFIG, its status, and whether
    the marker of a change waiting for its restart is there (``stat`` as File reads it)."""
    path = restart_marker(105)
    return {**release_responses("8.0"), **container_answers(config, status),
            FileContents().command(path="/etc/pve/lxc/105.conf").get_raw_value(): config,
            File().command(path=path).get_raw_value():
                f"user=root group=root mode=-rw-r--r-- atime=0 mtime=0 ctime=0 size=40 '{path}'"
                if marker else ""}


def with_raw_lines(config: str) -> str:
    return config + "".join(line + "\n" for line in NVIDIA_PVE)


def test_raw_lines_mark_the_restart_they_wait_for_recorded_format():
    """The marker is written before the config, in the same operation, and removed once the
    container rebooted."""
    ops = plan(raw_lines_on(converged_config([]), "running", marker=False))
    [(_, written)] = [(name, cmds) for name, cmds in ops if "GPU passthrough (GPU 0" in name]
    assert written[0] == (f"mkdir -p /var/lib/pve-sglang/restart-pending && printf '%s\\n' "
                          f"'/etc/pve/lxc/105.conf: owned lines changed' > {restart_marker(105)}")
    assert written[-1].startswith("upload /etc/pve/lxc/105.conf")
    [(_, power)] = [(name, cmds) for name, cmds in ops if name.endswith("Container 105 running")]
    assert power == ["pct reboot 105", f"rm -f {restart_marker(105)}"]


@pytest.mark.parametrize("marker, status, expected", [
    (True, "running", ["pct reboot 105", "rm -f /var/lib/pve-sglang/restart-pending/105"]),
    (True, "stopped", ["pct start 105", "rm -f /var/lib/pve-sglang/restart-pending/105"]),
    (False, "running", []),
])
def test_raw_lines_left_by_a_killed_run_are_applied_by_the_next_recorded_format(
        marker, status, expected, caplog):
    """A run killed between the config's upload and `pct reboot`: the lines are in the
    config (nothing to write), the marker is there; the next run reboots the running
    container once, and says why (was: nothing, the GPUs never reached the container)."""
    ops = plan(raw_lines_on(with_raw_lines(converged_config([])), status, marker))
    assert commands(ops, "upload /etc/pve/lxc/105.conf") == []
    [(name, power)] = [(name, cmds) for name, cmds in ops if "Container 105 running" in name]
    assert power == expected
    if marker and status == "running":
        assert name.endswith("Container 105 running (GPU passthrough lines pending: applied at "
                             "a restart)")
        assert ("host @fake/pve1, container 105: GPU passthrough lines written by a run that "
                "ended before it restarted the container (/var/lib/pve-sglang/restart-pending/"
                "105 is there)") in caplog.text


# --- the template's architecture (issue 47, item 7) -----------------------------------------

@pytest.mark.parametrize("template, refused", [
    ("debian-12-standard", True),
    ("debian-12-standard_12.7-1_amd64.tar.zst", False),
])
def test_an_empty_host_architecture_is_refused_for_a_template_prefix_recorded_format(template, refused):
    """`dpkg --print-architecture` answering nothing dropped the architecture filter, so a
    prefix took the newest template of any architecture; a file name needs none."""
    responses = {**release_responses("9.2"), **container_answers(None, None),
                 DebianArchitecture().command(): ""}
    if not refused:
        assert commands(plan(responses, {"template": template}), "pct create 105")
        return
    with pytest.raises(PreflightError) as caught:
        plan(responses, {"template": template})
    message = str(caught.value)
    assert message.startswith("host @fake/pve1: `dpkg --print-architecture` answered nothing")
    assert "field 'template' = 'debian-12-standard'" in message
    assert message.endswith("nothing was changed")


@pytest.mark.parametrize("accept", [False, True])
def test_a_mirror_without_hashes_is_fetched_only_where_the_setting_accepts_it(accept):
    ops = plan({**gpu_host_responses(), **container_answers(None, None)},
               model_store="/tank/models", model_download="Org/Model-7B",
               model_accept_unhashed=accept)
    fetches = commands(ops, "model_fetch.py fetch")
    assert fetches, [name for name, _ in ops]
    assert all(("--accept-unhashed" in c) is accept for c in fetches), fetches
