"""The test suite's time per tier and its slowest modules, this checkout against an older revision
side by side in one sitting (issue 31).

    .venv/bin/python bench/suite_time.py                                  # every tier, this checkout
    .venv/bin/python bench/suite_time.py --against 7b3d044 --tiers fast  # old, then new, per tier
    .venv/bin/python bench/suite_time.py --against 7b3d044 --tiers root \\
        --files tests/root/test_hostile_strings.py -k "recorded and ifs"       # one module's part

Each tier is the marker expression ``make test-fast`` and the fixtures' markers define
(tests/conftest.py): ``fast`` (no root, no container, no download), ``root`` (root, no
container: the chroots), ``lxc`` (real containers), ``network`` (downloads, no root). For each
tier, REV's run (a git worktree of REV, its package first on ``PYTHONPATH``, run as REV's own
``make test`` ran it: one process where REV has no pytest-xdist setup) comes right before this
checkout's (as ``make test`` runs it: ``--workers`` pytest-xdist workers), so both are measured
under the same load. Wall time per tier, the count of tests, and the modules whose tests took
longest (the sum of their tests' own times, from pytest's JUnit XML) go to
``bench/results/suite_time.json`` and a table on stdout.

Needs what the tiers need (root, lxc and the test caches for ``root`` and ``lxc``). The
caches are shared (``PVE_SGLANG_TEST_CACHE``): build them first (one ``make test``), or the
first checkout measured pays for them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "suite_time.json"
TIERS = {
    "fast": "not lxc and not root and not network",
    "root": "root and not lxc",
    "lxc": "lxc",
    "network": "network and not root",
}


def has_workers(checkout: Path) -> bool:
    """Whether CHECKOUT's suite runs on pytest-xdist workers (its Makefile says so)."""
    return "--dist loadscope" in (checkout / "Makefile").read_text()


def run_tier(checkout: Path, tier: str, files: list[str], keyword: str | None, workers: int,
             report: Path) -> dict:
    """One tier of CHECKOUT's suite: wall seconds, counts, per-module seconds."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", TIERS[tier],
               f"--junitxml={report}", *files]
    if keyword:
        command += ["-k", keyword]
    if workers and has_workers(checkout):
        command += ["-n", str(workers), "--dist", "loadscope"]
        if "--no-loadscope-reorder" in (checkout / "Makefile").read_text():
            command.append("--no-loadscope-reorder")  # as its Makefile runs it
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.monotonic()
    done = subprocess.run(command, cwd=checkout, env=environment, capture_output=True, text=True)
    wall = time.monotonic() - started
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode not in (0, 5):  # 5: no test in this tier
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{checkout}: tier {tier} failed: {last}")
    return {"wall_s": round(wall, 1), "summary": last, "workers": command.count("-n") and workers,
            **modules_of(report)}


def modules_of(report: Path) -> dict:
    """Tests, and seconds per module (their tests' own times added), from a JUnit XML file."""
    if not report.exists():
        return {"tests": 0, "modules": {}}
    per_module: dict[str, float] = defaultdict(float)
    tests = 0
    for case in ElementTree.parse(report).iter("testcase"):
        tests += 1
        parts = case.get("classname", "").split(".")
        # tests.TIER.test_x(.Class): the module is up to its test_ part (a class is in it).
        end = next((i + 1 for i, part in enumerate(parts) if part.startswith("test_")), 1)
        per_module[".".join(parts[:end])] += float(case.get("time", 0))
    ranked = sorted(per_module.items(), key=lambda item: -item[1])
    return {"tests": tests, "modules": {name: round(seconds, 1) for name, seconds in ranked}}


def checkout_of(revision: str, work: Path) -> Path:
    folder = work / f"rev-{revision}"
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), revision], cwd=ROOT,
                   check=True, capture_output=True)
    return folder


def table(results: dict, slowest: int) -> str:
    lines = ["| tier | checkout | wall (s) | tests | workers | slowest modules (s, their tests' own time) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for tier, runs in results["tiers"].items():
        for name, run in runs.items():
            top = ", ".join(f"{module.split('.')[-1]} {seconds}"
                            for module, seconds in list(run["modules"].items())[:slowest])
            lines.append(f"| {tier} | {name} | {run['wall_s']} | {run['tests']} | "
                         f"{run['workers'] or 1} | {top} |")
        if len(runs) == 2:
            old, new = runs.values()
            lines.append(f"| {tier} | ratio old/new | {old['wall_s'] / max(new['wall_s'], 0.1):.2f} | | | |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="an older git revision, measured before each tier")
    parser.add_argument("--tiers", default=",".join(TIERS), help="comma-separated: " + ", ".join(TIERS))
    parser.add_argument("--files", nargs="*", default=[], help="test files (default: all)")
    parser.add_argument("-k", dest="keyword", help="pytest's -k, for a part of a module")
    parser.add_argument("--workers", type=int, default=4,
                        help="xdist workers (4: as make test and make test-fast run)")
    parser.add_argument("--slowest", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    tiers = args.tiers.split(",")
    unknown = set(tiers) - set(TIERS)
    if unknown:
        parser.error(f"--tiers: unknown {sorted(unknown)}; allowed: {', '.join(TIERS)}")
    work = Path(tempfile.mkdtemp(prefix="pve-sglang-suite-time-"))
    checkouts = {}
    try:
        if args.against:
            checkouts[f"{args.against} (old)"] = checkout_of(args.against, work)
        checkouts["this checkout"] = ROOT
        results: dict = {"against": args.against, "files": args.files, "keyword": args.keyword,
                         "machine": {"cores": os.cpu_count()}, "tiers": {}}
        for tier in tiers:
            for name, checkout in checkouts.items():
                report = work / f"{tier}-{len(results['tiers'].get(tier, {}))}.xml"
                run = run_tier(checkout, tier, args.files, args.keyword, args.workers, report)
                results["tiers"].setdefault(tier, {})[name] = run
                print(f"[suite-time] {tier} {name}: {run['wall_s']} s, {run['summary']}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(table(results, args.slowest))
        return 0
    finally:
        for checkout in checkouts.values():
            if checkout != ROOT:
                subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=ROOT,
                               capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
