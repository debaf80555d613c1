"""Container settings as plain LXC config (pve_sglang/container_config/lxc_keys.py): the lines, what they own,
the host facts they read, and the settings refused at inventory time on plain LXC."""

from __future__ import annotations

import pytest

from pve_sglang.facts.lxc_host import parse_cgroup_limits, parse_subids
from pve_sglang.hosts_file import build_groups
from pve_sglang.container_config.lxc_keys import (
    HostLimits,
    config_lines,
    hwaddr,
    limit_lines,
    limits,
    network_lines,
    owned_by_container_settings,
    owned_by_limits,
    rootfs_dir,
    same_limit,
    subid_base,
)
from pve_sglang.project import load_defaults
from pve_sglang.config.settings import ContainerSettings, SettingsError, settings_for

DEFAULTS = load_defaults()


def settings(**overrides) -> ContainerSettings:
    return settings_for({**DEFAULTS, **overrides}, ContainerSettings)


# Host facts, on output recorded on this machine (hybrid cgroup v1) and a pure cgroup2 host.

def test_cgroup_limits_fact_on_recorded_hybrid_and_cgroup2_hosts():
    hybrid = parse_cgroup_limits(["tmpfs", "cgroup2fs", "cpus: 2", "memsw: yes"])
    assert hybrid == {"version": "hybrid", "cpus": 2, "swap_accounting": True}
    assert HostLimits.of(hybrid) == HostLimits("v1", 2, True)
    pure = parse_cgroup_limits(["cgroup2fs", "cpus: 64", "memsw: no"])
    assert HostLimits.of(pure) == HostLimits("v2", 64, False)


def test_root_subids_picks_a_range_both_files_give():
    ranges = parse_subids(["uid root:100000:65536", "gid root:100000:65536",
                           "uid alice:165536:65536"])
    assert ranges == {"uid": [(100000, 65536)], "gid": [(100000, 65536)]}
    assert subid_base(ranges) == 100000
    assert subid_base({"uid": [(100000, 65536)], "gid": [(200000, 65536)]}) is None
    assert subid_base({"uid": [(100000, 1000)], "gid": [(100000, 1000)]}) is None  # too small
    assert subid_base(parse_subids([])) is None


# The lines

def test_limits_in_the_keys_of_the_host_cgroup_version():
    cs = settings(cores=4, memory_mib=4096, swap_mib=512)
    assert limit_lines(cs, HostLimits("v2", 64, False)) == [
        "lxc.cgroup2.cpuset.cpus = 0-3", "lxc.cgroup2.memory.max = 4096M",
        "lxc.cgroup2.memory.swap.max = 512M"]
    assert limit_lines(cs, HostLimits("v1", 2, True)) == [
        "lxc.cgroup.cpuset.cpus = 0-1", "lxc.cgroup.memory.limit_in_bytes = 4096M",
        "lxc.cgroup.memory.memsw.limit_in_bytes = 4608M"]
    # cgroup v1 without swap accounting: a memsw line would stop the container from starting.
    assert "memory.memsw.limit_in_bytes" not in limits(cs, HostLimits("v1", 2, False))
    assert limits(settings(cores=1), HostLimits("v2", 8, False))["cpuset.cpus"] == "0"


def test_config_lines_unprivileged_first_then_name_autostart_nesting_network_mounts():
    cs = settings(onboot=False, nesting=True, net0="name=eth0,bridge=lxcbr0,ip=dhcp",
                  mounts=[{"host_path": "/tank/m", "path": "/models", "read_only": True}])
    lines = config_lines(cs, "box", "ct1", 100000, [])
    assert lines[:3] == ["lxc.include = /usr/share/lxc/config/userns.conf",
                         "lxc.idmap = u 0 100000 65536", "lxc.idmap = g 0 100000 65536"]
    assert "lxc.uts.name = box" in lines and "lxc.start.auto = 0" in lines
    assert "lxc.include = /usr/share/lxc/config/nesting.conf" in lines
    assert lines[-2] == "lxc.mount.entry = /tank/m models none bind,ro,create=dir,x-pve-sglang 0 0"
    # Then the host's wheel store, read-only, which the locked install reads from.
    assert lines[-1] == ("lxc.mount.entry = /var/cache/pve-sglang/wheels var/cache/pve-sglang/wheels "
                         "none bind,ro,create=dir,x-pve-sglang 0 0")
    assert f"lxc.net.0.hwaddr = {hwaddr('ct1')}" in lines and hwaddr("ct1") == hwaddr("ct1")
    privileged = config_lines(settings(nesting=False), "box", "ct1", None,
                              ["lxc.net.0.type = none"])
    assert not any(line.startswith(("lxc.idmap", "lxc.net.")) for line in privileged)
    assert "lxc.include = /usr/share/lxc/config/nesting.conf" not in privileged


def test_net0_as_a_veth_with_static_addresses_and_vlan():
    lines = network_lines("name=eth1,bridge=br0,ip=10.0.0.5/24,gw=10.0.0.1,ip6=fd00::5/64,"
                          "tag=20,mtu=9000,hwaddr=02:00:00:00:00:01", "ct1")
    assert lines == [
        "lxc.net.0.type = veth", "lxc.net.0.link = br0", "lxc.net.0.name = eth1",
        "lxc.net.0.flags = up", "lxc.net.0.hwaddr = 02:00:00:00:00:01", "lxc.net.0.mtu = 9000",
        "lxc.net.0.veth.vlan.id = 20", "lxc.net.0.ipv4.address = 10.0.0.5/24",
        "lxc.net.0.ipv4.gateway = 10.0.0.1", "lxc.net.0.ipv6.address = fd00::5/64"]


