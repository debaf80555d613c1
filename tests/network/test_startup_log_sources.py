"""The startup log parser against each tested release's own sources (the real wheels): the release
logs a line of every phase in a spelling the parser knows (``SOURCE_LINES`` of
tests/unit/test_startup_log.py), and its progress lines in the spelling the parser reads.
"""

from __future__ import annotations

import zipfile

import pytest

from pve_sglang.server.startup_log import PHASES
from test_startup_log import SOURCE_LINES

#: What the progress messages read, as each release's source spells it.
PROGRESS_SOURCES = [
    'desc="Loading safetensors checkpoint shards"',
    'desc="Multi-thread loading shards"',
    'BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]',
    "#tokens: {num_tokens}, K size: {k_size_GB:.2f} GB",
    'logger.info("FlashInfer autotune completed.")',
]
TESTED_RELEASES = ["0.5.9", "0.5.10", "0.5.11", "0.5.13", "0.5.18", "0.5.22", "0.5.23"]


@pytest.mark.parametrize("release", TESTED_RELEASES)
def test_every_phase_is_found_in_the_release_sources(release, sglang_wheel):
    """The release logs a line of every phase in a spelling the parser knows (SOURCE_LINES),
    and the progress lines in the spelling it reads."""
    with zipfile.ZipFile(sglang_wheel(release)) as archive:
        source = "\n".join(archive.read(name).decode(errors="replace") for name in archive.namelist()
                           if name.startswith("sglang/srt/") and name.endswith(".py"))
    found = {phase for phase, call, _ in SOURCE_LINES if call in source}
    assert found == {name for name, _ in PHASES}, release
    missing = [call for call in PROGRESS_SOURCES if call not in source]
    assert not missing, f"sglang {release} no longer has {missing}"
