"""Phase 1, on each Proxmox (or plain LXC) host: driver, nvidia_uvm HMM option, GPU container."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.host import Host
from pyinfra.context import state
from pyinfra.operations import files, server, systemd

from pve_sglang.config_lines import owned_by_gpu_passthrough, owned_by_settings
from pve_sglang.facts.nvidia import NvidiaGpuProcesses, UvmDisableHmm
from pve_sglang.operations import lxc, owned, pct
from pve_sglang.operations.changes import any_changed
from pve_sglang.preflight import (
    GpuHost,
    PreflightError,
    check_container,
    check_container_tools,
    check_server_files,
    gpu_host,
    select_gpus,
)
from pve_sglang.project import template
from pve_sglang.settings import (
    ContainerSettings,
    HostSettings,
    container_hostname,
    host_settings,
)

UVM_CONF = "/etc/modprobe.d/nvidia-uvm.conf"
UVM_UNIT = "nvidia-uvm-devices.service"


@deploy("Proxmox host")
def host_phase() -> None:
    """Bring a Proxmox (or plain LXC) host to running GPU containers."""
    if "pve_hosts" not in host.groups:
        return
    settings = host_settings(HostSettings)
    check_container_tools(host, settings)
    gpu = gpu_host(host, settings)
    containers = [state.inventory.get_host(name) for name in host.data.get("containers") or []]
    # Check every container against the host before the first change, and render what its
    # container phase will write (deferred for a container created in this run), so --dry
    # shows the same errors as a run, for new and existing containers alike.
    plans = [(ct, host_settings(ContainerSettings, of=ct)) for ct in containers]
    indices = {}
    for ct, cs in plans:
        where = f"host {host.name}, container {ct.name}"
        indices[ct.name] = check_container(where, cs, gpu)
        gpus = select_gpus(cs.gpus, gpu.gpus, where) if gpu is not None else []
        check_server_files(where, ct.name, cs, gpus, state.inventory)
    if gpu is not None:
        nvidia_uvm(settings, gpu)
    for ct, cs in plans:
        if settings.platform == "pve":
            pve_container(ct, cs, settings, gpu, indices[ct.name])
        else:
            lxc_container(ct, cs, settings, gpu, indices[ct.name])


def nvidia_uvm(settings: HostSettings, gpu: GpuHost) -> None:
    """Persist ``uvm_disable_hmm=1``, bring it in force when allowed, create uvm nodes at boot."""
    conf = files.template(
        name="Disable HMM in nvidia_uvm (persisted)",
        src=template("nvidia-uvm.conf.j2"),
        dest=UVM_CONF,
        mode="644",
    )
    server.shell(
        name="Update the initramfs with the nvidia_uvm option",
        commands=["update-initramfs -u -k all"],
        _if=conf.did_change,
    )
    if host.get_fact(UvmDisableHmm) is False:
        busy = host.get_fact(NvidiaGpuProcesses)
        if settings.reload_modules and not busy:
            server.shell(
                name="Reload nvidia_uvm so uvm_disable_hmm=1 is in force",
                commands=[
                    "modprobe -r nvidia_uvm || { echo 'nvidia_uvm is in use: stop the GPU "
                    "containers or reboot' >&2; exit 1; }",
                    "modprobe nvidia_uvm",
                    "nvidia-modprobe -u -c0",
                    "grep -qx Y /sys/module/nvidia_uvm/parameters/uvm_disable_hmm",
                ],
            )
        else:
            why = (
                f"{len(busy)} GPU processes run" if busy else "reload_modules is false"
            )
            logger.warning(
                f"{host.name}: uvm_disable_hmm is N in the running nvidia_uvm ({why}): the "
                f"option in {UVM_CONF} takes effect at the next reboot or module reload. Until "
                "then CUDA init may fail in containers (cuInit error 3)."
            )
    unit = files.template(
        name="Create /dev/nvidia-uvm* at boot (oneshot unit)",
        src=template(f"{UVM_UNIT}.j2"),
        dest=f"/etc/systemd/system/{UVM_UNIT}",
        mode="644",
    )
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    systemd.service(
        name="Enable and run the nvidia-uvm device unit",
        service=UVM_UNIT,
        running=True,
        enabled=True,
    )


def _pve_options(cs: ContainerSettings, ct: Host) -> dict[str, str]:
    """``pct`` options Proxmox applies to a running container without a restart."""
    return {
        "hostname": container_hostname(ct.data),
        "cores": str(cs.cores),
        "memory": str(cs.memory_mib),
        "swap": str(cs.swap_mib),
        "net0": cs.net0,
        "onboot": str(int(cs.onboot)),
    }


def _mount_values(cs: ContainerSettings) -> list[str]:
    return [
        f"{m.host_path},mp={m.path}" + (",ro=1" if m.read_only else "") for m in cs.mounts
    ]


def pve_container(
    ct: Host, cs: ContainerSettings, hs: HostSettings, gpu: GpuHost | None, indices: list[int]
) -> None:
    """Create or reconcile Proxmox container VMID and start it; restart only on a real change."""
    vmid = int(ct.data.get("pct_vmid"))
    where = f"host {host.name}, container {vmid}"
    current = pct.current_config(vmid)
    if current is not None and current.get("unprivileged", "0") != str(int(cs.unprivileged)):
        raise PreflightError(
            f"{where}: field 'unprivileged' = {cs.unprivileged}, but the existing container is "
            f"{'un' if current.get('unprivileged') == '1' else ''}privileged; Proxmox cannot "
            "change that in place (back up and restore with --unprivileged), or set the field "
            "to match"
        )
    pct.template(name=f"Container template {hs.template}", storage=hs.template_storage,
                 template=hs.template)
    features = f"nesting={int(cs.nesting)}"
    pct.create(
        name=f"Create container {vmid}",
        vmid=vmid,
        storage=hs.template_storage,
        template=hs.template,
        options={
            **_pve_options(cs, ct),
            "rootfs": f"{cs.rootfs_storage}:{cs.rootfs_size_gib}",
            "features": features,
            **{f"mp{i}": value for i, value in enumerate(_mount_values(cs))},
        },
        unprivileged=cs.unprivileged,
    )
    pct.config(name=f"Container {vmid} size and network", vmid=vmid,
               options=_pve_options(cs, ct))
    pct.rootfs_size(name=f"Container {vmid} disk size", vmid=vmid, size_gib=cs.rootfs_size_gib)
    native = gpu is not None and gpu.native_dev
    needs_restart = [
        pct.config(
            name=f"Container {vmid} features, mounts" + (" and GPUs (devN)" if native else ""),
            vmid=vmid,
            options={"features": features},
            mounts=_mount_values(cs),
            devices=gpu.dev_entries(indices) if native else ([] if gpu is None else None),
        )
    ]
    if gpu is not None and not native:
        needs_restart.append(
            owned.lines(
                name=f"Container {vmid} GPU passthrough (raw lxc lines, NVIDIA majors from /proc/devices)",
                path=pct.config_path(vmid),
                lines=gpu.raw_lines(indices, style="pve"),
                owned=owned_by_gpu_passthrough(gpu.majors),
            )
        )
    pct.power(name=f"Container {vmid} running", vmid=vmid,
              restart=any_changed(*needs_restart, restarts=f"container {vmid} (pct reboot)"))


def lxc_container(
    ct: Host, cs: ContainerSettings, hs: HostSettings, gpu: GpuHost | None, indices: list[int]
) -> None:
    """Create or reconcile a plain LXC container and start it; restart only on a real change."""
    name = ct.data.get("lxc_name")
    lxc.create(name=f"Create container {name}", container=name, lxc_path=hs.lxc_path,
               release=hs.lxc_release, rootfs_tarball=hs.lxc_rootfs_tarball)
    lines = list(hs.lxc_config)
    owners = [owned_by_settings(lines)]
    if gpu is not None:
        lines += gpu.raw_lines(indices, style="lxc")
        owners.append(owned_by_gpu_passthrough(gpu.majors))
    config = owned.lines(
        name=f"Container {name} config (network, GPU passthrough)",
        path=lxc.config_path(name, hs.lxc_path),
        lines=lines,
        owned=lambda line: any(owner(line) for owner in owners),
    )
    lxc.power(name=f"Container {name} running", container=name, lxc_path=hs.lxc_path,
              restart=any_changed(config, restarts=f"container {name} (lxc-stop, lxc-start)"))
