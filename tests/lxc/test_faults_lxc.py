"""Faults, in real LXC containers with systemd, through the real pyinfra CLI (as
tests/lxc/test_deploy_lxc.py), and one on a GPU host's recorded outputs.

+ The deploy killed with SIGKILL in the middle of the stack install (``uv pip install``), in
  the middle of the unit's push, after the unit was written but before systemd loaded it, and
  after it was loaded but before the server restarted: the next run completes and ends in the
  state of a run that was never killed (the server restarted exactly once); the run after it
  changes nothing.
+ A server process that exits 1 is restarted by systemd (the deploy's own rendered unit).
+ A host driver upgrade moves the container's user-space driver (recorded H200 outputs).
+ The CUDA repository keyring's ``dpkg -i`` fails once (a stand-in ``dpkg`` that fails its
  first ``-i`` as with the dpkg lock held at a container's first boot): the next run installs
  it, the run after changes nothing. It was installed only when its download changed, so the
  next run skipped it and ``cuda-toolkit-X-Y`` was "unable to locate" on every run after.
+ ``update-ca-certificates`` fails once after the extra CA certificate was uploaded: the next
  run updates the store (the certificate is newer than the bundle), the run after changes
  nothing. It ran only when an upload changed, so the CA stayed out of the bundle for good.

How the kill is modelled: the deploying machine dies, so pyinfra and everything it started get
SIGKILL at once (its process group). On this machine the container is local and reached with
``lxc-attach`` without a terminal: the command inside stays in pyinfra's process group and dies
with it (each test records whether anything of the killed command outlived the kill, and kills
it if so). Over SSH (``pct exec`` on a Proxmox host) the command inside would instead run on
until it writes to the closed connection, which can only finish more of the step; dying
mid-step, as here, is the harder case. To make the kill land inside the step every time, the
step is held at the point of interest: the uv process is stopped (SIGSTOP, let on a few
milliseconds at a time) until part of the sglang wheel is in place; the ``cat`` that writes the
unit (a stand-in for the container's ``cat``, for that one file) writes half of the bytes and
then hangs, as on a lost connection; a stand-in ``systemctl`` hangs at ``daemon-reload`` or at
``restart``.

Found and fixed with these tests (operations/venv.py, facts/container.py): a killed install
left METADATA reporting 0.5.9 with 1,900+ files missing, and the next run stopped with
"autotune patch: unrecognised" (now a marker in the venv makes it reinstall); a unit written
in full but never loaded kept the old server running (now ``NeedDaemonReload`` loads it and
restarts); a unit pushed in part stayed in part until the next run (now a push renames a
complete file into place); a unit written and loaded but never restarted kept the old server
running for good (now the server is restarted when the unit, env file, launcher or venv is
newer than its start: restart pending).
"""

from __future__ import annotations

import difflib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import PATH_STATES_COMMAND, path_states_output, plan_deploy
from pve_sglang.stack import switch_rules as stacks
from test_deploy_lxc import NO_GPU_DROPIN, REPO, UNIT, Deploy, changed, failed

# The stack a deploy of Deploy's settings builds (sglang 0.5.9 alone), beside venv_path's link.
STACK = stacks.stack_path("/opt/sglang/venv", stacks.unlocked_id("0.5.9"))
SITE = f"{STACK}/lib/python3.11/site-packages"
SERVICE = "sglang.service"
RESTART_OP = (f"GPU container | {SERVICE} enabled and running (restarted only when its unit, "
              "env, stack or patch changed)")
