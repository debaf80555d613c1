"""Nothing the user wrote in a container config is lost (issue 10, item 5).

Realistic existing configs (a TUN rule and its mount, a user's own ``devN`` for /dev/dri, bind
mounts, comments and the description, ``lxc.apparmor``/``lxc.idmap`` lines, a snapshot
section) go through the host phase on both platforms:

+ Proxmox, on recorded facts (no Proxmox host here): the H200 machine's driver, GPUs, majors and
  nodes (tests/fixtures/h200) and public ``pct config`` / ``/etc/pve/lxc/VMID.conf`` files
  (tests/fixtures/public). The planned file write or ``pct set`` is applied to the config and
  the result compared line by line.
+ Plain LXC, in a real container on this machine: the host phase's real container steps run
  through pyinfra against it (lxc-* tools, its real config file); only the GPU facts are the
  H200 machine's recorded answers, as no GPU exists here (tests/lxc/test_user_config_kept_lxc.py).

Each proves that every user line survives byte for byte, that the NVIDIA lines are the wanted
ones, and that no restart happens when only user lines differ.
"""

from __future__ import annotations

import shlex

from pyinfra.facts.files import FileContents

from test_host_phase_recorded import (
    DEVICES_ALL,
    PUBLIC,
    commands,
    container_answers,
    converged_config,
    NVIDIA_PVE,
    gpu_host_responses,
    plan,
)

CONF = "/etc/pve/lxc/105.conf"

# What a user adds by hand: the description (Proxmox keeps it as '#' lines at the top), a TUN
# device for a VPN client and its mount, the DRI render nodes, an id map, a bind mount of a
# host directory in raw form, an AppArmor profile.
USER_DESCRIPTION = ["#GLM-5 box%3A keep the TUN device for tailscale", "#owner%3A ops team"]
USER_RAW_PVE = [
    "lxc.cgroup2.devices.allow: c 10:200 rwm",
    "lxc.mount.entry: /dev/net/tun dev/net/tun none bind,create=file",
    "lxc.cgroup2.devices.allow: c 226:* rwm",
    "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir",
    "lxc.mount.entry: /srv/nvidia-models srv/models none bind,optional,create=dir",
    "lxc.idmap: u 0 100000 65536",
    "lxc.idmap: g 0 100000 65536",
    "lxc.apparmor.profile: unconfined",
]
# A snapshot section keeps its own copy of the config as it was (Proxmox writes them after
# the main section); it must stay byte for byte, old NVIDIA lines included.
SNAPSHOT = """
[pre-upgrade]
#GLM-5 box before the upgrade
arch: amd64
cores: 32
hostname: glm5
lxc.cgroup2.devices.allow: c 10:200 rwm
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
snaptime: 1764000000
"""
# Keys the deploy sets on a Proxmox container (settings), the rest of a config is the user's.
DEPLOY_KEYS = {"hostname", "cores", "memory", "swap", "net0", "onboot", "features"}


def is_nvidia(line: str) -> bool:
    """A line about the recorded host's NVIDIA nodes: a rule for its majors, a /dev/nvidia*
    mount (the test's own reading of the recorded facts)."""
    return "/dev/nvidia" in line or any(f"c {major}:" in line for major in (195, 238, 241))


def pct_config_output(conf: str) -> str:
    """What ``pct config`` prints for a config file: keys sorted (the '#' description as one
    URL-encoded ``description`` key), raw ``lxc.*`` lines last, no snapshot sections."""
    main = conf.split("\n[", 1)[0]
    description, keys, raw = [], [], []
    for line in main.splitlines():
        if line.startswith("#"):
            description.append(line[1:])
        elif line.startswith("lxc."):
            raw.append(line)
        elif line.strip():
            keys.append(line)
    if description:
        keys.append(f"description: {'%0A'.join(description)}%0A")
    return "\n".join(sorted(keys) + raw) + "\n"


