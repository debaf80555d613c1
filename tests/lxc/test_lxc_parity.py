"""Plain LXC containers get the container settings, proven from inside real containers.

The host phase runs through the real pyinfra CLI (`--limit @local`: no container setup) on
this machine as a plain LXC host, creating containers from the tests' cached Debian rootfs.
Each setting is then read where it takes effect: ``/proc/self/uid_map``, the cgroup files,
``nproc``, the mount and its read-only flag, the hostname, LXC's autostart list, the network
namespace. A re-run changes nothing; a changed limit applies without a restart; turning the
unprivileged container privileged is refused. The host's own addresses and routes are compared
around a stop and a start.

The container that shares the host's network namespace (``lxc.net.0.type = none``) runs in a
network namespace the test makes (an ``eth0`` with an address and a default route), never
in the machine's own: a stand-in ``networking.service`` in it does what ifupdown does at boot
and shutdown (adds an address, flushes the interface).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pve_sglang.container_config.lxc_keys import SHARED_NETWORK_DROPIN
from devtools import lxc_env

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
NAME = "pvs-parity"
ADDRESS = "10.0.3.202"  # lxc-net's bridge; above what its dnsmasq hands out first
NETNS = "pvs-shared-net"


class HostPhase:
    """A hosts file for one plain LXC container and the host phase run through the CLI."""

    def __init__(self, root: Path, name: str, container: dict, host: dict | None = None,
                 netns: str | None = None):
        self.root, self.name, self.netns = root, name, netns
        self.lxc_path = root / "lxc"
        self.lxc_path.mkdir(parents=True, exist_ok=True)
        lxc_env.reachable_by_container_root(self.lxc_path)
        self.host = {
            "platform": "lxc",
            "require_gpu": False,
            "lxc_path": str(self.lxc_path),
            "lxc_rootfs_tarball": str(lxc_env.ensure_rootfs_tarball()),
            **(host or {}),
        }
        self.container = {"name": name, **container}
        self.hosts_file = root / f"{name}.yml"

    def run_cli(self) -> subprocess.CompletedProcess:
        self.hosts_file.write_text(yaml.safe_dump(
            {"local": {**self.host, "containers": [self.container]}}))
        command = [str(PYINFRA), "inventory.py", "deploy.py", "-y", "--json", "--limit", "@local"]
        # nsenter, not `ip netns exec`: that mounts a fresh /sys, hiding the cgroup mounts.
        command = self.inside_netns(command)
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PVE_SGLANG_HOSTS": str(self.hosts_file)})

    def run(self) -> list[str]:
        """Run the host phase, which must succeed; the names of the operations that changed."""
        done = self.run_cli()
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        results = json.loads(done.stdout)["results"]["operations"]
        return [op["name"] for op in results if op["success"]]

    def inside_netns(self, argv: list[str]) -> list[str]:
        """ARGV run in the test's network namespace, if any: LXC's command socket is an
        abstract socket, seen only from the network namespace that started the container."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", *argv] if self.netns else argv

    def lxc(self, tool: str, *args: str, check: bool = True) -> str:
        done = subprocess.run(self.inside_netns([tool, "-P", str(self.lxc_path), "-n", self.name, *args]),
                              capture_output=True, text=True, timeout=180)
        assert not check or done.returncode == 0, done.stderr
        return done.stdout.strip()

    def attach(self, command: str, check: bool = True) -> str:
        done = subprocess.run(self.inside_netns(
            ["lxc-attach", "-P", str(self.lxc_path), "-n", self.name, "--clear-env",
             "-v", f"PATH={lxc_env.CONTAINER_PATH}", "--", "sh", "-c", command]),
            capture_output=True, text=True, timeout=120)
        assert not check or done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout.strip()

    def init_pid(self) -> str:
        return self.lxc("lxc-info", "-pH")

    def wait_booted(self) -> None:
        self.attach("timeout 60 sh -c 'until systemctl is-system-running 2>/dev/null "
                    "| grep -qE \"running|degraded\"; do sleep 0.5; done'")

    def destroy(self) -> None:
        self.lxc("lxc-stop", "-k", check=False)
        self.lxc("lxc-destroy", check=False)


def host_network() -> dict:
    """This machine's addresses and routes, but LXC's own bridge and the containers' veths."""
    def mine(entry: dict) -> bool:
        dev = entry.get("ifname") or entry.get("dev") or ""
        return dev != "lxcbr0" and not dev.startswith("veth")

    def ip(*args: str) -> list:
        return json.loads(subprocess.run(["ip", "-j", *args], capture_output=True, text=True,
                                         check=True).stdout)

    return {
        "addresses": [(e["ifname"], e.get("operstate"), [a["local"] for a in e["addr_info"]])
                      for e in ip("addr") if mine(e)],
        "routes": [r for r in ip("route") if mine(r)],
        "routes6": [r for r in ip("-6", "route") if mine(r)],
    }


