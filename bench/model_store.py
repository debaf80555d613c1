"""The model step (issue 23): the first container, a second one of the same model, and a
download killed at half then resumed, with the model store against today's per-container
download.

    .venv/bin/python bench/model_store.py [--shards 4 --shard-mb 256] [--rate MBPS]

Needs no root and no network once its huggingface_hub venv exists (made with uv from the
package index the first time, kept under /var/tmp). Everything else happens in a private
folder under /var/tmp, removed at the end:

1. a synthetic model (config and tokenizer files, SHARDS safetensors of SHARD_MB each) served
   by tests/standin_hub.py on 127.0.0.1 (optionally at RATE MB/s per connection), the client
   the real huggingface_hub the containers' locked venv has;
2. today's download, as ``stack.model_download`` did it before this change: ``snapshot_download``
   into each container's own model_path, once per container;
3. the model store: the deploy's own ``model_store/operations.fetched`` through the pyinfra CLI on
   this machine as the host (``devtools/deploys/model_store.py``): the first container's run
   fetches into the store; a second container's run finds the commit verified and fetches
   nothing (the container then only mounts it: a bind mount, not timed here; the LXC test
   tests/lxc/test_model_store_lxc.py shows it in real containers);
4. a fetch killed (SIGKILL) once half the bytes are on disk, then the deploy's run that resumes
   it; and what today's code does after the same kill (``config.json`` is there: skipped).

The figures go to bench/results/model_store.json and are printed, with the progress lines a
user sees (a run at --demo-rate MB/s so that there are several).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from pve_sglang.model_store.rules import entry, serving_link  # noqa: E402
from pve_sglang.remote import stage  # noqa: E402
from pve_sglang.model_store.model_fetch import partial_bytes  # noqa: E402
from standin_hub import Repo, StandinHub, synthetic_files  # noqa: E402

PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY = "devtools/deploys/model_store.py"
NAME = "bench-org/Bench-Model"
COMMIT = "b" * 40


def hub_client(version: str) -> str:
    venv = Path("/var/tmp/pve-sglang-bench") / f"hf-client-{version}"
    python = venv / "bin" / "python"
    if not (venv / "ok").exists():
        uv = Path(sys.executable).parent / "uv"
        subprocess.run([str(uv), "venv", "-q", "--python", "3.11", str(venv)], check=True)
        subprocess.run([str(uv), "pip", "install", "-q", "--python", str(python),
                        f"huggingface_hub=={version}"], check=True)
        (venv / "ok").write_text(version)
    return str(python)


def locked_version() -> str:
    lock = sorted((REPO / "group_data" / "locks").glob("sglang-*.txt"))[0]
    return re.search(r"^huggingface-hub==(\S+)", lock.read_text(), re.M).group(1)


class Bench:
    def __init__(self, work: Path, python: str, hub: StandinHub):
        self.work, self.python, self.hub = work, python, hub
        self.env_file = work / "hf.env"
        self.env_file.write_text(f'HF_ENDPOINT="{hub.url}"\n')
        self.env_file.chmod(0o600)

    def env(self) -> dict:
        return {**os.environ, "HF_ENDPOINT": self.hub.url, "HF_HOME": str(self.work / "hf-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1"}

    def today(self, model_path: Path) -> float:
        """snapshot_download into MODEL_PATH, as stack.model_download ran it."""
        code = (f"from huggingface_hub import snapshot_download; snapshot_download("
                f"repo_id={NAME!r}, revision=None, local_dir={str(model_path)!r})")
        started = time.monotonic()
        subprocess.run([self.python, "-c", code], env=self.env(), check=True,
                       capture_output=True)
        return time.monotonic() - started

    def store_data(self, store: Path, interval_s: float = 30.0) -> dict:
        return {"fetch": True, "python": self.python, "script": str(stage("model_fetch.py", self.work / "tools")),
                "repo": NAME, "root": entry(str(store), NAME),
                "link": serving_link(str(store), NAME, None), "env_file": str(self.env_file),
                "interval_s": interval_s, "space_of": f"the store {store}"}

    def deploy(self, data: dict) -> tuple[float, list[str], str]:
        inventory = self.work / "inventory.py"
        inventory.write_text(f"hosts = {[('@local', data)]!r}\n")
        started = time.monotonic()
        done = subprocess.run([str(PYINFRA), str(inventory), DEPLOY, "-y", "--json"], cwd=REPO,
                              capture_output=True, text=True)
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        if done.returncode != 0:
            raise SystemExit(output[-3000:])
        changed = [op["name"] for op in json.loads(done.stdout[done.stdout.find("{"):])
                   ["results"]["operations"] if op["success"]]
        return seconds, changed, output

    def kill_at_half(self, argv: list[str], folder: Path, total: int) -> None:
        process = subprocess.Popen(argv, env=self.env(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        while process.poll() is None:
            whole = sum(p.stat().st_size for p in folder.glob("*") if p.is_file())
            if whole + partial_bytes(str(folder)) >= total // 2:
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        process.wait()


def progress_lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines()
            if "files" in line and ("/s, ETA" in line or "to fetch" in line or "verified" in line)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=256)
    parser.add_argument("--rate", type=float, default=None, help="MB/s per connection")
    parser.add_argument("--demo-rate", type=float, default=8.0,
                        help="MB/s per connection of the run whose progress lines are shown")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "model_store.json")
    args = parser.parse_args()
    python = hub_client(locked_version())
    work = Path(tempfile.mkdtemp(prefix="model-store-bench-", dir="/var/tmp"))
    try:
        files = synthetic_files(work / "hubfiles", args.shards, args.shard_mb * 1024 * 1024, seed="bench")
        total = sum(p.stat().st_size for p in files.values())
        hub = StandinHub(repos={NAME: Repo(refs={"main": COMMIT}, commits={COMMIT: files})},
                         rate=int(args.rate * 1e6) if args.rate else None)
        hub.start()
        bench = Bench(work, python, hub)
        results: dict = {"model_bytes": total, "files": len(files), "rate_mb_s": args.rate,
                         "huggingface_hub": locked_version(), "cpus": os.cpu_count()}

        # Today: each container downloads the whole model into its own model_path.
        sent = hub.bytes_sent
        results["today_first_s"] = bench.today(work / "ct1" / "model")
        results["today_second_s"] = bench.today(work / "ct2" / "model")
        results["today_bytes_fetched"] = hub.bytes_sent - sent

        # The store: the host fetches once; a second container's run fetches nothing.
        store = work / "store"
        sent = hub.bytes_sent
        seconds, changed, _ = bench.deploy(bench.store_data(store))
        results["store_first_s"], results["store_first_changed"] = seconds, changed
        seconds, changed, _ = bench.deploy(bench.store_data(store))
        results["store_second_s"], results["store_second_changed"] = seconds, changed
        results["store_bytes_fetched"] = hub.bytes_sent - sent

        # Killed at half, then resumed by the deploy; and today's code after the same kill.
        resume = work / "resume-store"
        data = bench.store_data(resume)
        argv = [python, data["script"], "fetch", "--repo", NAME, "--commit", COMMIT, "--root",
                data["root"], "--env-file", str(bench.env_file), "--workers", "8"]
        bench.kill_at_half(argv, Path(data["root"]) / COMMIT, total)
        sent = hub.bytes_sent
        seconds, changed, output = bench.deploy(data)
        results["resume_s"], results["resume_bytes_fetched"] = seconds, hub.bytes_sent - sent
        results["resume_lines"] = progress_lines(output)
        today = work / "ct3" / "model"
        bench.kill_at_half([python, "-c", f"from huggingface_hub import snapshot_download; "
                            f"snapshot_download(repo_id={NAME!r}, local_dir={str(today)!r})"],
                           today, total)
        results["today_after_kill_config_json"] = (today / "config.json").exists()
        results["today_after_kill_bytes_on_disk"] = sum(
            p.stat().st_size for p in today.glob("*") if p.is_file()) + partial_bytes(str(today))

        # What a user sees: a slower link, a line every 2 seconds.
        hub.rate = int(args.demo_rate * 1e6)
        _, _, output = bench.deploy(bench.store_data(work / "demo-store", interval_s=2.0))
        results["demo_rate_mb_s"] = args.demo_rate
        results["demo_lines"] = progress_lines(output)
        hub.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    gb = total / 1e9
    print(f"model: {gb:.2f} GB in {results['files']} files; hub {args.rate or 'unthrottled'} MB/s")
    print(f"{'':32} {'today':>10} {'store':>10}")
    print(f"{'first container (s)':32} {results['today_first_s']:10.1f} {results['store_first_s']:10.1f}")
    print(f"{'second container (s)':32} {results['today_second_s']:10.1f} {results['store_second_s']:10.1f}")
    print(f"{'bytes fetched, 2 containers (GB)':32} {results['today_bytes_fetched'] / 1e9:10.2f} "
          f"{results['store_bytes_fetched'] / 1e9:10.2f}")
    print(f"resume after a kill at half: {results['resume_s']:.1f}s, "
          f"{results['resume_bytes_fetched'] / 1e9:.2f} GB fetched again")
    print(f"today after the same kill: config.json there: {results['today_after_kill_config_json']}"
          f", {results['today_after_kill_bytes_on_disk'] / 1e9:.2f} of {gb:.2f} GB on disk "
          "(its next run skipped the download: config.json exists)")
    print("\n".join(["", "resume run:", *results["resume_lines"], "",
                     f"progress lines at {args.demo_rate} MB/s:", *results["demo_lines"]]))


if __name__ == "__main__":
    main()
