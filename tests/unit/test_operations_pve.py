"""Proxmox and plain-LXC container operations: recorded facts in, commands out.

There is no Proxmox host here: the ``pct``/``pveam`` outputs are recorded real outputs from
public sources (tests/fixtures/public, see its README), parsed by the real fact classes.
"""

import subprocess
from pathlib import Path

import pytest

from harness import fact_value, op_commands
from pve_sglang.container_config.owned_lines import owned_by_gpu_passthrough
from pve_sglang.facts.pve import LxcContainerStatus, PctConfig, PctStatus, PveamTemplates
from pve_sglang.facts.system import DebianArchitecture
from pve_sglang.operations import lxc, owned, pct
from pyinfra.facts.files import Directory, File, FileContents

PUBLIC = Path(__file__).parents[1] / "fixtures" / "public"
PVE = Path(__file__).parents[1] / "fixtures" / "pve"
#: ``dpkg --print-architecture`` as recorded on this machine (tests/fixtures/dev-docker).
ARCH = fact_value(DebianArchitecture, (Path(__file__).parents[1] / "fixtures" / "dev-docker"
                                       / "dpkg_print_architecture.txt").read_text())


def recorded(name: str) -> str:
    return (PUBLIC / name).read_text()


CONFIG_104 = fact_value(PctConfig, recorded("pve_pct_config_104_pct-notes.txt"))
CONFIG_115 = fact_value(PctConfig, recorded("pve8_pct_config_115_dev_passthrough_jellyfin-notes.txt"))
TEMPLATES = fact_value(PveamTemplates, recorded("pve_pveam_list_local_notes-ru.txt"))
MISSING = fact_value(PctStatus, recorded("pve_pct_missing_ct_pve-nas-issue6.txt"))
RUNNING = fact_value(PctStatus, recorded("pve_pct_status_running_ops-notes.txt"))
LIVE_104 = {"hostname": "webserver-ct-1", "cores": "1", "memory": "512", "swap": "512",
            "net0": "name=eth0,bridge=vmbr0,ip=dhcp", "onboot": "1"}


def test_recorded_pveam_list_template_prefix_present_means_no_download():
    assert op_commands(pct.template, storage="local", template="debian-12-standard",
                       facts={(PveamTemplates, ("local",)): TEMPLATES, DebianArchitecture: ARCH}) == []


def test_recorded_pveam_list_missing_template_is_downloaded_newest_of_prefix():
    commands = op_commands(pct.template, storage="local", template="ubuntu-22.04-standard",
                           facts={(PveamTemplates, ("local",)): TEMPLATES, DebianArchitecture: ARCH})
    assert len(commands) == 1
    assert "pveam available --section system" in commands[0]
    assert "P=ubuntu-22.04-standard A=amd64 awk" in commands[0] and "sort -V" in commands[0]
    assert commands[0].endswith('pveam download local "$T"')


def test_template_prefix_is_matched_as_text_and_the_newest_is_downloaded(tmp_path):
    """The command, run by sh against a stand-in pveam: a prefix, not a regex; newest by -V."""
    pveam = tmp_path / "pveam"
    pveam.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "available) printf '%s\\n' 'system  debian-12-standard_12.2-1_amd64.tar.zst' "
        "'system  debian-12-standard_12.12-1_amd64.tar.zst' 'system  debianx12-standard_13.0-1_amd64.tar.zst';;\n"
        'download) echo "download $2 $3";;\n'
        "esac\n"
    )
    pveam.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    for prefix, expected in (("debian-12", "download local debian-12-standard_12.12-1_amd64.tar.zst"),
                             ("debian.12", None)):
        [command] = op_commands(pct.template, storage="local", template=prefix,
                                facts={(PveamTemplates, ("local",)): [], DebianArchitecture: ARCH})
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
        if expected:
            assert done.returncode == 0 and done.stdout.strip() == expected
        else:
            assert done.returncode == 1 and "no template matching debian.12" in done.stderr


def _pick(tmp_path, listing: str, prefix: str, arch: str | None,
          local: list[str] | None = None) -> subprocess.CompletedProcess | list[str]:
    """Plan pct.template for PREFIX on a host of ARCH and run its command with sh against a
    stand-in pveam that prints LISTING for ``available``; the planned commands when none."""
    pveam = tmp_path / "pveam"
    listing_file = tmp_path / "listing.txt"
    listing_file.write_text(listing)
    pveam.write_text("#!/bin/sh\n"
                     'case "$1" in\n'
                     f"available) [ \"$2 $3\" = '--section system' ] && cat '{listing_file}';;\n"
                     'download) echo "download $2 $3";;\n'
                     "esac\n")
    pveam.chmod(0o755)
    commands = op_commands(pct.template, storage="local", template=prefix,
                           facts={(PveamTemplates, ("local",)): local or [], DebianArchitecture: arch})
    if len(commands) != 1:
        return commands
    return subprocess.run(["sh", "-c", commands[0]], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})


