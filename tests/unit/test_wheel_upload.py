"""The wheel store's upload (``wheels.upload``) on this machine as the host (``@local``, a plain
LXC host run locally), through pyinfra's real LocalConnector: the file arrives whole, and no
copy of it stays on disk behind a descriptor the run never closes (pyinfra's own
``put_file`` keeps one per file until the run ends: the whole store twice).
"""

from __future__ import annotations

import os
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all

from pve_sglang.operations.wheels import upload, upload_all


def deleted_open_files() -> list[str]:
    """The files this process holds open that are deleted (their space not given back)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed already
            continue
        if target.endswith(" (deleted)"):
            found.append(target)
    return found


def local_host():
    inventory = Inventory((["@local"], {}))
    connect_all(State(inventory, Config()))
    return inventory.get_host("@local")


def test_an_upload_to_this_machine_arrives_whole_and_keeps_no_hidden_copy(tmp_path):
    wheel = tmp_path / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(os.urandom(1 << 20))
    dest = tmp_path / "store" / ".incoming" / "it's $(touch F).whl"
    dest.parent.mkdir(parents=True)
    before = deleted_open_files()
    assert upload(local_host(), wheel, str(dest))
    assert dest.read_bytes() == wheel.read_bytes()
    # Only a new one counts: another test's cleanup may close its own meanwhile.
    assert set(deleted_open_files()) - set(before) == set()
    assert not Path("F").exists() and not (tmp_path / "F").exists()


def test_an_upload_to_this_machine_links_a_root_owned_wheel_and_copies_another(tmp_path):
    """The store takes no second copy of a wheel that root owns and alone can write (one inode);
    one a user could change is copied. A file left at DEST by a killed run, itself a link to
    another wheel, is replaced, never written through."""
    owned = tmp_path / "cache" / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    owned.parent.mkdir()
    owned.write_bytes(os.urandom(1 << 16))
    other = tmp_path / "cache" / "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    other.write_bytes(b"numpy")
    incoming = tmp_path / "store" / ".incoming"
    incoming.mkdir(parents=True)
    left = incoming / "it's $(touch F) torch.whl"
    os.link(other, left)  # a killed run's leftover, a link to another cache file
    host = local_host()
    assert upload(host, owned, str(left))
    assert os.path.samefile(owned, left)
    assert other.read_bytes() == b"numpy"  # the leftover's target is untouched

    os.chown(owned, 1000, 1000)  # a user's file: copied, so the user cannot change the store
    copied = incoming / "copied.whl"
    assert upload(host, owned, str(copied))
    assert copied.read_bytes() == owned.read_bytes() and not os.path.samefile(owned, copied)
    os.chown(owned, 0, 0)
    owned.chmod(0o666)  # root's, but anyone may write it: copied too
    assert upload(host, owned, str(incoming / "copied-2.whl"))
    assert not os.path.samefile(owned, incoming / "copied-2.whl")
    assert not Path("F").exists() and not (tmp_path / "F").exists()


def test_uploads_to_this_machine_go_in_batches_and_each_arrives(tmp_path):
    sources = []
    for index, name in enumerate(["a.whl", "it's $(touch F).whl", "c d.whl", "e\nf.whl", "g.whl"]):
        source = tmp_path / "cache" / name
        source.parent.mkdir(exist_ok=True)
        source.write_bytes(bytes([index]) * 100)
        sources.append(source)
    incoming = tmp_path / "store" / ".incoming"
    incoming.mkdir(parents=True)
    assert upload_all(local_host(), [(s, str(incoming / s.name)) for s in sources], batch=2)
    assert {p.name: p.read_bytes() for p in incoming.iterdir()} == {
        s.name: s.read_bytes() for s in sources}
    assert not Path("F").exists() and not (tmp_path / "F").exists()
    # A batch that fails stops there: the next batch is not tried.
    gone = [(tmp_path / "no-such.whl", str(incoming / "x.whl")),
            (sources[0], str(incoming / "y.whl")), (sources[1], str(incoming / "z.whl"))]
    assert not upload_all(local_host(), gone, batch=2)
    assert not (incoming / "z.whl").exists()
