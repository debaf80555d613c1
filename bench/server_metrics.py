"""The server's /metrics during the benchmark (issue 35 item 4): what a scrape costs, and what
the figures and tuning hints look like for a server held by a cap, by its KV cache, or by
nothing.

    .venv/bin/python bench/server_metrics.py [--seconds 3] [--levels 1,4,16,32]

No root, no network, no GPU. The server is tests/standin_sglang.py on 127.0.0.1 (SGLang's metric
names and types; requests queue past its running cap or its KV pool, as SGLang's scheduler
queues them), the load a benchmark's shape (the markers the samplers wait for, CONCURRENCY
clients sending /generate back to back), each level run under the real
``remote/server_metrics.py``; the rows go through ``bench_history.after_run`` as the deploy's
do (history file, plot, hints). Results: bench/results/server_metrics.json and the plot of the
three servers' runs, bench/results/bench_history_metrics_example.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "pve_sglang" / "remote"))
sys.path.insert(0, str(REPO / "tests"))

import server_metrics  # noqa: E402
from pve_sglang.remote import SERVER_METRICS, marked_json, source  # noqa: E402
from pve_sglang.server import bench_history  # noqa: E402
from pve_sglang.server.bench import metric_columns, metrics_argv, summary_table  # noqa: E402
from standin_process import LOAD, standin  # noqa: E402

RESULTS = REPO / "bench" / "results"
#: The three servers: name -> stand-in flags, the meta a run of it would carry.
SERVERS = {
    "no cap": ([], {"max_running_requests": None}),
    "capped at 8": (["--max-running", "8"], {"max_running_requests": 8}),
    "KV pool of 1280 tokens": (["--kv-tokens", "1280"], {"max_running_requests": None}),
}


def exposition(ranks: int = 8, buckets: int = 40) -> str:
    """A /metrics answer of a TP-RANKS server reporting from every scheduler: the gauges read
    and six latency histograms per rank (the size, not SGLang's exact set)."""
    lines = []
    for rank in range(ranks):
        labels = (f'engine_type="unified",model_name="glm-5",tp_rank="{rank}",pp_rank="0",'
                  'moe_ep_rank="0"')
        for name in server_metrics.FIGURES:
            lines += [f"# TYPE {name} gauge", f"{name}{{{labels}}} 1.0"]
        for h in range(6):
            lines.append(f"# TYPE sglang:latency{h}_seconds histogram")
            lines += [f'sglang:latency{h}_seconds_bucket{{{labels},le="{0.001 * 2 ** b:.3f}"}} {b}.0'
                      for b in range(buckets)]
            lines += [f'sglang:latency{h}_seconds_bucket{{{labels},le="+Inf"}} {buckets}.0',
                      f"sglang:latency{h}_seconds_sum{{{labels}}} 1.0",
                      f"sglang:latency{h}_seconds_count{{{labels}}} {buckets}.0"]
    return "\n".join(lines) + "\n"


def parse_cost(reps: int = 15) -> dict:
    text = exposition()
    parser = server_metrics.text_string_to_metric_families

    def median_ms(work) -> float:
        times = []
        for _ in range(reps):
            began = time.perf_counter()
            work()
            times.append(time.perf_counter() - began)
        return round(1000 * statistics.median(times), 2)

    return {"bytes": len(text), "lines": text.count("\n"),
            "whole_answer_parsed_ms": median_ms(lambda: list(parser(text))),
            "figures_ms": median_ms(lambda: server_metrics.figures(text))}


def level(url: str, concurrency: int, seconds: float) -> dict:
    argv = metrics_argv(sys.executable, str(source(SERVER_METRICS)), url + "/metrics", 200,
                        [sys.executable, "-c", LOAD, url, "sk-bench", str(concurrency), str(seconds)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    rate = next(float(line.split()[1]) for line in done.stdout.splitlines()
                if line.startswith("OUTPUT_TOK_S "))
    summary = marked_json(server_metrics.SUMMARY_PREFIX, done.stdout)
    return {"concurrency": concurrency, "output_token_throughput": rate,
            **metric_columns(summary)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--levels", default="1,4,16,32")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    out = {"parse_cost": parse_cost(), "servers": {}}
    print(f"one scrape of a {out['parse_cost']['bytes'] // 1024} KiB answer: "
          f"{out['parse_cost']}")
    folder = Path(tempfile.mkdtemp(prefix="pvs-bench-metrics-", dir="/var/tmp"))
    try:
        now = datetime.datetime(2026, 12, 4, 19, 0, tzinfo=datetime.timezone.utc)
        for i, (name, (flags, meta)) in enumerate(SERVERS.items()):
            with standin(folder, "--enable-metrics", "--token-delay", "0.004", *flags,
                         key="sk-bench") as url:
                rows = [level(url, c, args.seconds) for c in levels]
            meta = {"model_path": "standin", "input_len": 64, "output_len": 64, "label": name,
                    "mem_fraction_static": 0.92, "tp_size": None, **meta}
            _, warnings = bench_history.after_run(folder, "standin", rows, meta, None, None,
                                                  now=now + datetime.timedelta(minutes=i))
            print(f"\n{name}\n{summary_table(rows)}" + "".join(f"  {w}\n" for w in warnings))
            out["servers"][name] = {"rows": rows, "hints": warnings}
        shutil.copy(folder / "standin" / bench_history.PLOT_NAME,
                    RESULTS / "bench_history_metrics_example.png")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    (RESULTS / "server_metrics.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nwritten: {RESULTS / 'server_metrics.json'}, "
          f"{RESULTS / 'bench_history_metrics_example.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
