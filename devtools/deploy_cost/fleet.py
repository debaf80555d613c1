"""The containers' side of the benchmark: rootfs tarball, wheelhouse, hosts files, snapshots, cleanup."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from devtools import lxc_env
from devtools.deploy_cost import log

REPO = lxc_env.REPO_ROOT
WORK_PREFIX = "pve-sglang-bench-"
OWNER_FILE = "owner.pid"
CA_DIR = Path("/usr/local/share/ca-certificates")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("check", True)
    return subprocess.run(cmd, **kwargs)


def destroy_containers(lxc_path: Path) -> None:
    """Stop and destroy every container under LXC_PATH."""
    if not lxc_path.is_dir():
        return
    for config in sorted(lxc_path.glob("*/config")):
        name = config.parent.name
        _run(["lxc-stop", "-P", str(lxc_path), "-n", name, "-k"], check=False, capture_output=True)
        _run(["lxc-destroy", "-P", str(lxc_path), "-n", name], check=False, capture_output=True)


def remove_stale_workdirs() -> None:
    """Clean up after bench runs that died (their owner pid is gone)."""
    for work in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}*"):
        try:
            owner = int((work / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not lxc_env._pid_alive(owner):
            log(f"removing stale bench dir {work} (owner {owner} is gone)")
            destroy_containers(work / "lxc")
            shutil.rmtree(work, ignore_errors=True)
            # Its --against worktree, if any, is gone with it: git forgets it.
            _run(["git", "-C", str(REPO), "worktree", "prune"], check=False, capture_output=True)


def bench_tarball(work: Path) -> Path:
    """The tests' cached rootfs with their test-time additions, repacked for ``lxc.create``."""

    source = lxc_env.ensure_rootfs_tarball()
    base = work / "rootfs-build"
    lxc_env.extract_rootfs(source, base)
    # resolv.conf, hosts, CA certificates; sshd off (the containers share the host's network,
    # port 22 included), apt's timers off.
    lxc_env.prepare_base(base)
    dest = work / "rootfs.tar.zst"
    _run(["tar", "-C", str(base), "--numeric-owner", "--xattrs", "--xattrs-include=*",
          "-I", "zstd -T0 -3", "-cf", str(dest), "."])
    shutil.rmtree(base)
    log(f"rootfs tarball from {source.name}: {dest.stat().st_size / 1e6:.0f} MB")
    return dest


def wheelhouse(work: Path, version: str) -> Path:
    """A directory with sglang's wheel: from .cache/wheels, else downloaded with pip."""
    wh = work / "wh"
    wh.mkdir()
    name = f"sglang-{version}-py3-none-any.whl"
    cached = REPO / ".cache" / "wheels" / name
    if cached.is_file():
        shutil.copy(cached, wh / name)
    else:
        log(f"downloading {name} with pip")
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}",
              "-d", str(wh)])
    return wh


def hosts_file(path: Path, lxc_path: Path, tarball: Path, wh: Path, names: list[str]) -> None:
    certs = sorted(str(p) for p in CA_DIR.glob("*.crt")) if CA_DIR.is_dir() else []
    entry = {
        "platform": "lxc",
        "require_gpu": False,
        "lxc_path": str(lxc_path),
        "lxc_rootfs_tarball": str(tarball),
        "lxc_config": [
            "lxc.net.0.type = none",
            f"lxc.mount.entry = {wh} opt/wheelhouse none bind,ro,create=dir 0 0",
        ],
        "containers": [
            # Privileged: these containers share the host's network namespace (lxc_config).
            {"name": name, "unprivileged": False, "wheelhouse": "/opt/wheelhouse",
             "stack_install": "sglang-no-deps",
             **({"ca_certificates": certs} if certs else {})}
            for name in names
        ],
    }
    path.write_text(json.dumps({"local": entry}, indent=2))  # JSON is YAML


def container_snapshot(lxc_path: Path, name: str, unit: str) -> dict[str, str]:
    """What a restart would change: init's PID and start time, the unit's invocation."""
    info = _run(["lxc-info", "-P", str(lxc_path), "-n", name, "-s", "-p"], check=False,
                capture_output=True, text=True).stdout
    values = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in info.splitlines())
    )
    pid = values.get("PID", "")
    start = ""
    if pid:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            start = stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in ticks
        except (OSError, IndexError):
            pass
    show = _run(
        ["lxc-attach", "-P", str(lxc_path), "-n", name, "--clear-env", "--", "systemctl", "show",
         unit, "-p", "InvocationID", "-p", "ExecMainStartTimestamp", "-p", "ActiveState",
         "-p", "NRestarts"],
        check=False, capture_output=True, text=True,
    ).stdout
    values.update(dict(line.split("=", 1) for line in show.splitlines() if "=" in line))
    return {"state": values.get("State", ""), "init_pid": pid, "init_start": start,
            **{k: values.get(k, "") for k in ("InvocationID", "ExecMainStartTimestamp",
                                                 "ActiveState", "NRestarts")}}