def sections(conf: str) -> tuple[list[str], str]:
    """The main section's lines and the rest (snapshot sections) as text."""
    lines = conf.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    return lines[:end], "\n".join(lines[end:])


def apply_pct_set(conf: str, args: list[str]) -> str:
    """``pct set`` on a config file: each ``--key value`` replaces that key's line in the main
    section (or is added before the raw lines), ``--delete a,b`` removes those keys."""
    main, rest = sections(conf)
    pairs = list(zip(args[::2], args[1::2]))
    for flag, value in pairs:
        key = flag.removeprefix("--")
        if key == "delete":
            drop = set(value.split(","))
            main = [line for line in main if line.split(":", 1)[0] not in drop]
            continue
        line = f"{key}: {value}"
        at = next((i for i, old in enumerate(main) if old.split(":", 1)[0] == key), None)
        if at is not None:
            main[at] = line
        else:
            raw = next((i for i, old in enumerate(main) if old.startswith("lxc.")), len(main))
            main.insert(raw, line)
    return "\n".join(main) + ("\n" + rest if rest else "") + "\n"


def apply_plan(conf: str, ops: list) -> str:
    """The config after the plan's writes of it: an upload of the file, then ``pct set``.

    At execution the file write reads the config again after an earlier ``pct set``; the
    plan's upload was made from the config as it was. ``pct set`` changes keys, the upload
    only raw lines, so applying the upload first gives what execution writes.
    """
    planned = [command for _, cmds in ops for command in cmds]
    for command in planned:
        if command.startswith(f"upload {CONF}\n"):
            conf = command.split("\n", 1)[1]
    for command in planned:
        if command.startswith("pct set 105 "):
            conf = apply_pct_set(conf, shlex.split(command)[3:])
    return conf


def assert_kept(before: list[str], after: list[str], user: list[str]) -> None:
    """Each user line of BEFORE is in AFTER, byte for byte and in the same order."""
    missing = [line for line in user if line not in after]
    assert not missing, f"user lines lost: {missing}"
    assert [line for line in after if line in user] == [line for line in before if line in user]


def raw_plan(conf: str, status: str = "running") -> list:
    """The host phase on an old pve-container (raw lines) with CONF as the container config."""
    return plan({**gpu_host_responses("installed 4.4-6"),
                 **container_answers(pct_config_output(conf), status),
                 FileContents().command(path=CONF).get_raw_value(): conf})


def converged_base() -> list[str]:
    return converged_config([]).splitlines()


# Proxmox, raw lxc.* path (pve-container < 5.0.7), on recorded facts


def test_recorded_raw_path_first_deploy_keeps_every_user_line_and_snapshot():
    # The public /etc/pve/lxc/116.conf (a guide's NVIDIA lines for another host's majors, an
    # allow-all rule, an empty cap.drop) with the user's own lines and a snapshot.
    recorded = (PUBLIC / "pve8_lxc_conf_116_nvidia_raw_lines_inventory.txt").read_text()
    conf = "\n".join(USER_DESCRIPTION) + "\n" + recorded + "\n".join(USER_RAW_PVE) + "\n" + SNAPSHOT
    before, snapshot = sections(conf)
    ops = raw_plan(conf)
    after_conf = apply_plan(conf, ops)
    after, after_snapshot = sections(after_conf)

    # Theirs: every line but the deploy's keys and the lines for the recorded NVIDIA majors
    # and nodes (a guide's c 195:* rule and /dev/nvidia* mounts are replaced by the wanted).
    user = [line for line in before if line.strip()
            and line.split(":", 1)[0] not in DEPLOY_KEYS and not is_nvidia(line)]
    assert "lxc.cgroup2.devices.allow: c 511:* rwm" in user  # another host's majors: theirs
    assert_kept(before, after, user)
    assert after_snapshot == snapshot
    assert [line for line in after if is_nvidia(line)] == NVIDIA_PVE
    # NVIDIA lines changed (the guide's c 195:* became per-node rules): one reboot.
    assert commands(ops, "pct reboot 105") == ["pct reboot 105"]