PVEAM_8 = (PVE / "8.4" / "pveam_available_system.txt").read_text()
PVEAM_9_2_7 = (PVE / "9.2" / "pveam_available_system.txt").read_text()


@pytest.mark.parametrize("listing", [PVEAM_8, PVEAM_9_2_7], ids=["8.x recorded", "9.2.7 recorded_format"])
def test_template_prefix_picks_the_host_architecture_recorded(tmp_path, listing):
    """pveam available of 8.x (two columns, real) and of 9.2.7+ (three, the architecture last;
    its format, with arm64 rows newer than the amd64 ones): an amd64 host gets amd64."""
    done = _pick(tmp_path, listing, "debian-12-standard", ARCH)
    assert (done.returncode, done.stdout) == (0, "download local debian-12-standard_12.7-1_amd64.tar.zst\n")
    done = _pick(tmp_path, listing, "ubuntu-24", ARCH)
    assert done.stdout == "download local ubuntu-24.10-standard_24.10-1_amd64.tar.zst\n"


def test_template_prefix_on_arm64_never_takes_amd64_recorded_format(tmp_path):
    """An arm64 host: on 9.2.7+ the newest arm64 template of the prefix (column 3); on 8.x's
    listing, which has none, an error naming the architecture, and no download."""
    done = _pick(tmp_path, PVEAM_9_2_7, "debian-1", "arm64")
    assert done.stdout == "download local debian-13-standard_13.2-1_arm64.tar.zst\n"
    done = _pick(tmp_path, PVEAM_8, "debian-12-standard", "arm64")
    assert done.returncode == 1 and "download" not in done.stdout
    assert "no template matching debian-12-standard for architecture arm64" in done.stderr


def test_template_architecture_from_the_name_when_the_column_says_unknown_recorded_format(tmp_path):
    """9.2.7 prints ``unknown`` when the index has no architecture: the name's ``_ARCH.tar``
    decides; and a 2-column listing (8.x's, with an arm64 row added) filters by name too."""
    unknown = PVEAM_9_2_7.replace("arm64\n", "unknown\n")
    assert _pick(tmp_path, unknown, "debian-1", ARCH).stdout == (
        "download local debian-13-standard_13.1-2_amd64.tar.zst\n")
    with_arm = PVEAM_8 + "system          debian-12-standard_12.12-1_arm64.tar.zst\n"
    assert _pick(tmp_path, with_arm, "debian-12", ARCH).stdout == (
        "download local debian-12-standard_12.7-1_amd64.tar.zst\n")


def test_template_on_storage_of_another_architecture_is_not_taken():
    local = ["local:vztmpl/debian-12-standard_12.7-1_arm64.tar.zst"]
    assert pct.find_template(local, "local", "debian-12-standard", "arm64") == local[0]
    assert pct.find_template(local, "local", "debian-12-standard", "amd64") is None
    assert pct.find_template(local, "local", "debian-12-standard", None) == local[0]
    # An exact file name is the user's own choice: taken as it is.
    assert pct.find_template(local, "local", "debian-12-standard_12.7-1_arm64.tar.zst", "amd64") == local[0]


def test_exact_template_name_downloads_that_file():
    assert op_commands(pct.template, storage="local", template="debian-12-standard_12.9-1_amd64.tar.zst",
                       facts={(PveamTemplates, ("local",)): TEMPLATES, DebianArchitecture: ARCH}) == [
        "pveam update && pveam download local debian-12-standard_12.9-1_amd64.tar.zst"
    ]


def test_recorded_missing_container_is_created_with_explicit_unprivileged():
    assert MISSING is None
    commands = op_commands(
        pct.create, vmid=105, storage="local", template="debian-12-standard",
        options={"hostname": "glm5", "cores": "64", "memory": "524288", "swap": "0",
                 "net0": "name=eth0,bridge=vmbr0,ip=dhcp", "onboot": "1",
                 "rootfs": "local-lvm:300", "features": "nesting=1",
                 "mp0": "/tank/models,mp=/models,ro=1"},
        unprivileged=True,
        facts={(PctStatus, (105,)): MISSING, (PveamTemplates, ("local",)): TEMPLATES,
               DebianArchitecture: ARCH},
    )
    assert commands == [
        "pct create 105 local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst --hostname glm5 "
        "--cores 64 --memory 524288 --swap 0 --net0 name=eth0,bridge=vmbr0,ip=dhcp --onboot 1 "
        "--rootfs local-lvm:300 --features nesting=1 --mp0 /tank/models,mp=/models,ro=1 "
        "--unprivileged 1 --start 0"
    ]


