"""The set's CUDA against the host's driver: NVIDIA's minimums (CUDA Compatibility, Minor
Version Compatibility Table 1) and toolkit drivers (CUDA Toolkit Release Notes, "CUDA Toolkit
and Corresponding Driver Versions")."""

from __future__ import annotations

import pytest

from pve_sglang.stack.cuda_driver import driver_problem, limited_features

STACK = "sglang X (torch Y, CUDA Z)"


@pytest.mark.parametrize("cuda, driver, refused, limited", [
    ((13, 0), "580.159.04", False, False),  # the H200 machine's driver, recorded
    ((13, 0), "580.65.06", False, False),   # CUDA 13.0 GA's own driver
    ((13, 0), "580.30", False, True),       # R580, older than 13.0's toolkit driver
    ((13, 0), "575.57.08", True, False),    # R575: CUDA 12 at most
    ((13, 0), "570.172.08", True, False),
    ((12, 9), "570.172.08", False, True),   # minor version compatibility
    ((12, 8), "570.172.08", False, False),
    ((12, 9), "525.60.13", False, True),
    ((12, 9), "525.60.12", True, False),
    ((12, 9), "470.256.02", True, False),
    ((12, 9), "595.45.04", False, False),   # newer drivers run older CUDA
    ((13, 0), "not a version", False, False),
    # CUDA 11: its own minimum (450.80.02), one patch either side; no toolkit row: no note.
    ((11, 8), "450.80.02", False, False),
    ((11, 8), "450.80.01", True, False),
    ((11, 8), "418.226.00", True, False),
])
def test_cuda_against_the_driver_table(cuda, driver, refused, limited):
    assert (driver_problem(cuda, driver, STACK) is not None) == refused
    assert (limited_features(cuda, driver) is not None) == limited


def test_the_refusal_names_the_driver_the_set_and_the_way_out():
    assert driver_problem((13, 0), "570.172.08", STACK) == (
        "the NVIDIA driver 570.172.08 cannot run sglang X (torch Y, CUDA Z): CUDA 13.x needs "
        "driver >= 580 (R580 or newer; NVIDIA's CUDA Compatibility table); install driver "
        "580 or newer on the host, or a sglang_version whose CUDA major is 12")
    assert driver_problem((12, 9), "470.256.02", STACK).endswith("install driver 525 or newer on "
                                                                 "the host, or a sglang_version "
                                                                 "whose CUDA major is 11")
