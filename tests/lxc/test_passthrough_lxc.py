"""GPU passthrough config (pve_sglang/gpu/passthrough.py): the lines applied to a real LXC container
with character nodes carrying NVIDIA's numbers (the generated lines: tests/unit/test_passthrough.py).
With no NVIDIA driver here, opening an allowed node gives ENXIO (the cgroup let it through, no
driver behind the major), a node the rules do not allow gives EPERM.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from devtools import lxc_env
from pve_sglang.gpu.passthrough import raw_lxc_lines


# In a real container

PROBE = textwrap.dedent(
    """
    import errno, json, os, sys
    result = {}
    for path in sys.argv[1:]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            result[path] = None
            continue
        try:
            os.close(os.open(path, os.O_RDWR))
            outcome = "opened"
        except OSError as e:
            outcome = errno.errorcode[e.errno]
        result[path] = [os.major(st.st_rdev), os.minor(st.st_rdev), outcome]
    print(json.dumps(result))
    """
)


def _free_majors(count: int) -> list[int]:
    """Majors no real device uses here (both /proc/devices sections), from 508 down."""
    with open("/proc/devices") as f:
        used = {int(line.split()[0]) for line in f if line.strip()[:1].isdigit()}
    free = [m for m in range(508, 480, -1) if m not in used]
    assert len(free) >= count, f"no free majors near 508 here: {sorted(used)}"
    return free[:count]


@pytest.fixture
def fake_nvidia_nodes(tmp_path):
    """
    Character nodes with NVIDIA's numbers under a temp dir. Returns (dev_root, majors, nodes,
    other): ``nodes`` maps names to (major, minor), ``other`` is a major no rule allows.
    """
    uvm, caps, other = _free_majors(3)
    dev_root = tmp_path / "dev"
    (dev_root / "nvidia-caps").mkdir(parents=True)
    nodes = {
        "nvidia0": (195, 0),
        "nvidia1": (195, 1),
        "nvidiactl": (195, 255),
        "nvidia-modeset": (195, 254),
        "nvidia-uvm": (uvm, 0),
        "nvidia-uvm-tools": (uvm, 1),
        "nvidia-caps/nvidia-cap1": (caps, 1),
    }
    for name, (major, minor) in nodes.items():
        os.mknod(dev_root / name, 0o666 | 0o020000, os.makedev(major, minor))
        os.chmod(dev_root / name, 0o666)  # as NVIDIA's nodes are; mknod applied the umask
    majors = {"nvidia-frontend": 195, "nvidia-uvm": uvm, "nvidia-caps": caps}
    return dev_root, majors, nodes, other


LAYOUT = lxc_env.host_cgroup_layout()


@pytest.mark.parametrize(
    ("rules", "start_mode", "enforced", "unprivileged"),
    [
        pytest.param("v1", "host", True, False, id="v1-rules-host-cgroups",
                     marks=pytest.mark.skipif(LAYOUT != "v1", reason="host is pure cgroup2")),
        pytest.param("v2", "v2", True, False, id="v2-rules-pure-cgroup2"),
        pytest.param("v2", "host", False, False, id="v2-rules-ignored-on-legacy-host",
                     marks=pytest.mark.skipif(LAYOUT != "v1", reason="host is pure cgroup2")),
        # Plain LXC's default: the nodes, bind-mounted from the host, are usable by the
        # container's root through their 0666 mode (their owner, host root, is unmapped there).
        pytest.param("v1", "host", True, True, id="v1-rules-unprivileged",
                     marks=pytest.mark.skipif(LAYOUT != "v1", reason="host is pure cgroup2")),
        pytest.param("v2", "v2", True, True, id="v2-rules-unprivileged-pure-cgroup2"),
    ],
)
def test_passthrough_lines_in_real_container(
    lxc_container_factory, fake_nvidia_nodes, rules, start_mode, enforced, unprivileged
):
    dev_root, majors, nodes, other = fake_nvidia_nodes
    host_nodes = [f"/dev/{name}" for name in nodes]
    lines = raw_lxc_lines([0], majors, host_nodes, style="lxc", cgroup=rules, dev_root=str(dev_root))

    if unprivileged:
        # LXC mounts in the container's user namespace: its root (host uid 100000) must reach
        # the nodes (under /dev on a GPU host; pytest's folders are 0700).
        for folder in [dev_root, *dev_root.parents]:
            folder.chmod(folder.stat().st_mode | 0o011)
    (container,) = lxc_container_factory(1, extra_config=lines, cgroup=start_mode,
                                         unprivileged=unprivileged)
    if unprivileged:
        passed = ["nvidia0", "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools",
                  "nvidia-caps/nvidia-cap1"]
        assert container.attach("cat /proc/self/uid_map").stdout.split()[:2] == ["0", "100000"]
        probe = container.attach(["python3", "-c", PROBE, *(f"/dev/{n}" for n in passed)])
        seen = json.loads(probe.stdout)
        for name in passed:
            assert seen[f"/dev/{name}"] == [*nodes[name], "ENXIO"], name
        modes = container.attach("stat -c '%a %u' /dev/nvidia0 /dev/nvidia-uvm").stdout.splitlines()
        assert modes == ["666 65534", "666 65534"]
        # mknod is not allowed in a user namespace: nothing else can be made inside.
        assert container.attach("mknod /dev/x c 195 1", check=False).returncode != 0
        return

    # A node the rules do not allow: GPU 1 (not selected, so not mounted: make it inside)
    container.attach("mknod /dev/nvidia1 c 195 1")
    container.attach(f"mknod /dev/other-major c {other} 0")

    passed = ["nvidia0", "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools",
              "nvidia-caps/nvidia-cap1"]
    paths = [f"/dev/{n}" for n in passed] + ["/dev/nvidia1", "/dev/other-major"]
    probe = container.attach(["python3", "-c", PROBE, *paths])
    seen = json.loads(probe.stdout)

    allowed = "ENXIO" if enforced else "EPERM"
    for name in passed:
        major, minor = nodes[name]
        assert seen[f"/dev/{name}"] == [major, minor, allowed], name
    assert seen["/dev/nvidia1"] == [195, 1, "EPERM"]
    assert seen["/dev/other-major"][2] == "EPERM"
    # The cgroup layout inside is the one the test meant
    inside = container.attach("stat -f -c %T /sys/fs/cgroup").stdout.strip()
    assert inside == ("cgroup2fs" if start_mode == "v2" else "tmpfs")