STOPS = f"journalctl -u {SERVICE} --no-pager -o cat | grep -c '^Stopping' || true"
# What a finished deploy leaves in the container, as text to compare between two containers:
# the deploy's files, the unit's state, and every file and link of the venv (no bytecode;
# uv's cache record holds times, so it and its line in RECORD are left out).
DIGEST = (
    f"sha1sum {UNIT} /etc/sglang/sglang.env /opt/sglang/autotune_patch.py "
    f"/opt/sglang/sglang_flags.py; systemctl is-enabled {SERVICE}; "
    "systemctl show -p NeedDaemonReload sglang.service; cd /opt/sglang/venv && "
    "find . -name __pycache__ -prune -o -type f ! -name uv_cache.json ! -name RECORD -print0 "
    "| sort -z | xargs -0 sha1sum && "
    "find . -name __pycache__ -prune -o -type l -printf '%p -> %l\\n' | sort && "
    "cat lib/python3*/site-packages/*.dist-info/RECORD | grep -v uv_cache.json | sort | sha1sum"
)
# The files of the sglang wheel that its RECORD lists and that are missing or differ (the
# autotune patch changes one on purpose).
RECORD_CHECK = r"""
import base64, csv, glob, hashlib, os, sys
site = sys.argv[1]
[record] = glob.glob(os.path.join(site, "sglang-*.dist-info", "RECORD"))
bad = []
for path, digest, _ in csv.reader(open(record)):
    if not digest:
        continue
    full = os.path.join(site, path)
    algo, _, want = digest.partition("=")
    try:
        got = base64.urlsafe_b64encode(hashlib.new(algo, open(full, "rb").read()).digest())
    except FileNotFoundError:
        bad.append(path)
        continue
    if got.rstrip(b"=").decode() != want:
        bad.append(path)
print(" ".join(bad))
"""


def log(message: str) -> None:
    print(f"[faults] {message}", flush=True)


def processes() -> dict[int, list[str]]:
    """Every process of this machine (containers' too) and its argv."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            found[int(entry)] = [a.decode(errors="replace") for a in argv if a]
    return found


def init_pid(deploy: Deploy) -> int | None:
    """The host PID of the container's init, None while it does not run."""
    done = subprocess.run(["lxc-info", "-P", str(deploy.lxc_path), "-n", deploy.name, "-p", "-H"],
                          capture_output=True, text=True)
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def in_container(pid: int, init: int) -> bool:
    """Whether PID runs in the container of INIT (the same root): other tests' containers on
    this machine run the same commands."""
    try:
        mine, theirs = os.stat(f"/proc/{pid}/root"), os.stat(f"/proc/{init}/root")
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class KilledDeploy:
    """A deploy started in its own process group, to be killed there like a crashed machine."""

    def __init__(self, deploy: Deploy):
        command, env = deploy.cli()
        self.log_path = deploy.root / f"killed-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log_path, "w"), start_new_session=True)
        self.started = time.monotonic()

    def wait_for(self, found, what: str, timeout: float = 600):
        """Poll FOUND() every few milliseconds until it returns something; that thing."""
        while time.monotonic() - self.started < timeout:
            result = found()
            if result:
                return result
            if self.proc.poll() is not None:
                pytest.fail(f"the deploy ended ({self.proc.returncode}) before {what}:\n"
                            f"{self.log_path.read_text()[-3000:]}")
            time.sleep(0.005)
        pytest.fail(f"no {what} after {timeout}s")

    def kill(self, inside: list[int]) -> list[int]:
        """SIGKILL the deploy's process group; then the in-container PIDs that outlived it
        (returned), as the container's own processes are not always in that group."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        time.sleep(0.5)
        survivors = [pid for pid in inside if alive(pid)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        log(f"killed after {time.monotonic() - self.started:.1f}s; in-container processes "
            f"that outlived the process group: {survivors or 'none'}")
        return survivors


def digest(deploy: Deploy) -> str:
    return deploy.attach(DIGEST)


def assert_same_state(deploy: Deploy, reference: Deploy) -> None:
    mine, theirs = digest(deploy), digest(reference)
    assert mine == theirs, "\n".join(difflib.unified_diff(
        theirs.splitlines(), mine.splitlines(), "never killed", "killed, then re-run",
        lineterm="", n=0))


def converge(deploy: Deploy, logs: list[str] | None = None) -> tuple[int, list[list[str]]]:
    """Run until a run changes nothing (at most 3 runs); the runs and each run's changes (and
    each run's log appended to LOGS)."""
    runs: list[list[str]] = []
    while not runs or runs[-1]:
        assert len(runs) < 3, f"no convergence: {runs}"
        started = time.monotonic()
        results, output = deploy.run()
        runs.append(changed(results))
        if logs is not None:
            logs.append(output)
        assert failed(results) == []
        log(f"run {len(runs) + 1} after the kill: {len(runs[-1])} changes, "
            f"{time.monotonic() - started:.1f}s")
    return len(runs), runs


