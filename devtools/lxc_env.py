"""
A real LXC test environment on this machine: Debian 12 containers booted with systemd as PID 1.

+ The root filesystem is built once with ``debootstrap --variant=minbase`` and cached as a zstd
  tarball under ``<repo>/.cache/rootfs/`` (its name carries a hash of the package list, so a
  changed list builds a new one). Building takes about a minute.
+ Each test session extracts it once into a private temporary LXC path (``base/``, a few
  seconds) and adds what must not be baked into the cache: the host's ``resolv.conf`` and
  ``hosts``, and the machine's CA certificates (``/usr/local/share/ca-certificates/*.crt``,
  then ``update-ca-certificates``) so that pip works inside.
+ Containers use ``base/`` as the read-only lower layer of an overlay rootfs: creating one is
  writing a config, and resetting one is wiping its upper layer (well under a second).
+ Every container has a network namespace of its own, never the host's: LXC's command socket
  is an abstract UNIX socket named after the LXC path and the container's name
  (``@/var/lib/lxc/NAME/command``), and abstract sockets belong to a network namespace, so in
  the host's one an LXC tool inside a test container would reach the host's containers of that
  name (a running ``pve-sglang-demo``). ``network="loopback"`` (the default): loopback only.
  ``network="bridge"``: a veth on LXC's NAT bridge ``lxcbr0`` (lxc-net) with a static address
  of its own (``LxcContainer.address``), for a container that downloads or that the host reaches.
+ Downloads inside the containers retry: apt (``Acquire::Retries``) and pip (``/etc/pip.conf``:
  retries, timeout, resumed downloads) are told so in the base; the rootfs build retries
  debootstrap.

Cgroups: this machine is a hybrid cgroup v1 host (the devices controller is on v1), where a plain
``lxc-start`` boots systemd fine and applies ``lxc.cgroup.devices.*`` (v1) rules, ignoring the
``lxc.cgroup2.*`` ones. ``LxcContainer.start(cgroup="v2")`` starts the container in a private
mount namespace whose ``/sys/fs/cgroup`` is a pure cgroup2 mount, as on Proxmox VE 7+, so that
``lxc.cgroup2.devices.*`` rules apply. A plain ``lxc-attach`` (and so the ``@lxc`` connector)
reaches containers started either way.
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

#: The checkout this module is in (devtools/lxc_env.py): the cache is the checkout's.
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Where the rootfs tarball is cached: PVE_SGLANG_ROOTFS_CACHE (e.g. to time a cold build), else
#: rootfs/ in the tests' cache (PVE_SGLANG_TEST_CACHE, else the checkout's .cache/).
CACHE_DIR = Path(os.environ.get("PVE_SGLANG_ROOTFS_CACHE")
                 or Path(os.environ.get("PVE_SGLANG_TEST_CACHE") or REPO_ROOT / ".cache") / "rootfs")

#: The Debian release of the tests' containers; SUITES: every release a test may ask for
#: (Debian 12, the Proxmox VE 8 templates; Debian 13, Proxmox VE 9's).
SUITE = "bookworm"
SUITES = ("bookworm", "trixie")
#: Packages on top of minbase: systemd as init, Python for venvs/pip, what deploys and service
#: tests use. Changing this list changes the tarball name, so the cache rebuilds by itself.
PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "ca-certificates",
    "iproute2",
    "python3",
    "python3-venv",
    "procps",
    "curl",
    "sudo",
    "openssh-server",  # disabled in every container; a test that needs it starts it
)
#: Removed from the built rootfs before packing (downloaded .debs, apt lists, docs).
PRUNE: tuple[str, ...] = (
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin",
    "var/lib/apt/lists/*_*",
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/locale/*",
)
BUILD_FORMAT = "2"  # bump when the build steps change

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Unprivileged containers: container ids 0-65535 are host ids 100000-165535.
USERNS_BASE_ID = 100000
USERNS_SIZE = 65536
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
#: Pauses (seconds) before the second and third debootstrap of a rootfs build: a mirror's slow
#: answer must not fail the test session.
DEBOOTSTRAP_PAUSES_S = (10, 30)
#: Downloads inside the containers retry (test-time additions to the base, never in the tarball).
APT_RETRIES = 'Acquire::Retries "5";\nAcquire::http::Timeout "60";\nAcquire::https::Timeout "60";\n'
#: pip of any release reads /etc/pip.conf (venvs too) and ignores what it does not know
#: (``resume-retries`` came with pip 25.1).
PIP_RETRIES = "[global]\nretries = 10\ntimeout = 60\nresume-retries = 5\n"

# Networks. A container never shares the host's network namespace (see the module's text).
NETWORKS = ("loopback", "bridge")
#: LXC's NAT bridge (lxc-net) that ``network="bridge"`` containers join.
BRIDGE = "lxcbr0"
LXC_NET = Path("/usr/libexec/lxc/lxc-net")
DNSMASQ_LEASES = Path(f"/var/lib/misc/dnsmasq.{BRIDGE}.leases")
#: Host numbers on the bridge's subnet that ``network="bridge"`` containers take: static (the
#: rootfs has no DHCP client), below the deploy tests' own (.201, .202), none leased by
#: lxc-net's dnsmasq or seen on the bridge, each held by a lock file while the container exists.
BRIDGE_HOSTS = range(150, 200)
ADDRESS_LOCKS = Path("/run/lock/pve-sglang-tests")

#: LXC's default path, where ``make deploy`` leaves the containers it creates.
DEFAULT_LXC_PATH = Path("/var/lib/lxc")
#: In a container folder that this suite made outside its private LXC path: the owner's pid.
CONTAINER_OWNER_FILE = "pve-sglang-tests.owner"

#: Seconds spent in named steps and how often, printed at the end of the session (tests/conftest.py).
TIMINGS: dict[str, list[float]] = {}


def log(message: str) -> None:
    print(f"[lxc_env] {message}", file=sys.stderr, flush=True)


def _timed(name: str, seconds: float) -> None:
    TIMINGS.setdefault(name, []).append(seconds)


def timing_lines() -> list[str]:
    """One line per timed step: total, and count and mean when it ran more than once."""
    lines = []
    for name, values in TIMINGS.items():
        if len(values) == 1:
            lines.append(f"{name}: {values[0]:.2f}s")
        else:
            mean = sum(values) / len(values)
            lines.append(
                f"{name}: {len(values)}x, mean {mean:.2f}s, max {max(values):.2f}s",
            )
    return lines


def _run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("check", True)
    return subprocess.run(list(cmd), **kwargs)


def missing_requirements() -> list[str]:
    """What this machine lacks to run the LXC tests (empty: all there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in ("lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "debootstrap", "zstd", "tar"):
        if not shutil.which(tool):
            missing.append(tool)
    if "overlay" not in Path("/proc/filesystems").read_text():
        missing.append("overlay filesystem")
    return missing


def host_cgroup_layout() -> str:
    """``"v2"`` on a pure cgroup2 host, ``"v1"`` when the devices controller is on cgroup v1."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "v2"
    return "v1"


# Root filesystem tarball
#


def rootfs_key(suite: str = SUITE) -> str:
    text = "\n".join([BUILD_FORMAT, suite, *PACKAGES, "--", *PRUNE])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tarball_path(suite: str = SUITE) -> Path:
    return CACHE_DIR / f"debian-{suite}-minbase-{rootfs_key(suite)}.tar.zst"


@contextmanager
def _cache_lock() -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def disable_sshd(rootfs: Path) -> None:
    """
    Keep sshd from starting at boot: a test that needs it configures it and starts it itself,
    and no container made from the tarball (the deploy tests' too) listens for logins nobody
    asked for. Done at build time so that every user of the tarball gets it.
    """
    for pattern in (
        "etc/systemd/system/*.wants/ssh.service",
        "etc/systemd/system/*.wants/ssh.socket",
        "etc/systemd/system/sshd.service",
        "etc/rc?.d/[SK]*ssh",
    ):
        for path in glob.glob(str(rootfs / pattern)):
            os.unlink(path)


def debootstrap(rootfs: Path, pauses_s: Sequence[float] = DEBOOTSTRAP_PAUSES_S,
                suite: str = SUITE) -> None:
    """Debootstrap the Debian SUITE rootfs into ROOTFS; tried again from scratch after each of
    PAUSES_S (debootstrap gives up on one failed download), the last failure raised."""
    for attempt in range(len(pauses_s) + 1):
        log(f"building Debian {suite} rootfs with debootstrap (about a minute) ...")
        result = _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite,
             str(rootfs)],
            check=False, capture_output=True, text=True,
        )
        if result.returncode == 0:
            return
        output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        if attempt == len(pauses_s):
            raise RuntimeError(f"debootstrap failed ({result.returncode}), "
                               f"{attempt + 1} tries:\n{output}")
        log(f"debootstrap failed ({result.returncode}); again in {pauses_s[attempt]}s:\n"
            f"{output[-800:]}")
        remove_tree(rootfs)
        time.sleep(pauses_s[attempt])


def build_rootfs_tarball(dest: Path, suite: str = SUITE) -> None:
    """Debootstrap a Debian SUITE rootfs, prune it and pack it as ``dest`` (zstd tar)."""
    build_dir = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE_DIR))
    rootfs = build_dir / "rootfs"
    try:
        started = time.monotonic()
        debootstrap(rootfs, suite=suite)
        debootstrap_s = time.monotonic() - started

        disable_sshd(rootfs)
        for pattern in PRUNE:
            for path in glob.glob(str(rootfs / pattern)):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)

        pack_started = time.monotonic()
        partial = dest.with_suffix(".partial")
        _run(
            [
                "tar",
                "-C",
                str(rootfs),
                "--numeric-owner",
                "--xattrs",
                "--xattrs-include=*",
                "-I",
                "zstd -T0 -3",
                "-cf",
                str(partial),
                ".",
            ],
        )
        os.replace(partial, dest)
        for stale in CACHE_DIR.glob(f"debian-{suite}-minbase-*.tar.zst"):
            if stale != dest:
                stale.unlink()
        pack_s = time.monotonic() - pack_started
        total = time.monotonic() - started
        _timed("rootfs build (cold): debootstrap", debootstrap_s)
        _timed("rootfs build (cold): prune+pack", pack_s)
        log(
            f"rootfs tarball {dest.name}: {dest.stat().st_size / 1e6:.0f} MB, built in "
            f"{total:.1f}s (debootstrap {debootstrap_s:.1f}s, pack {pack_s:.1f}s)",
        )
    finally:
        remove_tree(build_dir)


def ensure_rootfs_tarball(suite: str = SUITE) -> Path:
    """The cached rootfs tarball of Debian SUITE, built first if it is not there (serialised
    by a file lock)."""
    dest = tarball_path(suite)
    with _cache_lock():
        if not dest.exists():
            build_rootfs_tarball(dest, suite)
        else:
            log(f"using cached rootfs {dest}")
    return dest


def extract_rootfs(tarball: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    _run(
        [
            "tar",
            "-C",
            str(dest),
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=*",
            "-I",
            "zstd",
            "-xf",
            str(tarball),
        ],
    )


def prepare_base(base: Path) -> None:
    """Test-time additions to an extracted rootfs (never baked into the cached tarball)."""
    for name in ("resolv.conf", "hosts"):
        source = Path("/etc") / name
        target = base / "etc" / name
        if source.exists():
            if target.is_symlink() or target.exists():
                target.unlink()
            shutil.copyfile(source, target)

    certs = sorted(HOST_CA_DIR.glob("*.crt")) if HOST_CA_DIR.is_dir() else []
    if certs:
        target_dir = base / "usr/local/share/ca-certificates"
        target_dir.mkdir(parents=True, exist_ok=True)
        for cert in certs:
            shutil.copyfile(cert, target_dir / cert.name)
        _run(
            ["chroot", str(base), "update-ca-certificates"],
            capture_output=True,
            env={"PATH": CONTAINER_PATH},
        )

    (base / "etc/apt/apt.conf.d/80-pve-sglang-tests-retries").write_text(APT_RETRIES)
    (base / "etc/pip.conf").write_text(PIP_RETRIES)

    # No apt runs of its own while tests use apt/dpkg.
    systemd_dir = base / "etc/systemd/system"
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer"):
        link = systemd_dir / unit
        if not link.exists() and not link.is_symlink():
            link.symlink_to("/dev/null")


def shift_ids(root: Path, offset: int) -> None:
    """Add ``offset`` to every owner and group under ``root`` (keeping setuid/setgid bits)."""
    for dirpath, dirnames, filenames in os.walk(root):
        paths = [dirpath]
        paths += [os.path.join(dirpath, name) for name in filenames]
        paths += [os.path.join(dirpath, d) for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for path in paths:
            st = os.lstat(path)
            os.lchown(path, st.st_uid + offset, st.st_gid + offset)
            if not os.path.islink(path) and st.st_mode & 0o6000:
                os.chmod(path, st.st_mode & 0o7777)  # chown cleared them



def remove_tree(path: Path | str) -> None:
    """``rm -rf`` PATH in a child process, not crossing into another filesystem (a mount left
    in a rootfs). Not ``shutil.rmtree``: in a pytest-xdist worker (gevent patched) removing
    a container's tree left thousands of its directories open (EMFILE in that worker's later
    tests); a child's descriptors end with it. Errors are ignored, as ``ignore_errors``."""
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def reachable_by_container_root(folder: Path) -> None:
    """Make FOLDER walkable by an unprivileged container's root (an unmapped uid): every
    folder above it gets ``o+x`` (pytest's temporary folders are 0700)."""
    for parent in [folder, *folder.parents]:
        if parent.stat().st_mode & 0o001 == 0:
            parent.chmod(parent.stat().st_mode | 0o011)


def root_has_subids() -> bool:
    """Whether /etc/subuid and /etc/subgid give root the unprivileged range used here."""
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            entries = Path(path).read_text().splitlines()
        except FileNotFoundError:
            return False
        ok = False
        for entry in entries:
            parts = entry.strip().split(":")
            if len(parts) == 3 and parts[0] in ("root", "0") and parts[1].isdigit():
                start, count = int(parts[1]), int(parts[2])
                ok |= start <= USERNS_BASE_ID and USERNS_BASE_ID + USERNS_SIZE <= start + count
        if not ok:
            return False
    return True


# Networks
#


def bridge_interface() -> ipaddress.IPv4Interface:
    """The bridge's IPv4 address and prefix (the gateway of ``network="bridge"`` containers).
    A missing bridge is made by starting lxc-net, as the embedded default's deploy does."""
    if not Path(f"/sys/class/net/{BRIDGE}").exists() and LXC_NET.exists():
        log(f"{BRIDGE} is missing: starting lxc-net")
        _run([str(LXC_NET), "start"], check=False, capture_output=True)
    done = _run(["ip", "-j", "-4", "addr", "show", "dev", BRIDGE], check=False,
                capture_output=True, text=True)
    found = [f"{a['local']}/{a['prefixlen']}" for entry in json.loads(done.stdout or "[]")
             for a in entry.get("addr_info", [])]
    if done.returncode != 0 or not found:
        raise LxcError(f'network="bridge" needs LXC\'s bridge {BRIDGE} (lxc-net, from the lxc '
                       f"package) with an IPv4 address; ip says: {done.stderr.strip() or found}")
    return ipaddress.IPv4Interface(found[0])


def taken_on_bridge() -> set[str]:
    """Addresses lxc-net's dnsmasq has leased or that answer on the bridge now."""
    taken = set()
    if DNSMASQ_LEASES.exists():
        taken |= {line.split()[2] for line in DNSMASQ_LEASES.read_text().splitlines()
                  if len(line.split()) > 2}
    done = _run(["ip", "-j", "neigh", "show", "dev", BRIDGE], check=False, capture_output=True,
                text=True)
    for entry in json.loads(done.stdout or "[]") if done.returncode == 0 else []:
        if not set(entry.get("state", [])) & {"FAILED", "INCOMPLETE"}:
            taken.add(entry["dst"])
    return taken


#: The turn of tests that share this machine's LXC and network (``machine_turn``): its files.
MACHINE_TURN, MACHINE_TURNSTILE = "machine.lock", "machine.turnstile"


#: How long a test waits for its turn before the run stops, naming who holds it (another
#: pytest on this machine whose test hangs, say).
MACHINE_TURN_WAIT_S = 1800


def lock_holders(path: Path) -> list[str]:
    """``pid command`` of each process holding a flock on PATH (from /proc/locks)."""
    inode = f":{path.stat().st_ino} "
    holders = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if inode in line and "->" not in fields[:2]:
            pid = fields[4]
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                command = "?"
            holders.append(f"{pid} {command.strip()[:160]}")
    return holders


def _flock_within(handle, path: Path, mode: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise LxcError(f"the machine's test turn ({path}) was not had in {seconds:.0f} s; "
                               f"held by: {'; '.join(lock_holders(path)) or 'nobody now'}") from None
            time.sleep(0.2)


@contextmanager
def machine_turn(exclusive: bool, wait_s: float = MACHINE_TURN_WAIT_S,
                 folder: Path = ADDRESS_LOCKS) -> Iterator[None]:
    """Hold this machine's shared resources (lxc-net's bridge, /var/lib/lxc) for one test:
    shared with other tests (other pytest workers run theirs meanwhile), or EXCLUSIVE (a test
    that restarts lxc-net runs alone). A reader-writer lock across processes: an exclusive turn
    first closes the turnstile, which every shared turn passes, so that it is not starved.
    Waiting longer than WAIT_S raises, naming the processes that hold the turn."""
    folder.mkdir(parents=True, exist_ok=True)
    gate, main = folder / MACHINE_TURNSTILE, folder / MACHINE_TURN
    with open(gate, "a") as turnstile, open(main, "a") as turn:
        if exclusive:
            _flock_within(turnstile, gate, fcntl.LOCK_EX, wait_s)
            _flock_within(turn, main, fcntl.LOCK_EX, wait_s)
        else:
            _flock_within(turnstile, gate, fcntl.LOCK_SH, wait_s)
            _flock_within(turn, main, fcntl.LOCK_SH, wait_s)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # closing the files gives both back


def reserve_address(bridge: ipaddress.IPv4Interface):
    """A free address on BRIDGE's subnet and the open lock file that holds it (closing the file,
    or the process ending, gives it back)."""
    ADDRESS_LOCKS.mkdir(parents=True, exist_ok=True)
    taken = taken_on_bridge()
    for host in BRIDGE_HOSTS:
        address = bridge.network.network_address + host
        if address not in bridge.network or address == bridge.ip or str(address) in taken:
            continue
        lock = open(ADDRESS_LOCKS / f"{address}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return ipaddress.IPv4Interface(f"{address}/{bridge.network.prefixlen}"), lock
    raise LxcError(f"no free address for a test container on {BRIDGE} ({bridge.network}, hosts "
                   f"{BRIDGE_HOSTS.start}-{BRIDGE_HOSTS.stop - 1}): all leased, answering or held")


# Containers
#


def state_of(lxc_path: Path, name: str) -> str:
    """``lxc-info``'s state of container NAME under LXC_PATH (``RUNNING``, ``STOPPED``, ...),
    ``MISSING`` when there is none."""
    result = _run(["lxc-info", "-P", str(lxc_path), "-n", name, "-s"], check=False,
                  capture_output=True, text=True)
    for line in result.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "State":
            return value.strip()
    return "MISSING"


class LxcError(RuntimeError):
    pass


@dataclass
class LxcContainer:
    """One container of an ``LxcEnv``: overlay rootfs on the env's base, a network namespace of
    its own (``network``: ``"loopback"`` or ``"bridge"``, then at ``address``)."""

    env: LxcEnv
    name: str
    extra_config: list[str] = field(default_factory=list)
    unprivileged: bool = False
    started_cgroup: str | None = None
    network: str = "loopback"
    #: With ``network="bridge"``: its address on the bridge (with the prefix) and the gateway.
    address: ipaddress.IPv4Interface | None = None
    gateway: ipaddress.IPv4Address | None = None
    #: Another LXC path than the env's (``DEFAULT_LXC_PATH`` for a namesake of a deploy's).
    path: Path | None = None
    _address_lock: object = field(default=None, repr=False)

    @property
    def lxc_path(self) -> Path:
        return self.path or self.env.lxc_path

    @property
    def dir(self) -> Path:
        return self.lxc_path / self.name

    @property
    def config_path(self) -> Path:
        return self.dir / "config"

    @property
    def log_path(self) -> Path:
        return self.dir / "lxc.log"

    @property
    def inventory_name(self) -> str:
        """pyinfra inventory name for the ``@lxc`` connector."""
        return f"@lxc/{self.name}"

    def host_data(self) -> dict:
        """Host data the ``@lxc`` connector needs for this container."""
        return {"lxc_name": self.name, "lxc_path": str(self.lxc_path), "lxc_local": True}

    # Config and rootfs

    def write_config(self, extra_config: Sequence[str] | None = None) -> None:
        """(Re)write the LXC config; ``extra_config`` lines (``key = value``) go last."""
        if extra_config is not None:
            self.extra_config = list(extra_config)
        lower = self.env.userns_base() if self.unprivileged else self.env.base
        lines = [
            "lxc.include = /usr/share/lxc/config/common.conf",
            "lxc.arch = linux64",
            f"lxc.uts.name = {self.name}",
            f"lxc.rootfs.path = overlay:{lower}:{self.dir / 'delta'}",
            "lxc.apparmor.profile = unconfined",
            "lxc.autodev = 1",
            "lxc.tty.max = 0",
            "lxc.pty.max = 64",
        ]
        if self.unprivileged:
            # A user namespace cannot mount sysfs in the host's network namespace: give it an
            # own one with loopback only.
            lines += [
                "lxc.include = /usr/share/lxc/config/userns.conf",
                f"lxc.idmap = u 0 {USERNS_BASE_ID} {USERNS_SIZE}",
                f"lxc.idmap = g 0 {USERNS_BASE_ID} {USERNS_SIZE}",
            ]
        lines += self.network_config()
        lines += self.extra_config
        self.config_path.write_text("\n".join(lines) + "\n")

    def network_config(self) -> list[str]:
        """The ``lxc.net.0.*`` lines: an own network namespace, never the host's (``none``)."""
        if self.network == "loopback":
            return ["lxc.net.0.type = empty"]
        assert self.address is not None and self.gateway is not None
        last = self.address.ip.packed[-2:]  # a MAC of its own per address
        return [
            "lxc.net.0.type = veth",
            f"lxc.net.0.link = {BRIDGE}",
            "lxc.net.0.name = eth0",
            "lxc.net.0.flags = up",
            f"lxc.net.0.hwaddr = 00:16:3e:7e:{last[0]:02x}:{last[1]:02x}",
            f"lxc.net.0.ipv4.address = {self.address.with_prefixlen}",
            f"lxc.net.0.ipv4.gateway = {self.gateway}",
        ]

    def _fresh_rootfs(self) -> None:
        for sub in ("delta", "work"):
            remove_tree(self.dir / sub)
        etc = self.dir / "delta" / "etc"
        etc.mkdir(parents=True)
        (etc / "hostname").write_text(f"{self.name}\n")
        hosts = (self.env.base / "etc/hosts").read_text() if (self.env.base / "etc/hosts").exists() else ""
        (etc / "hosts").write_text(f"{hosts.rstrip()}\n127.0.1.1\t{self.name}\n")
        if self.unprivileged:
            (self.dir / "work").mkdir()
            for path in (self.dir / "delta", self.dir / "work", etc, etc / "hostname", etc / "hosts"):
                os.lchown(path, USERNS_BASE_ID, USERNS_BASE_ID)

    # Lifecycle

    def state(self) -> str:
        return state_of(self.lxc_path, self.name)

    def start(self, cgroup: str = "host", wait: bool = True, timeout: float = 60) -> None:
        """
        Start the container. ``cgroup="host"``: a plain ``lxc-start`` (this machine's layout);
        ``"v2"``: in a private mount namespace with a pure cgroup2 ``/sys/fs/cgroup``.
        With ``wait``, return once systemd says ``running`` or ``degraded``.
        """
        started = time.monotonic()
        lxc_start = [
            "lxc-start",
            "-P",
            str(self.lxc_path),
            "-n",
            self.name,
            "-l",
            "INFO",
            "-o",
            str(self.log_path),
        ]
        if cgroup == "v2" and host_cgroup_layout() != "v2":
            script = (
                "umount -l /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && "
                'exec "$@"'
            )
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *lxc_start]
        elif cgroup in ("host", "v2", "v1"):
            if cgroup == "v1" and host_cgroup_layout() == "v2":
                raise LxcError("cgroup v1 rules cannot be tested on a pure cgroup2 host")
            cmd = lxc_start
        else:
            raise ValueError(f"cgroup must be 'host', 'v1' or 'v2', not {cgroup!r}")

        env = None
        if self.unprivileged and not root_has_subids():
            # LXC maps ids with newuidmap when it is on PATH, which refuses ranges that
            # /etc/subuid does not give root; without it, LXC (as root) writes the maps itself.
            env = {**os.environ, "PATH": f"{self.env.no_subid_bin()}:/usr/sbin:/sbin"}
            cmd = [shutil.which(cmd[0]) or cmd[0], *cmd[1:]]
        result = _run(cmd, check=False, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise LxcError(
                f"lxc-start {self.name} failed ({result.returncode}): {result.stderr}\n"
                f"{self.log_tail()}",
            )
        self.started_cgroup = host_cgroup_layout() if cgroup == "host" else cgroup
        if wait:
            self.wait_ready(timeout)
        _timed("container boot (start to systemd running)", time.monotonic() - started)

    def wait_ready(self, timeout: float = 60) -> str:
        """Wait until ``systemctl is-system-running`` says running or degraded; return it."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            result = self.attach(["systemctl", "is-system-running"], check=False, timeout=10)
            last = (result.stdout or "").strip() or (result.stderr or "").strip()
            if last in ("running", "degraded"):
                return last
            time.sleep(0.2)
        raise LxcError(f"{self.name}: systemd not up after {timeout}s (last: {last!r})\n{self.log_tail()}")

    def stop(self, kill: bool = True) -> None:
        if self.state() == "STOPPED" or self.state() == "MISSING":
            return
        args = ["lxc-stop", "-P", str(self.lxc_path), "-n", self.name]
        if kill:
            args.append("-k")
        else:
            args.extend(["-t", "30"])
        _run(args, check=False, capture_output=True)

    def reset(self, cgroup: str | None = None, wait: bool = True) -> None:
        """Back to the pristine rootfs (upper layer wiped) and started again."""
        started = time.monotonic()
        self.stop()
        self._fresh_rootfs()
        self.start(cgroup=cgroup or "host", wait=wait)
        _timed("container reset (stop, wipe, boot)", time.monotonic() - started)

    def destroy(self) -> None:
        self.stop()
        remove_tree(self.dir)
        self.env.containers.pop(self.name, None)
        if self._address_lock is not None:
            self._address_lock.close()
            self._address_lock = None

    # Running things inside (test helpers; the connector code path is pyinfra's)

    def attach(
        self,
        command: Sequence[str] | str,
        check: bool = True,
        input: bytes | str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess:
        """Run a command inside with ``lxc-attach --clear-env`` (a string goes to ``sh -c``)."""
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        text = not isinstance(input, bytes)
        return _run(
            [
                "lxc-attach",
                "-P",
                str(self.lxc_path),
                "-n",
                self.name,
                "--clear-env",
                "-v",
                f"PATH={CONTAINER_PATH}",
                "-v",
                "HOME=/root",
                "--",
                *argv,
            ],
            check=check,
            input=input,
            capture_output=True,
            text=text,
            timeout=timeout,
        )

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


ENV_PREFIX = "pve-sglang-lxc-"
OWNER_FILE = "owner.pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def remove_stale_envs(parent: Path | None = None, lxc_path: Path = DEFAULT_LXC_PATH) -> None:
    """Stop and remove LXC envs left by test sessions that died (their owner pid is gone), and
    the containers such a session made under LXC_PATH (those holding its owner file, no other)."""
    for owner_file in lxc_path.glob(f"*/{CONTAINER_OWNER_FILE}"):
        owner = _owner(owner_file)
        if owner is None or _pid_alive(owner):
            continue
        container = owner_file.parent
        log(f"removing stale test container {container} (owner {owner} is gone)")
        _run(["lxc-stop", "-P", str(lxc_path), "-n", container.name, "-k"], check=False,
             capture_output=True)
        remove_tree(container)
    parent = parent or Path(tempfile.gettempdir())
    for env_dir in parent.glob(f"{ENV_PREFIX}*"):
        try:
            owner = int((env_dir / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        log(f"removing stale LXC env {env_dir} (owner {owner} is gone)")
        for config in env_dir.glob("*/config"):
            _run(
                ["lxc-stop", "-P", str(env_dir), "-n", config.parent.name, "-k"],
                check=False,
                capture_output=True,
            )
        remove_tree(env_dir)


class LxcEnv:
    """A private LXC path holding the extracted base rootfs and the test containers."""

    def __init__(self, lxc_path: Path | None = None, tarball: Path | None = None):
        started = time.monotonic()
        remove_stale_envs()
        self.tarball = tarball or ensure_rootfs_tarball()
        self.lxc_path = lxc_path or Path(tempfile.mkdtemp(prefix=ENV_PREFIX))
        self.lxc_path.chmod(0o755)  # unprivileged containers' root must traverse it
        (self.lxc_path / OWNER_FILE).write_text(f"{os.getpid()}\n")
        self.base = self.lxc_path / "base"
        self.containers: dict[str, LxcContainer] = {}
        self._counter = 0
        self._userns_base: Path | None = None
        extract_started = time.monotonic()
        extract_rootfs(self.tarball, self.base)
        prepare_base(self.base)
        _timed("session base rootfs (extract tarball + CA certs)", time.monotonic() - extract_started)
        _timed("lxc env setup total", time.monotonic() - started)
        atexit.register(self.close)

    def userns_base(self) -> Path:
        """The base rootfs with ids shifted for unprivileged containers (made on first use)."""
        if self._userns_base is None:
            started = time.monotonic()
            path = self.lxc_path / "base-userns"
            extract_rootfs(self.tarball, path)
            prepare_base(path)
            # Mounting debugfs is not allowed in a user namespace: do not try.
            (path / "etc/systemd/system/sys-kernel-debug.mount").symlink_to("/dev/null")
            shift_ids(path, USERNS_BASE_ID)
            self._userns_base = path
            _timed("unprivileged base rootfs (extract + shift ids)", time.monotonic() - started)
        return self._userns_base

    def no_subid_bin(self) -> Path:
        """A PATH directory with /usr/bin's tools except newuidmap and newgidmap."""
        path = self.lxc_path / "bin-no-newidmap"
        if not path.exists():
            path.mkdir()
            for tool in Path("/usr/bin").iterdir():
                if tool.name not in ("newuidmap", "newgidmap"):
                    (path / tool.name).symlink_to(tool)
        return path

    def new_name(self, prefix: str = "t") -> str:
        self._counter += 1
        return f"pvs-{prefix}-{os.getpid()}-{self._counter}"

    def create(
        self,
        name: str | None = None,
        extra_config: Sequence[str] = (),
        start: bool = True,
        cgroup: str = "host",
        unprivileged: bool = False,
        network: str = "loopback",
        lxc_path: Path | None = None,
    ) -> LxcContainer:
        """
        Create a container (and by default start it and wait for systemd). ``unprivileged``:
        ids mapped to 100000+ on the host. ``network``: ``"loopback"`` (a network namespace
        with loopback only) or ``"bridge"`` (a veth on ``BRIDGE`` at a static address of its
        own, and its route out). ``lxc_path``: another folder than the env's (one that already
        holds a container of that name is refused, never touched).
        """
        if network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, not {network!r}")
        container = LxcContainer(self, name or self.new_name(), list(extra_config),
                                 unprivileged=unprivileged, network=network, path=lxc_path)
        if container.name in self.containers or container.dir.exists():
            raise LxcError(f"container {container.name} already exists in {container.lxc_path}")
        if network == "bridge":
            bridge = bridge_interface()
            container.address, container._address_lock = reserve_address(bridge)
            container.gateway = bridge.ip
        container.dir.mkdir(parents=True)
        if lxc_path is not None:
            (container.dir / CONTAINER_OWNER_FILE).write_text(f"{os.getpid()}\n")
        container.write_config()
        container._fresh_rootfs()
        self.containers[container.name] = container
        if start:
            container.start(cgroup=cgroup)
        return container

    def close(self) -> None:
        """Stop and destroy every container, then remove the LXC path."""
        for container in list(self.containers.values()):
            try:
                container.destroy()
            except Exception as e:  # keep cleaning the others
                log(f"could not destroy {container.name}: {e}")
        if self.lxc_path.exists():
            remove_tree(self.lxc_path)