def test_recorded_raw_path_only_user_lines_differ_no_write_no_reboot():
    conf = "\n".join(USER_DESCRIPTION + converged_base() + USER_RAW_PVE[:3] + NVIDIA_PVE
                     + USER_RAW_PVE[3:]) + "\n" + SNAPSHOT
    ops = raw_plan(conf)
    assert apply_plan(conf, ops) == conf
    assert commands(ops, f"upload {CONF}") == []
    assert commands(ops, "pct ") == []  # no pct set, no pct reboot


def test_recorded_raw_path_stopped_container_keeps_user_lines_and_starts_once():
    conf = "\n".join(converged_base() + USER_RAW_PVE) + "\n" + SNAPSHOT
    ops = raw_plan(conf, status="stopped")
    before, snapshot = sections(conf)
    after, after_snapshot = sections(apply_plan(conf, ops))
    assert_kept(before, after, USER_RAW_PVE)
    assert after_snapshot == snapshot
    assert [line for line in after if is_nvidia(line)] == NVIDIA_PVE
    assert commands(ops, "pct start 105") == ["pct start 105"]
    assert commands(ops, "pct reboot") == []


# Proxmox, native devN path (pve-container >= 5.0.7), on recorded facts


def native_plan(conf: str, **container: object) -> list:
    return plan({**gpu_host_responses("installed 5.2.3"),
                 **container_answers(pct_config_output(conf), "running")}, **container)


def test_recorded_native_path_keeps_users_dri_devs_and_mounts():
    # The public `pct config 115` (dev0-dev3 for /dev/dri, mp0-mp5, a description), with the
    # settings' own mount at another path and the user's TUN lines.
    recorded = (PUBLIC / "pve8_pct_config_115_dev_passthrough_jellyfin-notes.txt").read_text()
    conf = recorded + "\n".join(USER_RAW_PVE[:2]) + "\n"
    ops = native_plan(conf, mounts=[{"host_path": "/tank/models", "path": "/models"}])
    before, _ = sections(conf)
    after, _ = sections(apply_plan(conf, ops))
    user = [line for line in before if line.split(":", 1)[0] not in DEPLOY_KEYS]
    assert_kept(before, after, user)
    devs = [line for line in after if line.startswith("dev") and "/dev/nvidia" in line]
    assert devs == [f"dev{4 + i}: {d}" for i, d in enumerate(DEVICES_ALL)]  # free keys
    assert "mp6: /tank/models,mp=/models" in after
    assert not [c for c in commands(ops, "pct set") if "--delete" in c]


def test_recorded_native_path_only_user_lines_differ_no_reboot():
    ours = [f"dev{4 + i}: {d}" for i, d in enumerate(DEVICES_ALL)]
    users_devs = ["dev0: /dev/dri/renderD128,gid=993", "dev1: /dev/dri/card0,gid=44",
                  "mp2: /mnt/data/ccna,mp=/media/ccna"]
    conf = "\n".join(USER_DESCRIPTION + sorted(converged_base() + users_devs + ours)
                     + USER_RAW_PVE) + "\n" + SNAPSHOT
    ops = native_plan(conf)
    assert commands(ops, "pct ") == []
    # ...because every container operation was planned and found its lines in place.
    container_ops = [(name.rsplit(" | ", 1)[-1], cmds) for name, cmds in ops if "ontainer" in name]
    assert [name for name, _ in container_ops] == [
        "Container template debian-12-standard", "Create container 105",
        "Container 105 size and network", "Container 105 disk size",
        "Container 105 features and mounts", "Container 105 GPU 0 = /dev/nvidia0 (devN: unchanged)",
        "Container 105 running",
    ]
    assert all(cmds == [] for _, cmds in container_ops)