@pytest.fixture(scope="module")
def new_deploy(tmp_path_factory, lxc_host, sglang_wheel, pypi_wheel):
    """``new_deploy(name) -> Deploy``: a Deploy of a new container NAME."""
    return lambda name: Deploy(tmp_path_factory.mktemp(name), sglang_wheel, pypi_wheel, name=name)


@pytest.fixture(scope="module")
def reference(deployed_copy):
    """A container deployed once, never killed (a copy of the run's deployed template):
    the state a killed deploy must end in."""
    deploy = deployed_copy("pvs-f-ref")
    yield deploy
    deploy.destroy()


# The stack install
#


def test_killed_during_the_stack_install_converges_on_the_next_run(new_deploy, reference):
    deploy = new_deploy("pvs-f-stack")
    try:
        killed = KilledDeploy(deploy)

        def uv_install() -> int | None:
            init = init_pid(deploy)
            for pid, argv in processes().items() if init else ():
                if (argv and argv[0].endswith("/uv") and argv[1:3] == ["pip", "install"]
                        and in_container(pid, init)):
                    return pid
            return None

        uv = killed.wait_for(uv_install, "uv pip install")
        os.kill(uv, signal.SIGSTOP)
        site = Path(f"/proc/{uv}/root{SITE}")

        def part_installed() -> bool:
            # Let uv run a few milliseconds at a time until some, not all, files are there.
            metadata = list(site.glob("sglang-*.dist-info/METADATA"))
            if metadata and (site / "sglang").is_dir():
                return True
            os.kill(uv, signal.SIGCONT)
            time.sleep(0.003)
            os.kill(uv, signal.SIGSTOP)
            return False

        killed.wait_for(part_installed, "part of the sglang wheel in the venv")
        killed.kill([uv])

        # The fault landed: the version reads right but files are missing.
        version = deploy.attach(f"sed -n 's/^Version: //p' {SITE}/sglang-*.dist-info/METADATA")
        check = f"{STACK}/bin/python -c '{RECORD_CHECK}' {SITE}"
        missing = deploy.attach(check).split()
        log(f"after the kill: sglang METADATA says {version}, {len(missing)} wheel files "
            "missing or partial")
        assert version == "0.5.9" and len(missing) > 10

        runs, changes = converge(deploy)
        assert any("sglang==0.5.9" in name for name in changes[0]), changes
        assert deploy.attach(check) == reference.attach(check)
        assert_same_state(deploy, reference)
        log(f"stack install kill: {runs} runs to converge, changes per run "
            f"{[len(c) for c in changes]}")
        assert runs == 2 and changes[-1] == []
    finally:
        deploy.destroy()


# The unit write, and what follows it up to the restart
#

# Stands in for the container's cat for the unit's push only (the connector writes a file to a
# temporary one beside it, `.NAME.upload-XXXXXX`, then renames it): writes half of the bytes,
# says so, then hangs like a lost connection.
CAT_FAULT = """#!/bin/sh
case "$(readlink /proc/$$/fd/1)" in
{unit_dir}/.{unit_name}.upload-*)
  head -c {half}
  touch /run/pvs-fault-hit
  exec sleep 600 ;;
esac
exec /usr/bin/cat "$@"
"""
# Stands in for systemctl: `systemctl VERB ...` says so, then hangs (the deploy is killed
# there); any other call is the real one's.
SYSTEMCTL_FAULT = """#!/bin/sh
if [ "$1" = {verb} ]; then
  touch /run/pvs-fault-hit
  exec sleep 600
fi
exec /usr/bin/systemctl "$@"
"""


@pytest.fixture(scope="module")
def serving(deployed_copy):
    """A deployed container whose server runs (a drop-in replaces only ExecStart: no GPU)."""
    deploy = deployed_copy("pvs-f-unit")
    deploy.attach(f"mkdir -p /etc/systemd/system/{SERVICE}.d && printf '%s' '{NO_GPU_DROPIN}' > "
                  f"/etc/systemd/system/{SERVICE}.d/no-gpu.conf && systemctl daemon-reload && "
                  f"systemctl start {SERVICE}")
    yield deploy
    deploy.destroy()


