"""The stack step with the real locked set: a first container, a second one on the same host,
and the first one recreated (issue 14).

    make bench-stack           # or: .venv/bin/python bench/stack_store.py [--keep]

Needs root, lxc (``make system-deps``), the package index, about 35 GB of free disk under
/var/tmp and 10-15 minutes. Everything happens in a private folder under /var/tmp, removed at
the end:

1. the repository's lock of the default set (sglang, torch, flashinfer-python and all their
   dependencies: 169 wheels, about 5 GB, 10 GB installed);
2. this machine as the plain LXC host: an empty wheel store, an empty cache of the machine
   running pyinfra (``PVE_SGLANG_CACHE``), unprivileged containers from the tests' Debian 12
   rootfs with no network at all (loopback only): whatever they install comes from the store;
3. each measured step is the deploy's own operations through the pyinfra CLI
   (``devtools/deploys/wheel_store.py``): the store (``--limit @local``: the fetch on
   the machine running pyinfra, the upload into the store, its sha256 check) and the install
   in the container, timed apart: with the shared layer (the default, ``shared_layer``), the
   first container builds the host's layer (``uv pip install --target`` offline from the store,
   copied into it by the host) and every venv installs only sglang; with ``--whole-venv``,
   each venv installs the whole set (``uv pip sync --require-hashes --offline``);
4. first container (store empty, cache empty), second container (store complete), the first
   destroyed and created again, and each venv checked against the lock.

The result goes to bench/results/stack_store.json and is printed as a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pve_sglang.stack import lock as stack_lock  # noqa: E402
from devtools import lxc_env  # noqa: E402
from pve_sglang.operations import layer  # noqa: E402
from devtools.wheel_store_site import WheelStoreSite, installed  # noqa: E402
from pve_sglang.stack.wheel_fetch import MANIFEST, total_bytes, read_manifest  # noqa: E402

RESULTS = REPO / "bench" / "results" / "stack_store.json"


def du_bytes(path: Path) -> int:
    done = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def measure(site: WheelStoreSite, box, label: str) -> dict:
    """The stack step for BOX: the store (on the host), then the install (in BOX)."""
    store = site.deploy(box, limit="@local")
    if "failed" in store:
        raise SystemExit(f"{label}: the store failed:\n{store['failed']}")
    store_s = site.seconds
    install = site.deploy(box, limit=box.inventory_name)
    if "failed" in install:
        raise SystemExit(f"{label}: the install failed:\n{install['failed']}")
    install_s = site.seconds
    venv = installed(box)
    if venv != site.lock.packages:
        raise SystemExit(f"{label}: the venv is not the lock")
    row = {"step": label, "store_s": round(store_s, 1), "install_s": round(install_s, 1),
           "stack_step_s": round(store_s + install_s, 1),
           "store_changed": bool(store.get("@local")),
           "venv_bytes": du_bytes(box.dir / "delta" / "opt" / "stack" / "venv")}
    print(f"{label}: store {row['store_s']} s ({'filled' if row['store_changed'] else 'complete'}),"
          f" install {row['install_s']} s", flush=True)
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the work folder")
    parser.add_argument("--whole-venv", action="store_true",
                        help="each venv holds the whole set (shared_layer: false)")
    args = parser.parse_args(argv)
    missing = lxc_env.missing_requirements()
    if missing:
        raise SystemExit(f"needs {', '.join(missing)}")
    key = stack_lock.default_key()
    lock = stack_lock.lock_for(key)
    work = Path(tempfile.mkdtemp(prefix="pve-sglang-bench-stack-", dir="/var/tmp"))
    work.chmod(0o755)  # the unprivileged containers' root walks down to the store
    (work / "lxc").mkdir()
    env = lxc_env.LxcEnv(lxc_path=work / "lxc")
    try:
        own = None if args.whole_venv else layer.VENV_OWNED
        site = WheelStoreSite(work / "site", lambda **kw: env.create(**kw), lock, key, own=own)
        started = time.monotonic()
        first = site.container()
        rows = [measure(site, first, "first container")]
        second = site.container()
        rows.append(measure(site, second, "second container, same host"))
        second.destroy()
        first.destroy()
        again = env.create(first.name, extra_config=site.mounts, unprivileged=True)
        rows.append(measure(site, again, "first container recreated"))
        folder = site.cache / "wheels" / lock.id
        entries = read_manifest(folder / MANIFEST)
        report = {
            "meta": {
                "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                             capture_output=True, text=True).stdout.strip(),
                "machine": f"{len(__import__('os').sched_getaffinity(0))} CPUs, "
                           f"{platform.machine()}, Linux {platform.release()}",
                "lock": lock.path.name, "lock_id": lock.id, "lock_bytes": len(lock.text),
                "packages": len(lock.packages), "wheels": len(entries),
                "wheel_bytes": total_bytes(folder, entries),
                "containers": "unprivileged, no network (loopback only), store read-only",
                "mode": "whole venv" if args.whole_venv else "shared layer (venv: sglang)",
                "layer_bytes": None if args.whole_venv else du_bytes(Path(layer.path(str(site.store), lock))),
                "load_at_end": round(__import__("os").getloadavg()[0], 2),
                "bench_seconds": round(time.monotonic() - started, 1),
            },
            "rows": rows,
            "ratios": {
                "first_over_second": round(rows[0]["stack_step_s"] / rows[1]["stack_step_s"], 2),
                "first_over_recreated": round(rows[0]["stack_step_s"] / rows[2]["stack_step_s"], 2),
            },
        }
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        results = RESULTS.with_name("stack_store_whole_venv.json") if args.whole_venv else RESULTS
        results.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nlock {lock.path.name}: {len(lock.packages)} packages, "
              f"{report['meta']['wheel_bytes'] / 1e9:.2f} GB of wheels")
        print("| step | store | install | stack step |\n| --- | --- | --- | --- |")
        for row in rows:
            print(f"| {row['step']} | {row['store_s']} s | {row['install_s']} s | "
                  f"{row['stack_step_s']} s |")
        print(f"first / second: {report['ratios']['first_over_second']}x, first / recreated: "
              f"{report['ratios']['first_over_recreated']}x  -> {results.relative_to(REPO)}")
        return 0
    finally:
        env.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
