"""remote/confine.py where Landlock is missing: a process confined to a folder by a read-only
mount namespace (root) writes there and nowhere else, whatever it tries (the tries of
tests/unit/test_confine_landlock.py, which confines with the kernel's Landlock, as any user may).
Each case runs in a process of its own, as the fetcher does.
"""

from __future__ import annotations

import errno

from test_confine_landlock import ALLOWED, REFUSED, confined_tries


def test_a_mount_namespace_keeps_every_write_inside_the_folder_where_landlock_is_missing(as_root, tmp_path):
    """The kernel without Landlock is stood in for by ABI 0: the namespace alone holds."""
    results = confined_tries(tmp_path, 0)
    assert results["how"] == "namespace"
    # Read-only (EROFS); a rename from the store to the rest is across mounts (EXDEV).
    assert {name: results[name] in (errno.EROFS, errno.EXDEV) for name in REFUSED} == dict.fromkeys(REFUSED, True)
    assert {name: results[name] for name in ALLOWED} == {name: "done" for name in ALLOWED}
    assert str(tmp_path) not in open("/proc/self/mountinfo").read()  # the host's mounts as they were
