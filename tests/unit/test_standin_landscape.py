"""The stand-in server reading a landscape (tests/landscapes/*.yaml): started with the flags
the deploy renders (``server_argv`` of the candidate's settings, as the unit would run them),
it serves the landscape's cap and KV pool under SGLang's real metric names, and a candidate the
landscape fails starts as that failure does (out of memory, degenerate text). A local process
speaking SGLang's protocol; no LXC container, no GPU (about 8 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from landscape import Landscape
from pve_sglang.config.settings import ContainerSettings
from pve_sglang.project import load_defaults
from pve_sglang.remote import server_metrics
from pve_sglang.server.command import server_argv
from standin_process import LOGS, STANDIN, free_port, standin

SEED_MOE = Path(__file__).parents[1] / "landscapes" / "seed_moe.yaml"
KEY = "sk-standin"
#: The KV pool divided by this: 600,000 tokens of the landscape's start hold 4 requests of
#: 1,280 tokens here (the test's requests: 1,024 prompt words and 256 new tokens).
KV_SCALE = 117.0


def flags(release: str = "0.5.23", **candidate) -> list[str]:
    """The server's flags, as the deploy renders them for CANDIDATE's settings."""
    data = {k: v for k, v in load_defaults().items() if k in ContainerSettings.model_fields}
    settings = ContainerSettings.model_validate({**data, **candidate}).model_copy(
        update={"sglang_version": release})
    return [str(word) for word in server_argv(settings, 8, ["9.0"] * 8, None, 1, None, "/py")[3:]]


def served_flags(release: str = "0.5.23", **candidate) -> list[str]:
    """FLAGS less what the stand-in sets itself (--host, --port, the key's reference)."""
    out, skip = [], False
    for word in flags(release, **candidate):
        if skip:
            skip = False
            continue
        if word in ("--host", "--port", "--api-key"):
            skip = True
            continue
        out.append(word)
    return out


def generate(url: str, words: int, new: int) -> None:
    body = json.dumps({"text": " ".join(["w"] * words), "stream": True,
                       "sampling_params": {"max_new_tokens": new}}).encode()
    request = urllib.request.Request(url + "/generate", body, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()


def figures_under_load(url: str, clients: int) -> dict:
    threads = [threading.Thread(target=generate, args=(url, 1024, 256)) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(0.6)
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for thread in threads:
        thread.join()
    total = [line for line in text.splitlines() if line.startswith("sglang:max_total_num_tokens")]
    return {**server_metrics.figures(text), "kv_tokens": float(total[0].rsplit(" ", 1)[1])}


START = {"max_running_requests": 64, "mem_fraction_static": 0.85, "disable_cuda_graph": True,
         "moe_runner_backend": "auto"}


@pytest.mark.parametrize("release, candidate, running, queued", [
    # 4 requests fit the pool (0.85 of the memory); the others wait, the KV cache full: what
    # kv_bound reads. CUDA graphs off in 0.5.23's spelling.
    ("0.5.23", START, 4, 2),
    # More KV memory (0.92), a cap of 2: the cap holds the batch (0.5.9's spellings).
    ("0.5.9", {**START, "max_running_requests": 2, "mem_fraction_static": 0.92}, 2, 4),
])
def test_the_kv_pool_and_the_cap_follow_the_flags(tmp_path, release, candidate, running, queued):
    landscape = Landscape.read(SEED_MOE)
    with standin(tmp_path, "--enable-metrics", "--landscape", str(SEED_MOE), "--kv-scale",
                 str(KV_SCALE), "--token-delay", "0.004",
                 *served_flags(release, **candidate)) as url:
        seen = figures_under_load(url, 6)
    assert seen["kv_tokens"] == int(landscape.kv_tokens(candidate) / KV_SCALE)
    assert seen["running_reqs"] == running and seen["queue_reqs"] == queued
    assert (seen["token_usage"] > 0.9) is (running == 4)


def test_a_candidate_the_landscape_fails_starts_as_that_failure(tmp_path):
    oom = {**START, "disable_cuda_graph": False, "mem_fraction_static": 0.94}
    done = subprocess.run(
        [sys.executable, str(STANDIN), "--logs", str(LOGS), "--port", str(free_port()),
         "--event-file", str(tmp_path / "event"), "--pause-scale", "0.01", "--landscape",
         str(SEED_MOE), *served_flags("0.5.23", **oom)],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "CUDA out of memory" in done.stdout
    degenerate = {**START, "moe_runner_backend": "flashinfer_trtllm"}
    with standin(tmp_path, "--landscape", str(SEED_MOE), *served_flags("0.5.23", **degenerate),
                 key=KEY) as url:
        request = urllib.request.Request(
            url + "/v1/chat/completions", json.dumps({"messages": [], "max_tokens": 8}).encode(),
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read().decode()
    assert '"content": "!"' in text