@pytest.mark.parametrize("killed_at, fraction", [
    ("push", 0.85),            # half of the new unit's bytes sent
    ("daemon-reload", 0.8),    # the unit in place, not loaded
    ("restart", 0.75),         # the unit in place and loaded, the old server running
])
def test_killed_between_the_unit_write_and_the_restart_converges_on_the_next_run(
        serving, killed_at, fraction):
    """Killed at KILLED_AT: the unit on disk is the old one or the new one whole, never part of
    one; the next run restarts the server exactly once, and the run after it changes nothing.
    At ``restart`` nothing of the next run's own changes says so: the unit is newer than the
    running server (restart pending)."""
    deploy = serving
    before = deploy.attach(f"cat {UNIT}")
    old = before.split("--mem-fraction-static ", 1)[1].split()[0]
    expected = before.replace(f"--mem-fraction-static {old}", f"--mem-fraction-static {fraction}")
    pid = deploy.attach(f"systemctl show -p MainPID --value {SERVICE}")
    stops = int(deploy.attach(STOPS))
    if killed_at == "push":
        tool, script = "cat", CAT_FAULT.format(unit_dir=os.path.dirname(UNIT),
                                               unit_name=os.path.basename(UNIT),
                                               half=len(expected) // 2)
    else:
        tool, script = "systemctl", SYSTEMCTL_FAULT.format(verb=killed_at)
    deploy.attach(f"cat > /usr/local/bin/{tool} <<'EOF'\n{script}EOF\n"
                  f"chmod 755 /usr/local/bin/{tool} && rm -f /run/pvs-fault-hit")
    deploy.container["mem_fraction_static"] = fraction
    try:
        killed = KilledDeploy(deploy)
        init = init_pid(deploy)
        root = Path(f"/proc/{init}/root")

        def hung() -> list[int]:
            if not (root / "run/pvs-fault-hit").exists():
                return []
            return [pid for pid, argv in processes().items()
                    if argv[:2] == ["sleep", "600"] and in_container(pid, init)]

        killed.kill(killed.wait_for(hung, f"the deploy at {killed_at}", timeout=300))
    finally:
        deploy.attach(f"rm -f /usr/local/bin/{tool} /run/pvs-fault-hit")

    on_disk = deploy.attach(f"cat {UNIT}")
    reload_pending = deploy.attach(f"systemctl show -p NeedDaemonReload --value {SERVICE}")
    if killed_at == "push":
        # Half of the bytes came: the old unit, whole (the new bytes, if any, beside it).
        assert on_disk == before
    else:
        assert on_disk == expected.strip()
    assert reload_pending == ("yes" if killed_at == "daemon-reload" else "no")
    assert deploy.attach(f"systemctl show -p MainPID --value {SERVICE}") == pid

    logs: list[str] = []
    runs, changes = converge(deploy, logs)
    log(f"killed at {killed_at}: {runs} runs to converge, changes per run "
        f"{[len(c) for c in changes]}")
    # As a run that was never killed: the new unit loaded, the server restarted once.
    assert deploy.attach(f"cat {UNIT}") == expected.strip()
    assert deploy.attach(f"systemctl show -p NeedDaemonReload --value {SERVICE}") == "no"
    assert int(deploy.attach(STOPS)) == stops + 1
    assert deploy.attach(f"systemctl show -p MainPID --value {SERVICE}") not in ("0", pid)
    assert RESTART_OP in changes[0]
    assert runs == 2 and changes[-1] == []
    # No temporary file of a push is left: the next push of the unit removed the killed one's.
    assert deploy.attach(f"ls -A {os.path.dirname(UNIT)} | grep -c 'upload-' || true") == "0"
    if killed_at == "restart":
        # Nothing else changed: the restart is the pending one, and the log says why.
        assert changes[0] == [RESTART_OP], changes[0]
        assert (f"{SERVICE} restart pending: the unit file changed after the server started"
                in logs[0]), logs[0][-3000:]
        assert "pending" not in logs[1]


# The server process
#


def test_server_process_exiting_1_is_restarted_by_systemd(reference):
    """The deploy's own unit, started as is: without a GPU (and sglang installed without its
    dependencies) the real ``python -m sglang.launch_server`` exits 1 at import."""
    deploy = reference
    assert "Restart=on-failure" in deploy.attach(f"cat {UNIT}")
    deploy.attach(f"systemctl start {SERVICE}")
    try:
        started = time.monotonic()
        restarts = 0
        while restarts < 2:
            assert time.monotonic() - started < 120, "systemd did not restart the server twice"
            time.sleep(1)
            restarts = int(deploy.attach(f"systemctl show -p NRestarts --value {SERVICE}"))
        journal = deploy.attach(f"journalctl -u {SERVICE} --no-pager -o cat")
        log(f"NRestarts {restarts} after {time.monotonic() - started:.0f}s")
    finally:
        deploy.attach(f"systemctl stop {SERVICE}")
    assert "Main process exited, code=exited, status=1/FAILURE" in journal, journal[-2000:]
    assert "Scheduled restart job, restart counter is at 2" in journal, journal[-2000:]


# A dpkg that fails once (the CUDA repository keyring)
#

# Stands in for dpkg: its first `dpkg -i` fails as dpkg does when another holds its lock (a
# container's first boot: apt's daily jobs); any other call, and every later one, is the real
# dpkg's.
FAILING_DPKG = """#!/bin/sh
if [ "$1" = -i ] && [ ! -e /run/pvs-dpkg-failed ]; then
    touch /run/pvs-dpkg-failed
    echo "dpkg: error: dpkg frontend lock was locked by another process with pid 1" >&2
    echo "Note: removing the lock file is always wrong, and can end up damaging the" >&2
    exit 2
fi
exec /usr/bin/dpkg "$@"
"""
# A keyring package named as NVIDIA's (cuda-keyring_1.1-1_all.deb): no internet here. Its one
# file stands for the key.
KEYRING_DEB = "/opt/pvs-repo/cuda-keyring_1.1-1_all.deb"
KEYRING_CONTROL = ("Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
                   "Maintainer: test <test@example.invalid>\n"
                   "Description: stand-in for NVIDIA's CUDA repository keyring\n")
KEYRING_STATUS = "dpkg-query -W -f '${db:Status-Status} ${Version}' cuda-keyring 2>/dev/null || true"


@pytest.fixture(scope="module")
def box(lxc_env):
    """One container for the steps whose command fails once (each test its own stand-in)."""
    container = lxc_env.create(lxc_env.new_name("fails"))
    yield container
    container.destroy()


def run_step(box, tmp_path: Path, deploy: str, data: dict) -> tuple[subprocess.CompletedProcess, dict | None]:
    """The test deploy DEPLOY (tests/deploys/) against BOX through the pyinfra CLI, with DATA
    as host data; its result and pyinfra's JSON results."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = [({box.inventory_name!r}, {{**{box.host_data()!r}, "
                         f"**{data!r}}})]\n")
    done = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), str(inventory),
                           f"tests/deploys/{deploy}", "-y", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    try:
        return done, json.loads(done.stdout)
    except ValueError:
        return done, None


def test_a_failed_keyring_install_is_made_by_the_next_run(box, tmp_path):
    box.attach("mkdir -p /tmp/kr/DEBIAN /tmp/kr/usr/share/keyrings /opt/pvs-repo && "
               "cat > /tmp/kr/DEBIAN/control", input=KEYRING_CONTROL)
    box.attach("echo stand-in > /tmp/kr/usr/share/keyrings/cuda-archive-keyring.gpg && "
               f"dpkg-deb --build /tmp/kr {KEYRING_DEB} && rm -rf /tmp/kr")
    box.attach("cat > /usr/local/sbin/dpkg && chmod 755 /usr/local/sbin/dpkg", input=FAILING_DPKG)
    # The download's folder: the wheel store's mount point makes it in a deployed container.
    box.attach("mkdir -p /var/cache/pve-sglang")

    def run() -> tuple[subprocess.CompletedProcess, dict | None]:
        return run_step(box, tmp_path, "cuda_keyring.py", {"keyring_url": f"file://{KEYRING_DEB}"})

    first, _ = run()
    log = first.stdout + first.stderr
    assert first.returncode != 0 and "dpkg frontend lock was locked" in log, log[-3000:]
    downloaded = box.attach(["test", "-f", "/var/cache/pve-sglang/cuda-keyring.deb"], check=False)
    assert downloaded.returncode == 0
    assert box.attach(KEYRING_STATUS).stdout == ""  # downloaded, not installed

    second, results = run()
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert changed(results) == ["Install the CUDA repository keyring (cuda-keyring 1.1-1)"], results
    assert box.attach(KEYRING_STATUS).stdout == "installed 1.1-1"

    third, results = run()
    assert third.returncode == 0 and changed(results) == [], results


# Stands in for update-ca-certificates: its first run fails (a full disk, say); every later
# one is the real one's.
FAILING_CA_UPDATE = """#!/bin/sh
if [ ! -e /run/pvs-ca-update-failed ]; then
    touch /run/pvs-ca-update-failed
    echo "cat: write error: No space left on device" >&2
    exit 1
fi
exec /usr/sbin/update-ca-certificates "$@"
"""


def test_a_failed_ca_store_update_is_made_by_the_next_run(box, tmp_path):
    """The extra CA certificate is uploaded, update-ca-certificates fails: the next run updates
    the store (the certificate is newer than its bundle), the run after changes nothing. It was
    updated only when an upload changed, so the proxy's CA stayed out of the bundle for good."""
    cert = tmp_path / "pvs-test-proxy-ca.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=pvs test proxy CA", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(cert)], check=True, capture_output=True)
    body = "".join(cert.read_text().splitlines()[1:3])  # a piece of the base64 body
    box.attach("cat > /usr/local/sbin/update-ca-certificates && "
               "chmod 755 /usr/local/sbin/update-ca-certificates", input=FAILING_CA_UPDATE)

    def in_bundle() -> bool:
        text = box.attach(["cat", "/etc/ssl/certs/ca-certificates.crt"]).stdout
        return body in text.replace("\n", "")

    def run() -> tuple[subprocess.CompletedProcess, dict | None]:
        return run_step(box, tmp_path, "ca_store.py", {"settings": {"ca_certificates": [str(cert)]}})

    first, _ = run()
    log = first.stdout + first.stderr
    assert first.returncode != 0 and "No space left on device" in log, log[-3000:]
    assert not in_bundle()

    second, results = run()
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert changed(results) == ["Update the CA store"], results
    assert in_bundle()

    third, results = run()
    assert third.returncode == 0 and changed(results) == [], results


