"""The set's CUDA against the host's driver (issue 21), with a lock made for real: the recorded
H200 host's driver runs 0.5.23's CUDA 13 set, its lock compiled here with uv against the
package index. The rest of the host phase on recorded outputs, in the fast tier:
tests/unit/test_host_phase_recorded.py."""

from __future__ import annotations

from test_host_phase_recorded import commands, container_answers, gpu_host_responses, h200, plan


def test_cuda_13_set_on_the_recorded_h200_driver_passes_preflight(tmp_path, monkeypatch, package_index):
    """The H200 machine's recorded driver 580.159.04 runs 0.5.23's CUDA 13 set. Its lock is made
    here with uv against the real index (into a cache of this test's own)."""
    monkeypatch.setenv("PVE_SGLANG_CACHE", str(tmp_path))
    assert "580.159.04" in h200("NvidiaDriverVersion")
    ops = plan({**gpu_host_responses(), **container_answers(None, None)}, sglang_version="0.5.23")
    assert commands(ops, "pct create")
