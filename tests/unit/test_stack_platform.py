"""The lock's platform follows the container's Debian release: its python3 and glibc."""

from __future__ import annotations

import pytest

from pve_sglang.stack.platform import PlatformError, platform_for
from pve_sglang.stack.wheel_fetch import platform_args


@pytest.mark.parametrize("python, debian, glibc, uv_platform", [
    ("3.11", "12", (2, 36), "x86_64-manylinux_2_36"),
    # Debian 13's glibc 2.41 is newer than uv names: its newest, 2.40, is used.
    ("3.13", "13", (2, 41), "x86_64-manylinux_2_40"),
])
def test_debian_release_platform_table(python, debian, glibc, uv_platform):
    release = platform_for(python)
    assert (release.debian, release.glibc, release.uv_platform) == (debian, glibc, uv_platform)
    tags = release.manylinux_tags
    # manylinux_2_34 (sglang from 0.5.11) and manylinux_2_28 (older wheels) are both taken.
    assert tags[0] == f"manylinux_2_{glibc[1]}_x86_64"
    assert "manylinux_2_34_x86_64" in tags and "manylinux_2_28_x86_64" in tags
    assert "manylinux_2_34_x86_64" in platform_args(python)


def test_a_python_no_debian_release_has_is_refused():
    with pytest.raises(PlatformError, match=r"Python 3\.12 is no Debian release's python3; "
                                            r"allowed: 3\.11 \(Debian 12\), 3\.13 \(Debian 13\)"):
        platform_for("3.12")
