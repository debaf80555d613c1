"""Proxmox and plain-LXC container operations: recorded facts in, commands out.

There is no Proxmox host here: the ``pct``/``pveam`` outputs are recorded real outputs from
public sources (tests/fixtures/public, see its README), parsed by the real fact classes.
The plain cases (arguments and facts, the exact commands) are data, one file a case:
operations/MODULE.OPERATION/ beside this file, run by test_operation_cases.py.
"""

import subprocess
from pathlib import Path

import pytest

from harness import fact_value, op_commands
from pve_sglang.container_config.owned_lines import owned_by_gpu_passthrough
from pve_sglang.facts.pve import LxcContainerStatus, PctStatus, PveamTemplates
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


TEMPLATES = fact_value(PveamTemplates, recorded("pve_pveam_list_local_notes-ru.txt"))


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


def test_recorded_pct_status_of_a_missing_container_is_none():
    """The fact the create cases read (operations/pct.create/): pct status of a container that
    does not exist, recorded, is no status."""
    assert fact_value(PctStatus, recorded("pve_pct_missing_ct_pve-nas-issue6.txt")) is None


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
