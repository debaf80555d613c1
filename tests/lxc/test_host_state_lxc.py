"""The LXC host's one read of its containers (``LxcHostState``) on a real running container:
each part the same value as its own fact read alone. The same on files and limits, and what an
operation reads again, in the fast tier: tests/unit/test_host_state.py."""

from __future__ import annotations

from pve_sglang.operations import lxc
from test_host_state import alone, folded


def test_a_running_container_read_with_the_host_gives_each_fact_its_own_value(lxc_container):
    name, path = lxc_container.name, str(lxc_container.lxc_path)
    keys = ("memory.max", "cpuset.cpus", "pids.max")
    parts = (("status", (name, path)), ("config", (lxc.config_path(name, path),)),
             ("cgroup", (name, path, keys)),
             ("files", (tuple(lxc.guard_paths(f"{path}/{name}/rootfs")),)))
    values = folded(parts)
    for (kind, args), value in values.items():
        assert value == alone(kind, args), kind
    assert values[parts[0]] == "RUNNING"
    assert any(line.startswith("lxc.rootfs.path") for line in values[parts[1]])
    assert values[parts[2]]  # a running container's values
