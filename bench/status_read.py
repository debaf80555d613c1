"""What ``make status``'s one read of a container costs (issue 52 item 1): the read as the
``ContainerStatus`` fact sends it (``remote.piped``: ``python -c``), alone and for a fleet of
containers at once, as pyinfra runs one per host in parallel.

    .venv/bin/python bench/status_read.py [--fleet 10] [--repeat 5]

No root, no network, no GPU. Each "container" is a folder laid out as a deployed one (stack
link, release file, stack record, model marker: tests/unit/test_status.py's layout) and its own
stand-in server (tests/standin_sglang.py, with /metrics), on this machine: the cost inside the
containers, not the connection to them (lxc-attach, SSH), which a deploy run pays as well and
bench/deploy_cost.py measures. Results: bench/results/status_read.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "unit"))  # test_*.py: tests/unit/

from pve_sglang import remote  # noqa: E402
from standin_process import standin  # noqa: E402
from test_status import _container  # noqa: E402

PROGRAM = remote.piped(remote.STATUS_READ)


def read(args: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PROGRAM, json.dumps(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def timed(fleet: list[dict]) -> float:
    """Seconds until every read of FLEET, started at once, has answered (each checked)."""
    began = time.monotonic()
    procs = [read(args) for args in fleet]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and json.loads(out)["health"] == {"status": 200}, err
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fleet", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, ExitStack() as servers:
        fleet = []
        for n in range(options.fleet):
            folder = Path(work) / f"c{n}"
            folder.mkdir()
            url = servers.enter_context(standin(folder, "--enable-metrics"))
            fleet.append({**_container(folder / "root"), "base_url": url, "metrics": True})
        one = [timed(fleet[:1]) for _ in range(options.repeat)]
        many = [timed(fleet) for _ in range(options.repeat)]
    result = {
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": sys.version.split()[0], "fleet": options.fleet, "repeat": options.repeat,
        "program_bytes": len(PROGRAM),
        "one_read_s": {"median": statistics.median(one), "max": max(one)},
        "fleet_read_s": {"median": statistics.median(many), "max": max(many)},
    }
    (REPO / "bench" / "results" / "status_read.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
