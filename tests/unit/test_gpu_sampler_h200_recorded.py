"""The GPU sampler's parser and summary on nvidia-smi output recorded on a real H200.

Recorded with `python3 tests/device/gpu_sampler_h200.py --out DIR` on one NVIDIA H200 (torch
2.11+cu130): 20 s of a light torch load, then 20 s of back-to-back bf16 matmuls, sampled every
500 ms (tests/fixtures/h200/gpu_sampler/). The summaries must tell the two apart the way the
low-power warning needs: the light run far under the 700 W limit, the heavy one near it.

Recorded again with pynvml on PYTHONPATH (tests/fixtures/h200/gpu_sampler_nvml/), a bursty load
added (bf16 matmuls for 0.3 s, idle for 0.3 s): the mean power then comes from NVML's energy
counter (which moves every 100 ms there; a read takes 3.4 ms), the samples' mean kept beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pve_sglang.remote import gpu_sampler, marked_json

RECORDED = Path(__file__).parents[1] / "fixtures" / "h200" / "gpu_sampler"
RECORDED_NVML = Path(__file__).parents[1] / "fixtures" / "h200" / "gpu_sampler_nvml"


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
        printed = marked_json(gpu_sampler.SUMMARY_PREFIX,
                              (RECORDED / f"{name}_output.txt").read_text())
        assert printed == recorded[name]["summary"]


def test_recorded_h200_energy_counter_gives_the_mean_power():
    """The energy counter's mean (exact over the window but for its 100 ms steps) against the
    samples' (40 readings of power.draw): the samples overestimate the light load by 4.5% and
    the bursty one by 2.3%; under a steady full load both agree within 0.2%."""
    recorded = json.loads((RECORDED_NVML / "summary.json").read_text())
    power = {}
    for name in ("light", "bursty", "heavy"):
        printed = marked_json(gpu_sampler.SUMMARY_PREFIX,
                              (RECORDED_NVML / f"{name}_output.txt").read_text())
        [gpu] = printed["gpus"]
        assert printed == recorded[name]["summary"] and "energy_error" not in printed
        assert gpu["power_source"] == "nvml-energy" and gpu["samples"] == 40
        assert gpu["power_pct"] == round(100 * gpu["power_w"] / gpu["power_limit_w"], 2)
        power[name] = gpu
    assert power["light"]["power_w"] < power["bursty"]["power_w"] < power["heavy"]["power_w"]
    assert 600 < power["heavy"]["power_w"] <= 700
    assert recorded["sampled_vs_energy_pct"] == {"light": 4.45, "heavy": 0.12, "bursty": 2.25}
    # The low-power warning's reading of the same runs is unchanged: light far under, heavy near.
    assert power["light"]["power_pct"] < 40 and power["heavy"]["power_pct"] > 85
