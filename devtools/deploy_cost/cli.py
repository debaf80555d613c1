"""The command line of ``bench/deploy_cost.py``: arguments, the work dir, writing ``bench/results/``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devtools import deploy_cost
from devtools.deploy_cost import log
from devtools.deploy_cost.fleet import (
    OWNER_FILE,
    REPO,
    WORK_PREFIX,
    bench_tarball,
    destroy_containers,
    remove_stale_workdirs,
    wheelhouse,
)
from devtools.deploy_cost.plot import plot
from devtools.deploy_cost.report import build_report, print_table
from devtools.deploy_cost.runner import Bench, Checkout, rounds

RESULTS = REPO / "bench" / "results"


def git_commit() -> str:
    result = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            check=False, capture_output=True, text=True)
    return result.stdout.strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=deploy_cost.__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="no-op runs per size (default 5)")
    parser.add_argument("--sizes", default="1,2,4", help="container counts (default 1,2,4)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--keep", action="store_true", help="keep the containers and the work dir")
    parser.add_argument("--against", metavar="REV",
                        help="also run each no-op round through git revision REV's own "
                             "inventory.py deploy.py (a worktree in the work dir), interleaved "
                             "with this checkout's, and report both")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="only redraw the plot and the table from a results file")
    args = parser.parse_args(argv)
    if args.replot:
        report = json.loads(args.replot.read_text())
        plot(report, args.replot.with_suffix(".png"))
        print_table(report)
        return 0
    sizes = sorted({int(s) for s in args.sizes.split(",")})

    missing = [t for t in ("lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "lxc-destroy",
                           "zstd", "tar") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        log(f"needs root and {', '.join(missing) or 'lxc'} (make system-deps)")
        return 2

    from pve_sglang.project import load_defaults

    defaults = load_defaults()
    remove_stale_workdirs()
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX))
    (work / OWNER_FILE).write_text(f"{os.getpid()}\n")
    # SIGTERM/SIGHUP end the run through the cleanup below too.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))
    bench_start = time.monotonic()
    against = None
    try:
        if args.against:
            against = Checkout(work, args.against)
        tarball = bench_tarball(work)
        wh = wheelhouse(work, defaults["sglang_version"])
        bench = Bench(work, tarball, wh, sizes, f"{defaults['service_name']}.service",
                      against=against is not None)

        first, noop, snapshots_ok, old = rounds(bench, sizes, args.reps, against)

        meta = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "git_commit": git_commit(),
            "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Linux {platform.release()}",
            "python": platform.python_version(),
            "pyinfra": __import__("pyinfra").__version__,
            "sglang_wheel": defaults["sglang_version"],
            "reps": args.reps,
            "counting": "run_local_process wrapped in a driver that runs pyinfra's CLI: one "
                        "count per process started on this machine (every lxc-attach and every "
                        "@local command), attributed to its fact, operation or connector step",
            "first_run_scope": "container create+start, CA store, apt base packages, uv, venv, "
                               "sglang wheel (no deps), autotune patch, unit; no GPU steps",
            "container_snapshot": "init PID + start time, unit InvocationID, "
                                  "ExecMainStartTimestamp, NRestarts; compared around each no-op run",
            "bench_seconds": round(time.monotonic() - bench_start, 1),
        }
        compared = against and {"rev": against.rev, "commit": against.commit,
                                "new_commit": meta["git_commit"], "imported": against.imported}
        write_results(build_report(first, noop, snapshots_ok, meta, old, compared), args.out)
        return 0
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            destroy_containers(work / "lxc")
            if against:
                against.remove()
            shutil.rmtree(work, ignore_errors=True)



def write_results(report: dict[str, Any], out: Path) -> None:
    """``deploy_cost.json`` and ``deploy_cost.png`` in OUT, and the table on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "deploy_cost.png")
    print_table(report)
    log(f"wrote {out / 'deploy_cost.json'} and deploy_cost.png "
        f"({report['meta']['bench_seconds']:.0f}s in all)")