# A host driver upgrade (recorded outputs)
#


def test_host_driver_upgrade_reinstalls_the_container_driver_on_recorded_h200_facts():
    """The H200 machine's recorded driver (580.159.04) is the host's new version; the container
    was converged on an older one (570.133.20): the plan downloads and installs the new
    runfile and restarts the server, and nothing else. With the container on the host's
    version the same plan changes nothing (the control)."""
    from pve_sglang.facts.container import (
        NvidiaUserspaceVersion,
        SglangVenv,
        UnitState,
        UvVersion,
    )
    from pve_sglang.project import load_defaults
    from tasks.container import container_phase
    from test_host_phase_recorded import gpu_host_responses

    defaults = load_defaults()
    host_version = "580.159.04"
    runfile = f"/var/cache/pve-sglang/NVIDIA-Linux-x86_64-{host_version}.run"
    data = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve"}

    def text(command) -> str:
        return command if isinstance(command, str) else command.get_raw_value()

    def plan(responses: dict) -> list[tuple[str, list[str]]]:
        responses = dict(sorted({**gpu_host_responses(), **responses}.items(),
                                key=lambda item: -len(str(item[0]))))
        return plan_deploy(container_phase, hosts=[("pve1", {**defaults}), ("ct105", data)],
                           responses=responses,
                           groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"]})["ct105"]

    # A fresh container's plan tells what every managed file must hold.
    fresh = plan({})
    uploads: dict[str, str] = {}
    for _, commands in fresh:
        for command in commands:
            if command.startswith("upload "):
                dest, _, body = command.removeprefix("upload ").partition("\n")
                if body.startswith("<file "):
                    body = Path(body.removeprefix("<file ").rstrip(">")).read_text()
                uploads[dest] = body
    assert f"/etc/systemd/system/{SERVICE}" in uploads

    def converged(libcuda: str) -> dict:
        import hashlib

        modes = {"/etc/sglang/sglang.env": "600"}
        states = {dest: ("file", modes.get(dest, "644"), hashlib.sha1(body.encode()).hexdigest())
                  for dest, body in uploads.items()}
        # A converged venv is the repository's lock of the default set, package for package:
        # sglang in the venv, the rest in the host's shared layer (its marker there).
        from pve_sglang.facts.installed_stacks import Stacks
        from pve_sglang.operations import layer
        from pve_sglang.stack.lock import default_key, lock_for
        from pve_sglang.stack.releases import read_release, toolkit_version
        from pve_sglang.stack.store_retention import user_path, user_text
        from tasks.container import LOCK_FILE
        lock = lock_for(default_key())
        pins = lock.packages
        toolkit = toolkit_version(read_release(defaults["sglang_version"]),
                                  defaults["cuda_toolkit_version"], pins)
        # The serving stack is the lock's, built beside earlier: venv_path links to it.
        stack = stacks.stack_path(defaults["venv_path"], lock.id)
        states.update({defaults["sglang_cache_dir"]: ("dir", "755", None),
                       "/etc/sglang": ("dir", "700", None), "/var/cache/pve-sglang": ("dir", "755", None),
                       f"{stack}/pyvenv.cfg": ("file", "644", "0" * 40),
                       layer.marker(defaults["wheel_store"], lock): ("file", "644", "0" * 40),
                       # The container's record in the store: it holds its one stack's lock.
                       user_path(defaults["wheel_store"], "pct-105"): (
                           "file", "644", hashlib.sha1(user_text("pct-105", {lock.id}).encode())
                           .hexdigest())})
        debs = ["ca-certificates", "curl", "python3", "python3-venv", "g++", "make",
                f"cuda-toolkit-{toolkit.replace('.', '-')}"]
        keyring = "ii  cuda-keyring  1.1-1  all  NVIDIA CUDA repository keyring"
        py = f"{stack}/bin/python"
        found = (f"link|{stacks.link_target(defaults['venv_path'], lock.id)}\n"
                 f"stack|{lock.id}|1700000000|{{\"lock\": \"{lock.id}\", \"sglang\": "
                 f"\"{defaults['sglang_version']}\"}}")
        return {
            text(Stacks().command(defaults["venv_path"], LOCK_FILE,
                                  stacks.state_path(defaults["service_name"]))): found,
            text(NvidiaUserspaceVersion().command()): f"libcuda.so\nlibcuda.so.1\nlibcuda.so.{libcuda}\n",
            # One read of every watched path: answer any PathStates command with all of them.
            PATH_STATES_COMMAND: path_states_output(states),
            # The runfile of the host's version is kept once downloaded (files.download).
            **({f"test -e {runfile}": f"user=root group=root mode=-rwxr-xr-x atime=0 mtime=0 "
                                      f"ctime=0 size=1 '{runfile}'"} if libcuda == host_version
               else {}),
            text(SglangVenv().command(py, "/opt/sglang")): json.dumps(
                {"packages": pins, "in_venv": ["sglang"], "patch": "already-patched\n",
                 "python": "3.11"}),
            text(UvVersion().command("/opt/sglang/tools/bin/uv")):
                f"uv {defaults['uv_version']}",
            text(UnitState().command(SERVICE)): "ActiveState=active\nUnitFileState=enabled",
            "dpkg -l": "\n".join([f"ii  {d}  1.0  amd64  x" for d in debs] + [keyring]),
        }

    def changes(ops) -> dict[str, list[str]]:
        # Left out: the CUDA keyring's download (read with pyinfra's own file facts, not
        # recorded here: planned either way, no restart) and the op whose `_if` (an earlier op
        # changed) the plan does not evaluate: the daemon reload. The keyring's install is
        # decided from the packages (dpkg -l): converged, it plans nothing.
        skip = ("NVIDIA CUDA repository keyring", "Reload systemd units")
        return {name: cmds for name, cmds in ops
                if cmds and not any(word in name for word in skip)}

    same = changes(plan(converged(host_version)))
    assert same == {}, same

    upgraded = changes(plan(converged("570.133.20")))
    assert set(upgraded) == {
        f"GPU container | Download NVIDIA driver runfile {host_version}",
        f"GPU container | NVIDIA user-space driver {host_version} (the host's version)",
        RESTART_OP,
    }, upgraded
    assert any(host_version in c for c in
               upgraded[f"GPU container | Download NVIDIA driver runfile {host_version}"])
    assert upgraded[f"GPU container | NVIDIA user-space driver {host_version} (the host's "
                    "version)"] == [f"sh {runfile} --no-kernel-modules --silent"]
    assert upgraded[RESTART_OP] == [f"systemctl reset-failed {SERVICE}",
                                    f"systemctl restart {SERVICE}"]
