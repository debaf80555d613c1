"""The GPU sampler's parser and summary on nvidia-smi output recorded on a real H200.

Recorded with `python3 tests/device/gpu_sampler_h200.py --out DIR` on one NVIDIA H200 (torch
2.11+cu130): 20 s of a light torch load, then 20 s of back-to-back bf16 matmuls, sampled every
500 ms (tests/fixtures/h200/gpu_sampler/). The summaries must tell the two apart the way the
low-power warning needs: the light run far under the 700 W limit, the heavy one near it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pve_sglang.remote import gpu_sampler

RECORDED = Path(__file__).parent / "fixtures" / "h200" / "gpu_sampler"


def samples(name: str) -> list[dict]:
    lines = (RECORDED / f"{name}_raw.csv").read_text().splitlines()
    parsed = [gpu_sampler.parse_line(line) for line in lines]
    assert all(parsed), "every recorded nvidia-smi line parses"
    return parsed


@pytest.mark.parametrize("name, low, high", [("light", 5, 40), ("heavy", 85, 101)])
def test_recorded_h200_power_share_of_limit(name, low, high):
    [gpu] = gpu_sampler.summarise(samples(name))
    assert gpu["power_limit_w"] == 700.0 and gpu["memory_total_mib"] == 143771.0
    assert low <= gpu["power_pct"] <= high


def test_recorded_h200_summary_matches_what_the_device_printed():
    recorded = json.loads((RECORDED / "summary.json").read_text())
    for name in ("light", "heavy"):
        printed = gpu_sampler.parse_summary((RECORDED / f"{name}_output.txt").read_text())
        assert printed == recorded[name]["summary"]
