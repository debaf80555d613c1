"""The stack lock without the package index: the repository's locks are the default set, the tuned
preset and the gateway's, a lock that is not the pins is refused at inventory time (exit 2, for a
hosts file and for --data alike), an index URL never lands in a lock or its name, the venv's drift
is named package by package, and a lock for a Python this machine lacks downloads no interpreter.
The locks uv makes against the real index: tests/network/test_stack_lock.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pve_sglang.config.gateway import smg_lock_path, smg_locks
from pve_sglang.stack import lock as stack_lock
from pve_sglang.operations.venv import lock_differences
from pve_sglang.project import load_defaults

#: The default set's lock for Debian 12 (the defaults' stack_python).
SHIPPED = stack_lock.SHIPPED / stack_lock.default_key().name
SGLANG = load_defaults()["sglang_version"]


def test_the_repository_lock_is_the_default_set_with_every_hash():
    key = stack_lock.default_key()
    assert SHIPPED.exists()  # found for the defaults, so nothing is made on a deploy
    lock = stack_lock.parse(SHIPPED)
    stack_lock.check(lock, key)
    defaults = load_defaults()
    assert lock.packages["sglang"] == defaults["sglang_version"] == "0.5.23"
    # torch and flashinfer follow the release: null in the defaults, the release's own versions.
    assert defaults["torch_version"] is None and defaults["flashinfer_version"] is None
    assert lock.packages["torch"] == "2.14.1" and lock.packages["flashinfer-python"] == "0.7.2"
    assert lock.packages["sglang-kernel"] == "0.4.10"
    assert defaults["stack_python"] is None and lock.python == "3.11"  # Debian 12's
    assert all(lock.hashes[name] for name in lock.packages)
    assert len(lock.packages) > 100  # the whole tree, CUDA libraries included
    assert "nvidia-cublas" in lock.packages and "transformers" in lock.packages  # CUDA 13's names


def test_the_repository_keeps_the_default_set_and_the_tuned_preset():
    kept = {path.name for path in stack_lock.SHIPPED.glob("*.txt")
            if not path.name.startswith(stack_lock.GATEWAY_LOCKS)}  # the gateway's: no stack's
    assert kept == {key.name for key in stack_lock.kept_keys()} == {
        "sglang-0.5.23-torch-2.14.1-flashinfer-0.7.2-py3.11.txt",
        "sglang-0.5.9-torch-2.9.1-flashinfer-0.6.3-py3.11.txt"}
    for key in stack_lock.kept_keys():
        lock = stack_lock.read_checked(stack_lock.SHIPPED / key.name, key)
        assert lock.platform == "x86_64-manylinux_2_36"  # Debian 12's glibc
    tuned = stack_lock.parse(stack_lock.SHIPPED / "sglang-0.5.9-torch-2.9.1-flashinfer-0.6.3-py3.11.txt")
    assert tuned.packages["sgl-kernel"] == "0.3.21" and "nvidia-cublas-cu12" in tuned.packages


def test_the_gateway_locks_are_in_the_same_folder_under_the_prefix_refresh_keeps():
    """One locks folder: the gateway's lock is found where ``refresh`` keeps it (a second
    name for the folder, or another prefix, would lose it on the next ``make lock``)."""
    defaults = load_defaults()
    path = smg_lock_path(defaults["smg_version"], defaults["gateway_python"])
    assert path.is_file() and path.parent == stack_lock.SHIPPED
    assert path.name.startswith(stack_lock.GATEWAY_LOCKS)
    assert path.name not in {key.name for key in stack_lock.kept_keys()}  # no stack's
    assert smg_locks() == [f"{defaults['smg_version']} for Python {defaults['gateway_python']}"]


def write_lock(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def other_set(path: Path) -> str:
    """The repository's lock with sglang at another version."""
    text = SHIPPED.read_text().replace(f"\nsglang=={SGLANG} \\", "\nsglang==0.5.8 \\")
    assert "sglang==0.5.8" in text
    return write_lock(path, text)