def test_existing_container_is_not_recreated():
    assert op_commands(pct.create, vmid=104, storage="local", template="debian-12-standard",
                       options={}, unprivileged=True,
                       facts={(PctStatus, (104,)): RUNNING}) == []


def test_recorded_config_converged_gives_no_command():
    # Proxmox adds hwaddr, type and firewall to net0: the settings' options are a subset.
    assert op_commands(pct.config, vmid=104, options=LIVE_104,
                       facts={(PctConfig, (104,)): CONFIG_104}) == []


def test_recorded_config_changed_keys_are_set_and_only_those():
    options = {**LIVE_104, "cores": "8", "memory": "16384"}
    assert op_commands(pct.config, vmid=104, options=options,
                       facts={(PctConfig, (104,)): CONFIG_104}) == [
        "pct set 104 --cores 8 --memory 16384"
    ]


def test_recorded_config_gpu_devices_take_free_keys_and_leave_user_devices():
    devices = ["/dev/nvidia0,mode=0666", "/dev/nvidiactl,mode=0666", "/dev/nvidia-uvm,mode=0666"]
    commands = op_commands(pct.config, vmid=115, options={}, devices=devices,
                           facts={(PctConfig, (115,)): CONFIG_115})
    assert commands == [
        "pct set 115 --dev4 /dev/nvidia0,mode=0666 --dev5 /dev/nvidiactl,mode=0666 "
        "--dev6 /dev/nvidia-uvm,mode=0666"
    ]
    converged = {**CONFIG_115, "dev4": devices[0], "dev5": devices[1], "dev6": devices[2]}
    assert op_commands(pct.config, vmid=115, options={}, devices=devices,
                       facts={(PctConfig, (115,)): converged}) == []


def test_gpu_no_longer_selected_is_deleted_user_devices_kept():
    current = {**CONFIG_115, "dev4": "/dev/nvidia0,mode=0666", "dev5": "/dev/nvidia1,mode=0666",
               "dev6": "/dev/nvidiactl,mode=0666"}
    assert op_commands(pct.config, vmid=115, options={},
                       devices=["/dev/nvidia0,mode=0666", "/dev/nvidiactl,mode=0666"],
                       facts={(PctConfig, (115,)): current}) == ["pct set 115 --delete dev5"]


def test_recorded_config_mount_keeps_key_of_same_path():
    mounts = ["/mnt/data/ccna,mp=/media/ccna,ro=1", "/tank/models,mp=/models"]
    assert op_commands(pct.config, vmid=115, options={}, mounts=mounts,
                       facts={(PctConfig, (115,)): CONFIG_115}) == [
        "pct set 115 --mp2 /mnt/data/ccna,mp=/media/ccna,ro=1 --mp6 /tank/models,mp=/models"
    ]


@pytest.mark.parametrize("size, expected", [
    (16, []), (32, ["pct resize 115 rootfs 32G"]), (8, []),
])
def test_recorded_rootfs_grows_never_shrinks(size, expected):
    assert op_commands(pct.rootfs_size, vmid=115, size_gib=size,
                       facts={(PctConfig, (115,)): CONFIG_115}) == expected


@pytest.mark.parametrize("status, restart, expected", [
    (None, False, ["pct start 105"]),            # just created
    ("stopped", True, ["pct start 105"]),        # a start picks the new config up: no reboot
    ("running", True, ["pct reboot 105"]),       # config changed: exactly one restart
    ("running", False, []),                      # converged: nothing
])
def test_power_starts_or_restarts_once(status, restart, expected):
    assert op_commands(pct.power, vmid=105, restart=lambda: restart,
                       facts={(PctStatus, (105,)): status}) == expected


