"""The stack lock: the repository's lock is the default set, a lock that is not the pins is
refused at inventory time (exit 2, for a hosts file and for --data alike), a user's set gets
its lock made once on this machine and reused, and the venv's drift is named package by
package."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_the_lock_of_a_users_set_is_made_once_here_and_reused(tmp_path, package_index):
    """Another release set than the repository's: uv makes its lock (real index, with uv's
    retries and the first run tried again) into this machine's cache; a later run (another
    process) finds it there and makes nothing."""
    env = {**os.environ, "PVE_SGLANG_CACHE": str(tmp_path)}
    script = ("from pve_sglang.stack import lock as s; k = s.LockKey(pins=(('sglang', '0.5.8'), "
              "('torch', '2.9.1'), ('flashinfer-python', '0.6.1')), python='3.11'); "
              "l = s.lock_for(k); print(l.path, l.packages['sglang'], len(l.packages))")

    def make() -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done

    first = package_index(make, "the lock of sglang 0.5.8 (uv pip compile)")
    path, version, count = first.stdout.split()
    assert Path(path).parent == tmp_path / "locks" and version == "0.5.8" and int(count) > 100
    made = Path(path).stat().st_mtime_ns
    # uv could not make it again: an index that does not answer.
    offline = {**env, "UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple", "UV_OFFLINE": "1"}
    again = subprocess.run([sys.executable, "-c", script], env=offline, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and Path(path).stat().st_mtime_ns == made


def test_a_set_uv_cannot_resolve_says_so_and_leaves_no_lock(tmp_path, package_index):
    key = stack_lock.LockKey(pins=(("sglang", "0.0.0"), ("torch", "2.9.1"),
                                   ("flashinfer-python", "0.6.3")), python="3.11")
    with pytest.raises(stack_lock.LockError, match=r"(?s)could not make the lock of sglang==0\.0\.0 .*"
                       r"give a lock in stack_lock"):
        stack_lock.compile_lock(key, tmp_path / key.name)
    assert list(tmp_path.iterdir()) == []


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


def test_the_newest_release_locks_for_debian_12(tmp_path, package_index):
    """Issue 21: from 0.5.11 sglang ships manylinux_2_34 wheels only, which a lock for
    manylinux_2_28 could not take. Locked here with uv against the real index."""
    values = {"sglang_version": "0.5.23", "torch_version": None, "flashinfer_version": None,
              "stack_python": "3.11", "pip_index_url": None, "torch_index_url": None}
    key = stack_lock.key_of(values)
    assert key.platform == "x86_64-manylinux_2_36"
    lock = stack_lock.compile_lock(key, tmp_path / key.name)
    assert (lock.platform, lock.python) == ("x86_64-manylinux_2_36", "3.11")
    assert {n: lock.packages[n] for n in ("sglang", "torch", "flashinfer-python", "sglang-kernel")} == {
        "sglang": "0.5.23", "torch": "2.14.1", "flashinfer-python": "0.7.2", "sglang-kernel": "0.4.10"}
    assert stack_lock.parse(lock.path).platform == "x86_64-manylinux_2_36"


@pytest.mark.parametrize("sglang, python, missing", [
    # outlines 0.1.11 (0.5.23's pin) pins outlines-core 0.1.26: no cp313 wheel (Debian 13).
    ("0.5.23", "3.13", "outlines-core==0.1.26 has no usable wheels"),
    # 0.5.19 to 0.5.21 pin cuda-tile 1.6.0rc5, published as an sdist only.
    ("0.5.21", "3.11", "cuda-tile==1.6.0rc5 has no usable wheels"),
])
def test_a_set_without_a_wheel_for_every_package_is_refused_at_lock_time(tmp_path, sglang, python,
                                                                        missing, package_index):
    """The store and the containers install wheels only: a lock naming an sdist would fail
    later, when its wheels are fetched; uv names the package now."""
    values = {"sglang_version": sglang, "torch_version": None, "flashinfer_version": None,
              "stack_python": python, "pip_index_url": None, "torch_index_url": None}
    key = stack_lock.key_of(values)
    with pytest.raises(stack_lock.LockError) as caught:
        stack_lock.compile_lock(key, tmp_path / key.name)
    assert missing in str(caught.value)
    assert list(tmp_path.iterdir()) == []


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