@pytest.mark.parametrize("make, expected", [
    (other_set, f"holds sglang==0.5.8, the pins say sglang=={SGLANG}"),
    (lambda p: write_lock(p, f"sglang=={SGLANG}\ntorch==2.14.1\n"), "no --hash=sha256 for sglang, torch"),
    (lambda p: write_lock(p, "sglang>=0.5\n"), "is not a 'name==version' requirement"),
    (lambda p: write_lock(p, SHIPPED.read_text().replace("# python 3.11,", "# python 3.12,")),
     "made for Python 3.12, the containers run 3.11"),
    (lambda p: write_lock(p, SHIPPED.read_text().replace("platform x86_64-manylinux_2_36,",
                                                         "platform x86_64-manylinux_2_28,")),
     "made for platform x86_64-manylinux_2_28, the containers are x86_64-manylinux_2_36"),
])
def test_a_lock_that_is_not_the_pinned_set_is_refused_before_anything_runs(pyinfra_cli, tmp_path,
                                                                          make, expected):
    lock = make(tmp_path / "given.lock")
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"pve1": {
        "ssh_hostname": "192.0.2.10", "platform": "pve",
        "containers": [{"vmid": 105, "gpus": [0], "stack_lock": lock}]}}))
    env = {"PVE_SGLANG_HOSTS": str(hosts)}
    for args in (["debug-inventory"], ["deploy.py", "--dry"]):
        done = pyinfra_cli("inventory.py", *args, env=env)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "host pve1, container 105" in done.stderr and "field 'stack_lock'" in done.stderr
        assert expected in done.stderr and "Traceback" not in done.stderr
    # The same lock through --data.
    hosts.write_text(yaml.safe_dump({"pve1": {"ssh_hostname": "192.0.2.10", "platform": "pve",
                                              "containers": [{"vmid": 105, "gpus": [0]}]}}))
    done = pyinfra_cli("inventory.py", "--data", f"stack_lock={lock}", "debug-inventory", env=env)
    assert done.returncode == 2 and expected in done.stderr, done.stderr


def test_an_index_url_never_lands_in_the_lock_or_its_name():
    key = stack_lock.LockKey(pins=(("sglang", "0.5.9"),), python="3.11",
                             index_url="https://user:s3cret@mirror.example/simple")
    assert "s3cret" not in key.name and "s3cret" not in "\n".join(key.header)
    assert key.name != stack_lock.LockKey(pins=(("sglang", "0.5.9"),), python="3.11").name


def test_lock_differences_name_each_package():
    locked = {"torch": "2.9.1", "sglang": "0.5.9", "pyyaml": "6.0.4"}
    assert lock_differences({"torch": "2.9.1", "sglang": "0.5.9", "PyYAML": "6.0.4"}, locked) == []
    assert lock_differences({"torch": "2.9.0", "PyYAML": "6.0.4", "rich": "14.0.0"}, locked) == [
        "missing: sglang", "torch 2.9.0 (lock: 2.9.1)", "not in the lock: rich"]


def test_a_lock_for_a_python_this_machine_lacks_downloads_no_interpreter(tmp_path, monkeypatch):
    """uv resolves a lock for the key's Python from metadata alone; asked for a Python this
    machine does not have, it would fetch one from outside the package index (on a closed
    network: minutes of retries). A stand-in download mirror on loopback sees no request."""
    import http.server
    import threading

    asked: list[str] = []

    class Mirror(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("UV_PYTHON_INSTALL_MIRROR", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    # An index with no package at all: the resolution fails at once, after the interpreter.
    index = tmp_path / "index"
    index.mkdir()
    key = stack_lock.key_of({"sglang_version": "0.5.23", "torch_version": None,
                             "flashinfer_version": None, "stack_python": "3.13",
                             "pip_index_url": index.as_uri(), "torch_index_url": None})
    try:
        with pytest.raises(stack_lock.LockError):
            stack_lock.compile_lock(key, tmp_path / key.name)
    finally:
        server.shutdown()
    assert asked == []
