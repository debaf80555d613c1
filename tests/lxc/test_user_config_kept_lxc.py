"""Nothing the user wrote in a plain LXC container's config is lost (issue 10, item 5), in a real
container on this machine: the host phase's real container steps run through pyinfra against it
(lxc-* tools, its real config file); only the GPU facts are the H200 machine's recorded answers,
as no GPU exists here. Every user line survives byte for byte, the NVIDIA lines are the wanted
ones, and no restart happens when only user lines differ. Proxmox's, on recorded facts:
tests/unit/test_user_config_kept.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.deploy import add_deploy, deploy
from pyinfra.api.host import Host
from pyinfra.api.operations import run_ops
from pyinfra.context import host as ctx_host_proxy
from pyinfra.context import state as ctx_state_proxy

from harness import fact_value
from pve_sglang.facts.nvidia import (
    CharDeviceMajors,
    NvidiaDeviceNodes,
    NvidiaDriverVersion,
    NvidiaGpuMinors,
    NvidiaGpus,
)
from pve_sglang.facts.system import CgroupVersion, VirtualMachineType
from pve_sglang.hosts_file import build_groups
from pve_sglang.preflight import check_container, check_container_tools, gpu_host
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings, HostSettings, settings_for
from pve_sglang.runtime.pyinfra_private import operation_commands
from tasks.host import lxc_container
from test_host_phase_recorded import NVIDIA_PVE, h200, h200_minors
from test_user_config_kept import USER_RAW_PVE, assert_kept, is_nvidia

NVIDIA_LXC = [line.replace(": ", " = ", 1) for line in NVIDIA_PVE]


# The GPU facts of the H200 machine, answered for this machine (which has no GPU); every
# other fact (lxc-info, the container's config file, id -u, which) is read for real.
RECORDED_GPU = {
    NvidiaDriverVersion: h200("NvidiaDriverVersion"),
    NvidiaGpus: h200("NvidiaGpus"),
    NvidiaGpuMinors: h200_minors(),  # constructed (tests/fixtures/README.md)
    CharDeviceMajors: h200("CharDeviceMajors"),
    NvidiaDeviceNodes: h200("NvidiaDeviceNodes"),
    CgroupVersion: "cgroup2fs",
    VirtualMachineType: "none",
}


@deploy("Proxmox host (the container steps)")
def host_container_steps() -> None:
    """The host phase's container steps: ``host_phase`` without ``nvidia_uvm``, which would
    rewrite this machine's modprobe config and initramfs."""
    settings = settings_for(ctx_host_proxy.data, HostSettings)
    check_container_tools(ctx_host_proxy, settings)
    gpu = gpu_host(ctx_host_proxy, settings)
    for name in ctx_host_proxy.data.get("containers"):
        ct = ctx_state_proxy.inventory.get_host(name)
        cs = settings_for(ct.data, ContainerSettings)
        indices = check_container(f"container {ct.name}", cs.lxc, cs.server, cs.stack, gpu)
        lxc_container(ct, cs.lxc, settings, gpu, indices, idmap_base=None)  # privileged


def run_host_phase(container, monkeypatch) -> dict:
    """The container steps on this machine for CONTAINER, through pyinfra's API; returns
    {operation name: commands run}."""
    real_get_fact = Host.get_fact

    def get_fact(self, cls, *args, **kwargs):
        if cls in RECORDED_GPU:
            return fact_value(cls, RECORDED_GPU[cls])
        return real_get_fact(self, cls, *args, **kwargs)

    monkeypatch.setattr(Host, "get_fact", get_fact)
    # As the test environment made it: privileged, its network, its own name.
    hosts = {"local": {"platform": "lxc", "lxc_path": str(container.lxc_path),
                       "lxc_config": container.network_config(),
                       "containers": [{"name": container.name, "unprivileged": False,
                                       "hostname": container.name, "wheel_store": None}]}}
    pve_hosts, gpu_containers = build_groups(hosts)
    defaults = load_defaults()
    inventory = Inventory(
        ([(name, {**defaults, **data}) for name, data in pve_hosts + gpu_containers], {}),
        pve_hosts=([name for name, _ in pve_hosts], {}),
        gpu_containers=([name for name, _ in gpu_containers], {}),
    )
    state = State(inventory, Config())
    local = inventory.get_host("@local")
    local.connect()
    state.activate_host(local)
    add_deploy(state, host_container_steps, host=local)
    run_ops(state)
    assert not state.failed_hosts, "the host phase failed"
    ran = {}
    for op_hash in state.get_op_order():
        meta = state.ops[local].get(op_hash)
        if meta is not None and meta.operation_meta.executed:
            name = ", ".join(sorted(state.get_op_meta(op_hash).names))
            ran[name] = [str(c) for c in operation_commands(meta.operation_meta)]
    return ran


def init_pid(container) -> str:
    return subprocess.run(["lxc-info", "-P", str(container.lxc_path), "-n", container.name,
                           "-p", "-H"], capture_output=True, text=True, check=True).stdout.strip()


USER_RAW_LXC = [line.replace(": ", " = ", 1) for line in USER_RAW_PVE
                if not line.startswith("lxc.idmap")]  # an id map would make it unprivileged


def test_real_lxc_container_keeps_user_lines_and_restarts_only_for_nvidia_lines(
    lxc_container_factory, monkeypatch
):
    user = ["# TUN for the VPN client, added by hand", *USER_RAW_LXC[:2],
            "", "# DRI render nodes", *USER_RAW_LXC[2:]]
    (container,) = lxc_container_factory(1, extra_config=user)
    path = Path(container.config_path)
    before = path.read_text().splitlines()
    pid = init_pid(container)

    ran = run_host_phase(container, monkeypatch)
    after = path.read_text().splitlines()
    # The test environment's name and network lines are the settings' (hostname, lxc_config).
    settings_keys = ("lxc.uts.name", "lxc.net.0.")
    assert_kept(before, after, [line for line in before
                                if line.strip() and not line.startswith(settings_keys)])
    assert [line for line in after if is_nvidia(line)] == NVIDIA_LXC
    # The NVIDIA lines were new: one restart, and the TUN mount works in the new boot.
    assert init_pid(container) != pid
    assert [name for name in ran if "running" in name], ran
    container.wait_ready()
    tun = container.attach("stat -c '%t:%T' /dev/net/tun").stdout.strip()
    assert tun == "a:c8"  # 10:200

    # Now the user edits their own lines only: a comment and a FUSE rule.
    edited = path.read_text() + "# FUSE for sshfs\nlxc.cgroup2.devices.allow = c 10:229 rwm\n"
    path.write_text(edited)
    pid = init_pid(container)
    ran = run_host_phase(container, monkeypatch)
    assert path.read_text() == edited  # byte for byte: not even rewritten
    assert ran == {}, f"operations changed something: {ran}"
    assert init_pid(container) == pid