CONTAINER = {
    "cores": 1,
    "memory_mib": 1024,
    "swap_mib": 512,
    "hostname": "parity-box",
    "onboot": True,
    "net0": f"name=eth0,bridge=lxcbr0,ip={ADDRESS}/24,gw=10.0.3.1",
    "wheel_store": None,  # the host phase alone: no locked stack to keep for it
}


@pytest.fixture(scope="module")
def parity(tmp_path_factory, lxc_host):
    root = tmp_path_factory.mktemp("parity")
    shared = root / "models"
    shared.mkdir()
    (shared / "config.json").write_text("{}\n")
    lxc_env.reachable_by_container_root(shared)
    phase = HostPhase(root, NAME, {
        **CONTAINER, "mounts": [{"host_path": str(shared), "path": "/models", "read_only": True}],
    })
    before = host_network()
    phase.first = phase.run()
    phase.network_before = before
    phase.wait_booted()
    yield phase
    phase.destroy()


def test_new_container_is_unprivileged_with_every_setting_applied(parity):
    assert "Proxmox host | Create container pvs-parity" in parity.first
    uid_map = parity.attach("cat /proc/self/uid_map").split()
    assert uid_map[0] == "0" and int(uid_map[1]) >= 1000 and uid_map[2] == "65536"
    assert parity.attach("stat -c %u /etc/passwd") == "0"  # its files shifted with it
    assert parity.attach("nproc") == "1"
    layout = lxc_env.host_cgroup_layout()
    memory = parity.attach("cat /sys/fs/cgroup/memory.max" if layout == "v2"
                           else "cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert int(memory) == 1024 << 20
    if layout != "v2" and Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists():
        memsw = parity.attach("cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
        assert int(memsw) == (1024 + 512) << 20
    assert parity.attach("hostname") == "parity-box"
    assert parity.attach("cat /models/config.json") == "{}"
    assert "Read-only file system" in parity.attach("touch /models/x 2>&1", check=False)
    assert " ro," in parity.attach("grep ' /models ' /proc/mounts") + ","
    autostart = parity.lxc("lxc-ls", "-f", "-F", "NAME,AUTOSTART").split("\n")[-1].split()
    assert autostart == [NAME, "1"]
    # Its own network namespace, with the address net0 gives, reaching the host's bridge.
    assert parity.attach("readlink /proc/1/ns/net") != os.readlink("/proc/self/ns/net")
    assert f"{ADDRESS}/24" in parity.attach("ip -br addr show eth0")
    parity.attach("python3 -c \"import socket; socket.create_connection(('10.0.3.1', 53), 5)\"")


def test_rerun_changes_nothing(parity):
    pid = parity.init_pid()
    assert parity.run() == []
    assert parity.init_pid() == pid


def test_changed_limits_apply_live_without_restart(parity):
    pid = parity.init_pid()
    parity.container.update(memory_mib=2048, cores=2)
    changed = parity.run()
    assert parity.init_pid() == pid, "a changed limit restarted the container"
    assert all("limits" in name for name in changed) and len(changed) == 2, changed
    layout = lxc_env.host_cgroup_layout()
    memory = parity.attach("cat /sys/fs/cgroup/memory.max" if layout == "v2"
                           else "cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert int(memory) == 2048 << 20
    assert parity.attach("nproc") == str(min(2, os.cpu_count() or 1))
    assert parity.run() == []


def test_turning_the_container_privileged_is_refused_and_changes_nothing(parity):
    config = (parity.lxc_path / NAME / "config").read_bytes()
    parity.container["unprivileged"] = False
    try:
        done = parity.run_cli()
    finally:
        parity.container.pop("unprivileged")
    assert done.returncode != 0
    assert "field 'unprivileged' = False" in done.stderr and "lxc.idmap" in done.stderr
    assert (parity.lxc_path / NAME / "config").read_bytes() == config


def test_host_network_unchanged_across_stop_and_start(parity):
    parity.lxc("lxc-stop", "-t", "60")
    assert parity.run() == ["Proxmox host | Container pvs-parity running"]
    parity.wait_booted()
    parity.lxc("lxc-stop", "-t", "60")
    parity.lxc("lxc-start")
    parity.wait_booted()
    assert host_network() == parity.network_before


@pytest.fixture
def private_netns():
    """A network namespace standing in for the host's: an eth0 (a veth whose peer stays in there) with an address and a
    default route, as a host has. The shared-network container runs only in there."""
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    script = (f"ip netns add {NETNS} && ip -n {NETNS} link add eth0 type veth peer name peer0 && "
              f"ip -n {NETNS} addr add 192.0.2.77/24 dev eth0 && ip -n {NETNS} link set eth0 up "
              f"&& ip -n {NETNS} link set peer0 up && ip -n {NETNS} link set lo up && ip -n {NETNS} route add default via 192.0.2.1")
    subprocess.run(["sh", "-c", script], check=True)
    yield NETNS
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def netns_network() -> str:
    return subprocess.run(["ip", "-n", NETNS, "-br", "addr", "show", "eth0"], capture_output=True,
                          text=True, check=True).stdout.split(None, 1)[1]


# What ifupdown's networking.service does to eth0 at boot (dhclient adds an address) and at
# shutdown (ifdown flushes it): in a container sharing the host's network, the host's eth0.
STAND_IN_NETWORKING = """\
[Unit]
Description=stand-in for ifupdown: configures eth0 at start, deconfigures it at stop
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/ip addr add 198.51.100.9/24 dev eth0
ExecStop=/usr/sbin/ip addr flush dev eth0
[Install]
WantedBy=multi-user.target
"""


def test_shared_network_container_leaves_the_host_interfaces_alone(tmp_path, private_netns, lxc_host):
    phase = HostPhase(tmp_path, "pvs-shared", {"unprivileged": False, "cores": 1,
                                               "memory_mib": 1024, "wheel_store": None},
                      host={"lxc_config": ["lxc.net.0.type = none"]}, netns=private_netns)
    try:
        before = netns_network()
        phase.run()
        rootfs = phase.lxc_path / "pvs-shared" / "rootfs"
        dropin = rootfs / f"etc/systemd/system/networking.service.d/{SHARED_NETWORK_DROPIN}"
        assert dropin.is_file()
        units = rootfs / "etc/systemd/system"
        (units / "networking.service").write_text(STAND_IN_NETWORKING)
        (units / "multi-user.target.wants").mkdir(exist_ok=True)
        (units / "multi-user.target.wants/networking.service").symlink_to(
            "/etc/systemd/system/networking.service")
        phase.lxc("lxc-stop", "-t", "60")
        assert phase.run() == ["Proxmox host | Container pvs-shared running"]
        phase.wait_booted()
        assert phase.attach("systemctl show networking.service -p ConditionResult") == \
            "ConditionResult=no"
        phase.lxc("lxc-stop", "-t", "60")
        assert netns_network() == before, "the container changed the host's interface"
        # The control: without the deploy's drop-in the stand-in does reach the interface, so
        # the comparison above can fail.
        dropin.unlink()
        phase.lxc("lxc-start")
        phase.wait_booted()
        assert "198.51.100.9/24" in netns_network()
        phase.lxc("lxc-stop", "-t", "60")
        assert "192.0.2.77" not in netns_network()
        # And the deploy puts its drop-in back.
        assert "Proxmox host | Container pvs-shared leaves the host's interfaces alone" in phase.run()
        assert dropin.is_file()
    finally:
        phase.destroy()


def test_embedded_default_container_has_its_own_network_and_leaves_the_host_alone(tmp_path, lxc_host):
    """The container `make deploy` makes without a hosts file (pve_sglang/embedded_hosts.yml),
    built by Debian's lxc template as there, only in a folder of the test: unprivileged, on
    lxc-net's bridge, its own ifupdown and DHCP client on its own eth0; stopping and starting
    it leaves this machine's addresses and routes as they were."""
    embedded = yaml.safe_load((REPO / "pve_sglang" / "embedded_hosts.yml").read_text())["local"]
    [container] = embedded.pop("containers")
    phase = HostPhase(tmp_path, container.pop("name"), container, host=embedded)
    phase.host.pop("lxc_rootfs_tarball")  # the template, as make deploy runs it
    before = host_network()
    try:
        assert "Proxmox host | Create container pve-sglang-demo" in phase.run()
        phase.wait_booted()
        assert phase.attach("cat /proc/self/uid_map").split()[:2] == ["0", "100000"]
        assert phase.attach("systemctl is-active networking") == "active"
        phase.attach("timeout 30 sh -c 'until ip -4 -br addr show eth0 | grep -q 10.0.3.; "
                     "do sleep 0.5; done'")  # leased by lxc-net's dnsmasq
        phase.lxc("lxc-stop", "-t", "60")
        assert phase.run() == ["Proxmox host | Container pve-sglang-demo running"]
        phase.wait_booted()
        phase.lxc("lxc-stop", "-t", "60")
        assert host_network() == before
    finally:
        phase.destroy()
