"""Phase 1, on each Proxmox (or plain LXC) host: driver, nvidia_uvm HMM option, GPU container."""

from __future__ import annotations

import posixpath
import re
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.host import Host
from pyinfra.context import state
from pyinfra.operations import files, server, systemd

from pve_sglang.container_config.owned_lines import owned_by_gpu_passthrough, owned_by_settings
from pve_sglang.facts.container import UnitState
from pve_sglang.facts.lxc_host import HostPart, RootSubIds
from pve_sglang.facts.nvidia import NvidiaGpuProcesses, UvmDisableHmm
from pve_sglang.container_config.lxc_keys import (
    DEFAULT_SUBID,
    HostLimits,
    config_lines,
    idmap_lines,
    idmap_of,
    limit_lines,
    net0_items,
    owned_by_container_settings,
    owned_by_limits,
    rootfs_dir,
    sets_network,
    shares_host_network,
    subid_base,
)
from pve_sglang.container_config.lxc_keys import limits as lxc_limits
from pve_sglang import remote
from pve_sglang.model_store import operations as model, rules as model_store
from pve_sglang.operations import boot, host_reads, lxc, owned, paths, pct, wheel_store, wheels
from pve_sglang.facts.pve import PctStatus
from pve_sglang.server.unit_text import env_quote
from pve_sglang.operations.changes import any_changed
from pve_sglang.pve_releases import devn_restart
from pve_sglang.preflight import (
    GpuHost,
    PreflightError,
    bind_mount_sources,
    check_container,
    check_container_tools,
    check_server_files,
    gpu_host,
    mount_attributes_warning,
    pve_container_of,
    unread_pve_container,
)
from pve_sglang.gpu.passthrough import select_gpus
from pve_sglang.stack.identity import stack_lock_of
from pve_sglang.stack.lock import Lock, LockKey
from pve_sglang.config.gateway import GatewaySettings, gateway_lock, gateway_store
from pve_sglang.project import template
from tasks.common import store_user_key, upload_script
from pve_sglang.config.settings import (
    ContainerSettings,
    HostSettings,
    LxcView,
    StackView,
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
        indices[ct.name] = check_container(where, cs.lxc, cs.server, cs.stack, gpu)
        gpus = select_gpus(cs.gpus, gpu.gpus, where) if gpu is not None else []
        check_server_files(where, ct.name, cs.server, gpus, state.inventory)
    # The gateways' and monitoring's containers: created as the others, without GPUs
    # (tasks/gateway.py, tasks/monitoring.py).
    gateways = host_gateways()
    others = gateways + host_monitoring()
    if gpu is not None:
        nvidia_uvm(settings, gpu)
    wheel_stores(plans, gateways)
    model_stores(plans)
    idmap_base = lxc_host([cs.lxc for _, cs in plans + others], settings) \
        if settings.platform == "lxc" else None
    if settings.platform == "lxc":
        # Every container's config and the host's limits in one read (host_reads).
        host_reads.expect([(HostPart.CONFIG, (lxc.config_path(ct.data.get("lxc_name"),
                                                               settings.lxc_path),))
                           for ct, _ in plans + others] + [(HostPart.LIMITS, ())],
                          executing=False)
    for ct, cs in plans:
        if settings.platform == "pve":
            pve_container(ct, cs.lxc, settings, gpu, indices[ct.name])
        else:
            lxc_container(ct, cs.lxc, settings, gpu, indices[ct.name], idmap_base)
    for gw, cs in others:
        if settings.platform == "pve":
            pve_container(gw, cs.lxc, settings, None, [])
        else:
            lxc_container(gw, cs.lxc, settings, None, [], idmap_base)


def host_gateways() -> list[tuple[Host, ContainerSettings]]:
    """This host's gateways (its ``gateways:``) and their containers' settings."""
    return [(gw, host_settings(ContainerSettings, of=gw))
            for gw in (state.inventory.get_host(name) for name in host.data.get("gateways") or [])]


def host_monitoring() -> list[tuple[Host, ContainerSettings]]:
    """This host's monitoring container (its ``monitoring:``) and its container's settings."""
    return [(ct, host_settings(ContainerSettings, of=ct))
            for ct in (state.inventory.get_host(name) for name in host.data.get("monitoring") or [])]


def wheel_stores(plans: list[tuple[Host, ContainerSettings]],
                 gateways: list[tuple[Host, ContainerSettings]]) -> None:
    """Each locked set the host's containers install (a gateway's: its smg lock), kept once in
    its wheel store; before the containers start, which mount the store read-only."""
    sets = [(cs.wheel_store, *stack_lock_of(f"host {host.name}, container {ct.name}", cs))
            for ct, cs in plans if cs.uses_wheel_store]
    sets += [(cs.wheel_store, lock, key) for _, cs, lock, key in gateway_sets(gateways)]
    done = set()
    for path, lock, key in sets:
        if (path, lock.id) in done:
            continue
        done.add((path, lock.id))
        assert path is not None  # uses_wheel_store, gateway_store: a store is named
        wheels.store(name=f"Wheel store {path}: {lock.summary(SET_NAMES)}", path=path, lock=lock,
                     key=key)


#: The packages a set's summary names (a serving set's, a gateway's).
SET_NAMES = ("sglang", "torch", "flashinfer-python", "smg")


def gateway_sets(gateways: list[tuple[Host, ContainerSettings]]
                 ) -> list[tuple[Host, ContainerSettings, Lock, LockKey]]:
    """(gateway, its container's settings, smg lock, its key) of each gateway that installs smg
    from its host's wheel store (``gateway_store``)."""
    found = []
    for gw, cs in gateways:
        gs = host_settings(GatewaySettings, of=gw)
        if gateway_store(cs.stack, gs) is not None:
            found.append((gw, cs, *gateway_lock(gs)))
    return found


@deploy("Wheel store retention")
def store_retention_phase() -> None:
    """After the containers switched (and the verify phase rolled back a failed upgrade):
    each wheel store of the host keeps the sets its containers hold and the newest
    ``stack_retention`` (the largest of its containers'); the rest goes."""
    if "pve_hosts" not in host.groups:
        return
    settings = host_settings(HostSettings)
    stores: dict[str, dict[str, list[str]]] = {}
    wanted: dict[str, set[str]] = {}
    keep: dict[str, int] = {}
    for name in host.data.get("containers") or []:
        ct = state.inventory.get_host(name)
        cs = host_settings(ContainerSettings, of=ct)
        if not cs.uses_wheel_store:
            continue
        assert cs.wheel_store is not None
        lock, _ = stack_lock_of(f"host {host.name}, container {ct.name}", cs)
        keep[cs.wheel_store] = max(keep.get(cs.wheel_store, 0), cs.stack_retention)
        wanted.setdefault(cs.wheel_store, set()).add(lock.id)
        # The plan's guess of what the container's phase records (its stacks, read now).
        stores.setdefault(cs.wheel_store, {})[store_user_key(ct.data)] = wheel_store.planned_record(
            ct, cs.server.stacks_at, lock.id, cs.stack_retention,
            cs.restart_on_change) if not state.is_executing else [lock.id]
    # A gateway's record names its smg set (tasks/gateway.py writes it).
    for gw, cs, lock, _ in gateway_sets(host_gateways()):
        assert cs.wheel_store is not None
        keep[cs.wheel_store] = max(keep.get(cs.wheel_store, 0), cs.stack_retention)
        wanted.setdefault(cs.wheel_store, set()).add(lock.id)
        stores.setdefault(cs.wheel_store, {})[store_user_key(gw.data)] = [lock.id]
    for path, planned in stores.items():
        wheel_store.pruned(name=f"Wheel store {path}: the sets no container holds, beyond the "
                                f"{keep[path]} newest, removed", path=path, keep=keep[path],
                           platform=settings.platform, lxc_path=settings.lxc_path,
                           planned=planned, wanted=sorted(wanted[path]))


#: The host's model fetcher: a venv with huggingface_hub and ``model_store/model_fetch.py``.
MODEL_TOOLS = "/opt/pve-sglang/model-tools"
#: The host's env files of the model fetches (HF_TOKEN), mode 0600 in a 0700 folder.
MODEL_SECRETS = "/etc/pve-sglang"
#: huggingface_hub on the host when the container's lock names none (``sglang-no-deps``).
HUB_CLIENT_VERSION = "0.36.2"


def model_stores(plans: list[tuple[Host, ContainerSettings]]) -> None:
    """Each model a container serves from the host's model store, fetched once per host by the
    host itself (the containers mount it read-only and could not write it; a host fetches once
    for all its containers, whichever starts first), verified against the hub, resumable;
    before the containers start, which mount its commit (``ContainerSettings.all_mounts``).
    PLANS' settings whole: a fetch reads the model, the hub token and the stack's lock."""
    done: set[tuple] = set()
    for ct, cs in plans:
        if not cs.uses_model_store:
            continue
        assert cs.model_store is not None and cs.model_download is not None
        key = (cs.model_store, cs.model_download, cs.model_revision)
        if key in done:
            continue
        if not done:
            model_tools(ct, cs.stack)
        done.add(key)
        root = model_store.entry(cs.model_store, cs.model_download)
        env_file = f"{MODEL_SECRETS}/{posixpath.basename(root)}.env"
        env = "".join(f"{name}={env_quote(value)}\n" for name, value in cs.secrets.items()
                      if name == "HF_TOKEN")
        token = paths.put(name=f"Hub token for {cs.model_download} (mode 0600)",
                          src=StringIO(env), dest=env_file, mode="600", secret=True)
        fetch = model_store.fetch_request(cs.model, python=f"{MODEL_TOOLS}/bin/python",
                                          script=f"{MODEL_TOOLS}/{remote.MODEL_FETCH}",
                                          env_file=env_file)._asdict()
        # Before any change, on the host that downloads (a plan too): the size, the access.
        planned = model.checked(**fetch, token_pending=token.will_change)
        model.fetched(
            name=f"Model store {cs.model_store}: {cs.model_download}"
            + (f" at {cs.model_revision}" if cs.model_revision else ""), **fetch,
            planned=planned)


def model_tools(ct: Host, stack: StackView) -> None:
    """The host's model fetcher, with the huggingface_hub the containers' locked set has."""
    version = HUB_CLIENT_VERSION
    if stack.stack_install == "pinned":
        lock, _ = stack_lock_of(f"host {host.name}, container {ct.name}", stack)
        version = lock.packages.get("huggingface-hub", version)
    paths.directory(name=f"Secrets directory {MODEL_SECRETS}", path=MODEL_SECRETS, mode="700")
    model.client_venv(name=f"huggingface_hub {version} in {MODEL_TOOLS}", path=MODEL_TOOLS,
                      version=version)
    upload_script(remote.MODEL_FETCH, "Upload the model fetcher", tools=MODEL_TOOLS)


def nvidia_uvm(settings: HostSettings, gpu: GpuHost) -> None:
    """Persist ``uvm_disable_hmm=1``, bring it in force when allowed, create uvm nodes at boot."""
    conf = files.template(
        name="Disable HMM in nvidia_uvm (persisted)",
        src=template("nvidia-uvm.conf.j2"),
        dest=UVM_CONF,
        mode="644",
    )
    boot.initramfs_current(name="Update the initramfs with the nvidia_uvm option",
                           option_file=UVM_CONF, changed=any_changed(conf))
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
    # Also when systemd still has an older file loaded: a run killed between the write and the
    # reload converges on the next one.
    stale = bool(host.get_fact(UnitState, unit=UVM_UNIT).get("stale"))
    systemd.daemon_reload(name="Reload systemd units", _if=lambda: stale or unit.did_change())
    systemd.service(
        name="Enable and run the nvidia-uvm device unit",
        service=UVM_UNIT,
        running=True,
        enabled=True,
    )


def _pve_options(container: LxcView, ct: Host) -> dict[str, str]:
    """``pct`` options Proxmox applies to a running container without a restart."""
    return {
        "hostname": container_hostname(ct.data),
        "cores": str(container.cores),
        "memory": str(container.memory_mib),
        "swap": str(container.swap_mib),
        "net0": container.net0,
        "onboot": str(int(container.onboot)),
    }


def _mount_values(container: LxcView) -> list[str]:
    return [
        f"{m.host_path},mp={m.path}" + (",ro=1" if m.read_only else "")
        for m in container.all_mounts
    ]


def pve_container(
    ct: Host, container: LxcView, hs: HostSettings, gpu: GpuHost | None, indices: list[int]
) -> None:
    """Create or reconcile Proxmox container VMID and start it; restart only on a real change."""
    vmid = int(ct.data.get("pct_vmid"))
    where = f"host {host.name}, container {vmid}"
    current = pct.current_config(vmid)
    if current is not None and current.get("unprivileged", "0") != str(int(container.unprivileged)):
        raise PreflightError(
            f"{where}: field 'unprivileged' = {container.unprivileged}, but the existing container is "
            f"{'un' if current.get('unprivileged') == '1' else ''}privileged; Proxmox cannot "
            "change that in place (back up and restore with --unprivileged), or set the field "
            "to match"
        )
    pct.host_arch(hs.template)  # before any change, with -y too (the operations ask again)
    pct.template(name=f"Container template {hs.template}", storage=hs.template_storage,
                 template=hs.template)
    features = f"nesting={int(container.nesting)}"
    pct.create(
        name=f"Create container {vmid}",
        vmid=vmid,
        storage=hs.template_storage,
        template=hs.template,
        options={
            **_pve_options(container, ct),
            "rootfs": f"{container.rootfs_storage}:{container.rootfs_size_gib}",
            "features": features,
            **{f"mp{i}": value for i, value in enumerate(_mount_values(container))},
        },
        unprivileged=container.unprivileged,
    )
    pct.config(name=f"Container {vmid} size and network", vmid=vmid,
               options=_pve_options(container, ct))
    pct.rootfs_size(name=f"Container {vmid} disk size", vmid=vmid, size_gib=container.rootfs_size_gib)
    native = gpu is not None and gpu.native_dev
    pve_container = gpu.pve_container if gpu is not None else pve_container_of(host)
    if pve_container is None:
        # No GPU is passed here (require_gpu: false): only the mount warning depends on it.
        logger.warning(f"{unread_pve_container(host.name)}: no warning about pve-container "
                       "6.0.19's mount points can be given")
    bind_mounts = bind_mount_sources(
        _mount_values(container) + [v for k, v in (current or {}).items()
                             if re.fullmatch(r"mp\d+", k) and isinstance(v, str)])
    warning = mount_attributes_warning(where, pve_container, sorted(set(bind_mounts)))
    if warning:
        logger.warning(warning)
    needs_restart = [
        pct.config(
            name=f"Container {vmid} features and mounts",
            vmid=vmid,
            options={"features": features},
            mounts=_mount_values(container),
        )
    ]
    marker = None
    if native or gpu is None:
        devices = gpu.dev_entries(indices, where) if native and gpu is not None else []
        running = host.get_fact(PctStatus, vmid=vmid) == "running"
        decision = devn_restart(pct.device_change(vmid, devices), pve_container, running)
        gpus = pct.config(
            name=f"Container {vmid} "
                 + (f"{gpu.label(indices, where)} " if indices and gpu is not None else "GPUs ")
                 + f"(devN: {decision.why})",
            vmid=vmid,
            options={},
            devices=devices,
        )
        if decision.restart:
            needs_restart.append(gpus)
    else:
        # Proxmox keeps no pending state for raw lines: a marker does, written before them and
        # removed once the container restarted (pct.power), so a run killed in between is
        # finished by the next one.
        marker = pct.restart_marker(vmid)
        needs_restart.append(
            owned.lines(
                name=f"Container {vmid} GPU passthrough ({gpu.label(indices, where)}; raw lxc "
                     "lines, NVIDIA majors from /proc/devices)",
                path=pct.config_path(vmid),
                lines=gpu.raw_lines(indices, style="pve", where=where),
                owned=owned_by_gpu_passthrough(gpu.majors),
                marker=marker,
            )
        )
    changed = any_changed(*needs_restart, restarts=f"container {vmid} (pct reboot)")
    # What an earlier run set but never rebooted for (killed between pct set and pct reboot):
    # pct config shows it as done, pct pending as waiting; raw lines: the marker.
    running = current is not None and host.get_fact(PctStatus, vmid=vmid) == "running"
    pending = pct.pending_restart(vmid) if running else []
    if pending:
        logger.warning(f"{where}: {', '.join(pending)} set but not applied yet (pct pending): "
                       "the container restarts to apply them")
    if running and marker is not None and pct.restart_left(marker):
        logger.warning(f"{where}: GPU passthrough lines written by a run that ended before it "
                       f"restarted the container ({marker} is there): the container restarts "
                       "to apply them")
        pending.append("GPU passthrough lines")
    pct.power(name=f"Container {vmid} running" + (f" ({', '.join(pending)} pending: applied at "
                                                   "a restart)" if pending else ""),
              vmid=vmid, restart=lambda: changed() or bool(pending), marker=marker)


def lxc_host(containers: list[LxcView], hs: HostSettings) -> int | None:
    """What a plain LXC host needs before its CONTAINERS: root's subordinate ids when a
    container is unprivileged (created as Proxmox ships them when missing), and the bridges
    their veths join. Returns the start of root's id range (``None``: no unprivileged one)."""
    base = None
    if any(container.unprivileged for container in containers):
        ranges = host.get_fact(RootSubIds)
        base = subid_base(ranges or {})
        if base is None:
            start, count = DEFAULT_SUBID
            for kind in ("uid", "gid"):
                files.line(
                    name=f"Subordinate {kind}s for root's unprivileged containers (/etc/sub{kind})",
                    path=f"/etc/sub{kind}",
                    line=f"root:{start}:{count}",
                )
            base = start
    if not sets_network(hs.lxc_config):
        for bridge in sorted({net0_items(container.net0)["bridge"] for container in containers}):
            lxc.bridge(name=f"Network bridge {bridge}", bridge=bridge)
    return base


def lxc_container(
    ct: Host, container: LxcView, hs: HostSettings, gpu: GpuHost | None, indices: list[int],
    idmap_base: int | None,
) -> None:
    """Create or reconcile a plain LXC container and start it; a changed cgroup limit applies
    live, anything else restarts it once."""
    name = ct.data.get("lxc_name")
    where = f"host {host.name}, container {name}"
    path = lxc.config_path(name, hs.lxc_path)
    existing = owned.contents(path)
    base = idmap_base if container.unprivileged else None
    if existing is not None:
        mapped = idmap_of(existing)
        if bool(mapped) != container.unprivileged:
            raise PreflightError(
                f"{where}: field 'unprivileged' = {container.unprivileged}, but the existing container "
                f"is {'un' if mapped else ''}privileged ({'lxc.idmap lines' if mapped else 'no lxc.idmap line'} "
                f"in {path}); its files' owners would have to be shifted: recreate the "
                "container, or set the field to match"
            )
        if mapped and idmap_base is not None and not any(
                line in mapped for line in idmap_lines(idmap_base)):
            base = None  # the user's own id map: kept, the deploy adds none
    limits = HostLimits.of(host_reads.read(HostPart.LIMITS) or {})
    if container.cores > limits.cpus:
        logger.warning(f"{where}: cores = {container.cores}, but the host has {limits.cpus} CPUs: "
                       f"the container gets all {limits.cpus}")
    if limits.version == "v1" and not limits.swap_accounting and container.swap_mib:
        logger.warning(f"{where}: swap_mib = {container.swap_mib} is not applied: this cgroup v1 host "
                       "has no swap accounting (boot with swapaccount=1)")
    hostname = container_hostname(ct.data)
    lines = config_lines(container, hostname, name, base, hs.lxc_config) + list(hs.lxc_config)
    shared = shares_host_network(lines)
    lxc.create(name=f"Create container {name}", container=name, lxc_path=hs.lxc_path,
               release=hs.lxc_release, rootfs_tarball=hs.lxc_rootfs_tarball,
               hostname=hostname, idmap_base=base, shared_network=shared)
    owners = [owned_by_container_settings(base, hs.lxc_config), owned_by_settings(hs.lxc_config)]
    if gpu is not None:
        lines += gpu.raw_lines(indices, style="lxc", where=where)
        owners.append(owned_by_gpu_passthrough(gpu.majors))
    config = owned.lines(
        name=f"Container {name} config (id map, name, network, mounts"
             + (f", GPU passthrough: {gpu.label(indices, where)})" if gpu is not None else ")"),
        path=path,
        lines=lines,
        owned=lambda line: any(owner(line) for owner in owners),
    )
    # Limits apart: a changed limit applies live (lxc.cgroup_limits), it restarts nothing.
    owned.lines(
        name=f"Container {name} CPU and memory limits ({limits.prefix}*)",
        path=path,
        lines=limit_lines(container, limits),
        owned=owned_by_limits,
    )
    rootfs = rootfs_dir(existing or [], f"{hs.lxc_path.rstrip('/')}/{name}/rootfs")
    keys = list(lxc_limits(container, limits))
    # What its operations read at execution, read with the other containers' (host_reads).
    host_reads.expect([(HostPart.STATUS, (name, hs.lxc_path)), (HostPart.CONFIG, (path,)),
                       (HostPart.CGROUP, (name, hs.lxc_path, keys))]
                      + ([(HostPart.FILES, (lxc.guard_paths(rootfs),))] if base is None else []),
                      executing=True)
    guard = None
    if base is None:  # only a privileged container can share the host's network namespace
        guard = lxc.network_guard(name=f"Container {name} leaves the host's interfaces alone",
                                  rootfs=rootfs, shared=shared)
    lxc.power(name=f"Container {name} running", container=name, lxc_path=hs.lxc_path,
              restart=any_changed(config, *([guard] if guard else []),
                                  restarts=f"container {name} (lxc-stop, lxc-start)"))
    lxc.cgroup_limits(name=f"Container {name} limits applied (lxc-cgroup, no restart)",
                      container=name, lxc_path=hs.lxc_path, limits=lxc_limits(container, limits))
