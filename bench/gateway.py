"""The gateway's cost and its reaction to a dead worker (issue 35): throughput through the real
smg against the same workers reached directly, at 1, 64 and 256 concurrent requests, and the
time from a worker's death to the gateway no longer sending it requests.

    .venv/bin/python bench/gateway.py [--seconds 10] [--levels 1,64,256] [--workers 2]
                                      [--wheelhouse DIR]

No root, no GPU. On 127.0.0.1: WORKERS stand-in SGLang servers (tests/standin_sglang.py:
/generate streamed at --token-delay per token, /health, /metrics), and smg from its hashed lock
(group_data/locks/smg-*.txt, ``pip install --require-hashes`` into a venv of its own, from the
index or WHEELHOUSE) started as the deploy's unit starts it (through remote/sglang_launch.py,
its flags from ``gateway.render.smg_argv``), workers registered by remote/gateway_workers.py.
The load is tests/gateway_client.py: CONCURRENCY clients sending /generate back to back, unique
prompts; a request counts as served only when its stream ended with its last event (``data:
[DONE]``): one cut short is failed whatever its status (``cut``: smg ends a stream whose worker
died with 200 and no error); "direct" spreads them over the workers in turn (balancing by hand), "gateway" sends
all to smg, once with cache_aware (the default policy) and once with round_robin (the
gateway's own cost, without the policy's choice of worker). Then, under load at 16 concurrent requests, one
worker is SIGKILLed: the time until smg marks it unhealthy (``GET /workers``, polled every
50 ms) and until the last request fails, with the health-check settings of the deploy's
defaults and with fast ones. Results: bench/results/gateway.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pve_sglang.config.gateway import smg_lock_path, validate_gateway  # noqa: E402
from pve_sglang.gateway import render  # noqa: E402
from pve_sglang.project import load_defaults  # noqa: E402
from pve_sglang.remote import GATEWAY_WORKERS, LAUNCHER, REMOTE_ENV, source  # noqa: E402

RESULTS = REPO / "bench" / "results" / "gateway.json"
STANDIN = REPO / "tests" / "standin_sglang.py"
CLIENT = REPO / "tests" / "gateway_client.py"
LOGS = REPO / "tests" / "fixtures" / "sglang_logs"
BASE_PORT = 32100


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


def smg_venv(work: Path, wheelhouse: str | None) -> Path:
    lock = smg_lock_path(load_defaults()["smg_version"], "3.11")
    venv = work / "smg-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    source_args = ["--no-index", "--find-links", wheelhouse] if wheelhouse else []
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "--require-hashes", "--no-deps", *source_args,
                    "-r", str(lock)], check=True)
    return venv


def start_workers(count: int, token_delay: float, work: Path) -> list[subprocess.Popen]:
    workers = []
    for index in range(count):
        port = BASE_PORT + 1 + index
        workers.append(subprocess.Popen(
            [sys.executable, str(STANDIN), "--logs", str(LOGS), "--port", str(port),
             "--event-file", str(work / f"event-{port}"), "--pause-scale", "0.001",
             "--enable-metrics", "--token-delay", str(token_delay)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for index in range(count):
        wait_http(f"http://127.0.0.1:{BASE_PORT + 1 + index}/health")
    return workers


def start_gateway(venv: Path, work: Path, settings: dict, ports: list[int]) -> tuple:
    """smg as the unit runs it; returns (process, settings, url)."""
    data = {"gateway_port": BASE_PORT, "gateway_prometheus_port": BASE_PORT + 90,
            "gateway_venv": str(venv), **settings}
    gs = validate_gateway("bench", data, load_defaults())
    for script in (LAUNCHER, GATEWAY_WORKERS, REMOTE_ENV):
        (work / script).write_bytes(source(script).read_bytes())
    argv = render.launch_argv(render.smg_argv(gs), [], str(work / LAUNCHER))
    log = open(work / "smg.log", "ab")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (work / "workers.json").write_text(json.dumps({"workers": [
        {"name": f"w{p}", "url": f"http://127.0.0.1:{p}", "key_env": None} for p in ports]}))
    (work / "empty.env").write_text("")
    state = work / "registered.json"
    state.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, str(work / GATEWAY_WORKERS), "sync", "--gateway",
                           f"http://127.0.0.1:{BASE_PORT}", "--workers", str(work / "workers.json"),
                           "--env-file", str(work / "empty.env"), "--keys-file",
                           str(work / "empty.env"), "--state", str(state), "--timeout", "60"],
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["listed"] == len(ports), done.stdout
    return process, gs, f"http://127.0.0.1:{BASE_PORT}"


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def cpu_s(group: int) -> float:
    """CPU seconds (user and system) of the processes of process group GROUP so far."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # pgrp
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def load(url: str, concurrency: int, seconds: float, tokens: int, group: int | None = None) -> dict:
    before = cpu_s(group) if group else 0.0
    done = subprocess.run([sys.executable, str(CLIENT), "requests", "--url", url, "--seconds",
                           str(seconds), "--concurrency", str(concurrency), "--tokens", str(tokens)],
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    latencies = sorted(end - start for start, end, status, _ in result["requests"] if status == "200")
    ok = len(latencies)
    used = cpu_s(group) - before if group else None
    return {"requests": len(result["requests"]), "ok": ok, "codes": result["codes"],
            "gateway_cpu_ms_per_request": round(1000 * used / ok, 3) if used is not None and ok
            else None,
            "req_s": ok / result["wall_s"], "tok_s": result["tok_s"],
            "latency_mean_s": statistics.fmean(latencies) if latencies else None,
            "latency_p99_s": latencies[int(0.99 * (ok - 1))] if latencies else None}


def listed(url: str) -> dict[str, bool]:
    with urllib.request.urlopen(url + "/workers", timeout=5) as answer:
        return {w["url"]: w.get("is_healthy") for w in json.load(answer)["workers"]}


def death(venv: Path, work: Path, settings: dict, args) -> dict:
    """Kill one of two workers under load: when smg marks it, when the last request fails."""
    workers = start_workers(2, args.token_delay, work)
    ports = [BASE_PORT + 1, BASE_PORT + 2]
    gateway, gs, url = start_gateway(venv, work, settings, ports)
    result: dict = {}
    try:
        out: dict = {}
        thread = threading.Thread(target=lambda: out.update(raw=subprocess.run(
            [sys.executable, str(CLIENT), "requests", "--url", url, "--seconds", str(args.death_s),
             "--concurrency", "16", "--tokens", str(args.tokens)],
            capture_output=True, text=True).stdout))
        thread.start()
        time.sleep(2)
        killed = time.time()
        workers[1].send_signal(signal.SIGKILL)
        marked = None
        while time.time() - killed < args.death_s:
            if listed(url).get(f"http://127.0.0.1:{ports[1]}") is not True:
                marked = time.time()
                break
            time.sleep(0.05)
        thread.join()
        requests = json.loads(out["raw"])["requests"]
        failed = [end for start, end, status, _ in requests if status != "200" and end >= killed]
        codes: dict[str, int] = {}
        for _start, end, status, _ in requests:
            if end >= killed and status != "200":
                codes[status] = codes.get(status, 0) + 1
        after = [status for start, _, status, _ in requests if marked and start > marked]
        result = {
            "health_check_interval_s": gs.gateway_health_check_interval_s,
            "health_failure_threshold": gs.gateway_health_failure_threshold,
            "death_to_marked_s": round(marked - killed, 2) if marked else None,
            "death_to_last_failed_request_s": round(max(failed) - killed, 2) if failed else 0.0,
            "failed_requests": len(failed), "failed_by_status": codes,
            "requests": len(requests),
            "after_marked_all_ok": bool(after) and set(after) == {"200"},
        }
    finally:
        stop(gateway)
        for worker in workers:
            worker.kill()
            worker.wait()
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--levels", default="1,64,256")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--token-delay", type=float, default=0.005)
    parser.add_argument("--death-s", type=float, default=40)
    parser.add_argument("--wheelhouse")
    parser.add_argument("--policies", default="cache_aware,round_robin")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.levels.split(",")]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pve-sglang-gateway-bench-") as folder:
        work = Path(folder)
        venv = smg_venv(work, args.wheelhouse)
        workers = start_workers(args.workers, args.token_delay, work)
        ports = [BASE_PORT + 1 + i for i in range(args.workers)]
        direct = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        rows = [{"concurrency": level} for level in levels]
        try:
            for policy in args.policies.split(","):
                gateway, _, url = start_gateway(venv, work, {"gateway_policy": policy}, ports)
                try:
                    for row in rows:
                        level = row["concurrency"]
                        # Direct, then the gateway, under the same machine load.
                        row[f"direct ({policy} run)"] = load(direct, level, args.seconds, args.tokens)
                        row[f"gateway {policy}"] = load(url, level, args.seconds, args.tokens,
                                                        gateway.pid)
                        d, g = row[f"direct ({policy} run)"], row[f"gateway {policy}"]
                        row[f"gateway {policy} tok_s pct of direct"] = round(
                            100 * g["tok_s"] / d["tok_s"], 1)
                        print(f"{level:4d} concurrent: direct {d['tok_s']:8.0f} tok/s (p99 "
                              f"{d['latency_p99_s']:.3f} s), gateway {policy} {g['tok_s']:8.0f} "
                              f"tok/s (p99 {g['latency_p99_s']:.3f} s, smg "
                              f"{g['gateway_cpu_ms_per_request']} CPU ms/request): "
                              f"{row[f'gateway {policy} tok_s pct of direct']}%", flush=True)
                finally:
                    stop(gateway)
        finally:
            for worker in workers:
                worker.kill()
                worker.wait()
        deaths = []
        for settings in ({}, {"gateway_health_check_interval_s": 1,
                              "gateway_health_failure_threshold": 2,
                              "gateway_health_check_timeout_s": 1}):
            deaths.append(death(venv, work, settings, args))
            print(f"worker killed, checks every {deaths[-1]['health_check_interval_s']} s x "
                  f"{deaths[-1]['health_failure_threshold']}: marked after "
                  f"{deaths[-1]['death_to_marked_s']} s, last failed request after "
                  f"{deaths[-1]['death_to_last_failed_request_s']} s "
                  f"({deaths[-1]['failed_requests']} of {deaths[-1]['requests']} failed: "
                  f"{deaths[-1]['failed_by_status']})",
                  flush=True)
    RESULTS.write_text(json.dumps({
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, shared",
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "smg_version": load_defaults()["smg_version"], "workers": args.workers,
        "tokens_per_request": args.tokens, "token_delay_s": args.token_delay,
        "seconds_per_level": args.seconds, "levels": rows, "worker_death": deaths,
    }, indent=2) + "\n")
    print(f"written: {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