def test_owned_lines_are_the_deploys_and_never_the_users():
    owned = owned_by_container_settings(100000, [])
    assert owned("lxc.idmap = u 0 100000 65536")
    assert not owned("lxc.idmap = u 1000 1000 1")  # a user's finer map
    assert owned("lxc.mount.entry = /a b none bind,create=dir,x-pve-sglang 0 0")
    assert not owned("lxc.mount.entry = /a b none bind,create=dir 0 0")
    assert owned("lxc.net.0.link = vmbr1") and not owned("lxc.net.1.link = vmbr1")
    assert owned("lxc.include = /usr/share/lxc/config/nesting.conf")
    assert not owned("lxc.include = /usr/share/lxc/config/debian.common.conf")
    assert not owned("# lxc.uts.name = x") and owned("lxc.uts.name=x")
    # Interface 0 belongs to lxc_config when that describes it.
    assert not owned_by_container_settings(None, ["lxc.net.0.type = none"])("lxc.net.0.type = none")
    assert owned_by_limits("lxc.cgroup2.memory.max = 1G") and owned_by_limits("lxc.cgroup.cpuset.cpus = 0")
    assert not owned_by_limits("lxc.cgroup2.devices.allow = c 10:200 rwm")


def test_live_values_compare_in_their_units_and_rootfs_found_in_config():
    assert same_limit("memory.max", "4294967296", "4096M")
    assert not same_limit("memory.max", "max", "4096M") and not same_limit("memory.max", None, "1M")
    assert same_limit("cpuset.cpus", "0,1", "0-1") and not same_limit("cpuset.cpus", "0", "0-1")
    assert rootfs_dir(["lxc.rootfs.path = dir:/var/lib/lxc/a/rootfs"], "x") == "/var/lib/lxc/a/rootfs"
    assert rootfs_dir(["lxc.rootfs.path = overlay:/base:/ct/delta"], "x") == "/ct/delta"
    assert rootfs_dir([], "/default") == "/default"


# Refused at inventory time, naming host, container, field and what is allowed

def lxc_hosts(container: dict, host: dict | None = None) -> dict:
    return {"lab": {"platform": "lxc", **(host or {}),
                    "containers": [{"name": "ct1", "net0": "name=eth0,bridge=lxcbr0,ip=dhcp",
                                    **container}]}}


@pytest.mark.parametrize("container, host, message", [
    ({"rootfs_size_gib": 50}, None, "field 'rootfs_size_gib' has no meaning on plain LXC"),
    ({"rootfs_storage": "local-zfs"}, None, "field 'rootfs_storage' has no meaning on plain LXC"),
    ({"net0": "name=eth0,bridge=lxcbr0,firewall=1"}, None,
     "key 'firewall' has no meaning on plain LXC; allowed keys there: name, bridge"),
    ({"net0": "name=eth0,ip=dhcp"}, None, "plain LXC needs a veth on a bridge"),
    ({}, {"lxc_config": ["lxc.net.0.type = none"]},
     "which an unprivileged container cannot use"),
    ({"mounts": [{"host_path": "/tank/my models", "path": "/models"}]}, None,
     "field 'mounts.0.host_path' = '/tank/my models': holds whitespace"),
    ({}, {"lxc_config": ["lxc.cgroup2.memory.max = 8G"]},
     "lxc.cgroup2.memory.max is set from cores, memory_mib, swap_mib"),
    ({}, {"lxc_config": ["lxc.uts.name = x"]}, "lxc.uts.name is set from hostname"),
])
def test_plain_lxc_refuses_what_it_cannot_honour(container, host, message):
    with pytest.raises(SettingsError) as error:
        build_groups(lxc_hosts(container, host))
    assert message in str(error.value) and "host lab" in str(error.value)


def test_plain_lxc_accepts_the_defaults_and_shared_network_when_privileged():
    build_groups(lxc_hosts({}))
    build_groups(lxc_hosts({"unprivileged": False}, {"lxc_config": ["lxc.net.0.type = none"]}))
    # Proxmox keeps its own keys.
    build_groups({"pve1": {"containers": [{"vmid": 105, "rootfs_size_gib": 50,
                                           "net0": "name=eth0,bridge=vmbr0,firewall=1"}]}})


def test_model_store_mounts_the_commit_link_read_only_at_model_path():
    cs = settings(model_store="/tank/models", model_download="Org/Model-7B",
                  model_path="/models/model")
    lines = config_lines(cs, "box", "ct1", 100000, [])
    assert lines[-1] == ("lxc.mount.entry = /tank/models/Org--Model-7B/serving/_default "
                         "models/model none bind,ro,create=dir,x-pve-sglang 0 0")
    pinned = settings(model_store="/tank/models", model_download="Org/Model-7B",
                      model_revision="refs/pr/1")
    assert config_lines(pinned, "box", "ct1", 100000, [])[-1].startswith(
        "lxc.mount.entry = /tank/models/Org--Model-7B/serving/refs%2Fpr%2F1 models/model ")
    # Without model_download the store holds nothing for this container: no mount.
    assert not any("/tank/models" in line for line in
                   config_lines(settings(model_store="/tank/models"), "box", "ct1", 100000, []))
    with pytest.raises(ValueError, match="model_path '/models/model' is a mount's path too"):
        settings(model_store="/tank/models", model_download="Org/Model-7B",
                 mounts=[{"host_path": "/tank/m", "path": "/models/model"}])