def test_recorded_raw_lines_added_to_pve_conf_and_converged_after():
    owned_fn = owned_by_gpu_passthrough({"nvidia": 195, "nvidia-uvm": 238, "nvidia-caps": 241})
    lines = ["lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 238:* rwm",
             "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"]
    conf = recorded("pve_pct_config_104_pct-notes.txt").splitlines()
    path = "/etc/pve/lxc/104.conf"
    # files.put's own facts: the conf is replaced whole (pmxcfs takes a write, not an edit).
    put_facts = {(File, (path,)): None, (Directory, (path,)): None,
                 (Directory, ("/etc/pve/lxc",)): {"mode": 755}}
    commands = op_commands(owned.lines, path=path, lines=lines, owned=owned_fn,
                           facts={(FileContents, (path,)): conf, **put_facts})
    upload = [c for c in commands if isinstance(c, list) and c[0] == "upload"]
    assert len(upload) == 1 and upload[0][2] == "/etc/pve/lxc/104.conf"
    assert upload[0][1].splitlines()[-3:] == lines
    assert op_commands(owned.lines, path="/etc/pve/lxc/104.conf", lines=lines, owned=owned_fn,
                       facts={(FileContents, ("/etc/pve/lxc/104.conf",)): conf + lines}) == []


def test_lxc_container_built_in_staging_and_moved_into_place_config_last():
    facts = {(LxcContainerStatus, ("c1", "/var/lib/lxc")): None}
    stage = "/var/lib/lxc/.pve-sglang-staging/c1"
    template = op_commands(lxc.create, container="c1", lxc_path="/var/lib/lxc",
                           release="bookworm", facts=facts)
    assert "lxc-create -P /var/lib/lxc/.pve-sglang-staging -n c1 -t debian -- -r bookworm" in template
    assert f"ln -sf /dev/null {stage}/rootfs/etc/systemd/system/ssh.service" in template
    assert f"mv {stage}/rootfs /var/lib/lxc/c1/rootfs" in template
    # The config moves in last: a run stopped before leaves no container, and the next builds it.
    assert template[-1].startswith(f"{{ grep -v '^lxc.rootfs.path' {stage}/config ; printf '%s\\n' "
                                   "'lxc.rootfs.path = dir:/var/lib/lxc/c1/rootfs' ; } >")
    assert f"mv {stage}/config.final /var/lib/lxc/c1/config" in template[-1]
    unprivileged = op_commands(lxc.create, container="c1", lxc_path="/var/lib/lxc",
                               release="bookworm", rootfs_tarball="/srv/rootfs.tar.zst",
                               hostname="box", idmap_base=100000, facts=facts)
    assert any(c.startswith(f"mkdir -p {stage}/rootfs && tar -xpf /srv/rootfs.tar.zst") for c in unprivileged)
    assert f"printf '%s\\n' box > {stage}/rootfs/etc/hostname" in unprivileged
    assert ("lxc-usernsexec -m b:0:100000:65536 -- tar -C /var/lib/lxc/c1/rootfs --numeric-owner "
            f"-xpf - < {stage}/rootfs.tar") in unprivileged
    assert not any(c.startswith("mv ") and "rootfs " in c for c in unprivileged)
    assert op_commands(lxc.create, container="c1", lxc_path="/var/lib/lxc", release="bookworm",
                       facts={(LxcContainerStatus, ("c1", "/var/lib/lxc")): "RUNNING"}) == []


#: After RUNNING, the wait for systemd's boot (its cleaning of /tmp raced the first commands).
BOOTED = (" && { timeout 120 lxc-attach -P /l -n c1 -- systemctl is-system-running --wait "
          ">/dev/null 2>&1 || true; }")


@pytest.mark.parametrize("status, restart, expected", [
    ("STOPPED", False, ["lxc-start -P /l -n c1 && lxc-wait -P /l -n c1 -s RUNNING -t 60" + BOOTED]),
    ("RUNNING", True, ["lxc-stop -P /l -n c1 -t 120 && lxc-start -P /l -n c1 && "
                       "lxc-wait -P /l -n c1 -s RUNNING -t 60" + BOOTED]),
    ("RUNNING", False, []),
])
def test_lxc_power(status, restart, expected):
    assert op_commands(lxc.power, container="c1", lxc_path="/l", restart=lambda: restart,
                       facts={(LxcContainerStatus, ("c1", "/l")): status}) == expected


@pytest.mark.parametrize("pending, keys", [
    ({}, []),
    ({"dev6": ("del", "/dev/nvidia1,mode=0666")}, ["dev6"]),
    ({"dev10": ("new", "/dev/nvidia2,mode=0666"), "dev2": ("del", "/dev/nvidia-uvm")},
     ["dev2", "dev10"]),
    ({"features": ("new", "nesting=1"), "mp1": ("del", "/tank,mp=/tank")}, ["features", "mp1"]),
    # The user's own pending changes are theirs: no restart for them.
    ({"dev3": ("new", "/dev/dri/renderD128"), "memory": ("new", "2048"),
      "description": ("new", "x")}, []),
])
def test_pending_restart_keys(pending, keys):
    from pve_sglang.operations.pct import pending_restart_keys

    assert pending_restart_keys(pending) == keys
