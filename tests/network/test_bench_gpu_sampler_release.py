"""The lines pve_sglang/remote/gpu_sampler.py opens and closes its window on, as each release's own
benchmark prints them (the real wheels). The sampler itself: tests/unit/test_bench_gpu_sampler.py.
"""

from __future__ import annotations

import zipfile

import pytest

from pve_sglang.server.bench import MAIN_RUN_MARKER, RESULT_HEADER


@pytest.mark.parametrize("release, member", [("0.5.9", "sglang/bench_serving.py"),
                                             ("0.5.23", "sglang/benchmark/serving.py")])
def test_markers_are_printed_by_the_release(release, member, sglang_wheel):
    """The sampler's window opens and closes on lines the release's benchmark prints."""
    with zipfile.ZipFile(sglang_wheel(release)) as archive:
        text = archive.read(member).decode()
    assert "Starting main benchmark run..." in text and MAIN_RUN_MARKER in text
    assert f'"{RESULT_HEADER}"' in text
