"""The gateway's smg set fetched for the host's wheel store by the deploy's own fetch
(``wheel_fetch.fetch``, the real package index, cached once per machine), then installed from the
store alone. The fetch against a local index: tests/unit/test_wheel_fetch.py.
"""

from __future__ import annotations

import os

from pve_sglang.stack.wheel_fetch import fetch


def test_the_gateways_smg_set_is_fetched_for_the_store_and_installs_from_it_offline(
        package_index, tmp_path):
    """The host's wheel store keeps the gateway's set as it keeps a serving one: the deploy's
    own fetch of the shipped smg lock (the real index, cached once per machine), then smg
    installed from that folder alone, hashes checked, as the gateway's container installs it
    from its read-only mount (``--no-index --find-links``)."""
    import subprocess
    import sys

    from pve_sglang.config.gateway import gateway_lock, validate_gateway
    from pve_sglang.operations.gateway import install_args
    from pve_sglang.project import load_defaults

    lock, key = gateway_lock(validate_gateway("gw", {}, load_defaults()))
    folder, entries = package_index(lambda: fetch(lock, key), "the smg lock's wheels")
    assert {name.split("-")[0].lower().replace("_", "-") for name in entries} == set(lock.packages)
    for name, digest in entries.items():
        assert digest in lock.hashes[name.split("-")[0].lower().replace("_", "-")], name
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--quiet", "--require-hashes", *install_args(str(folder), None), "-r", str(lock.path)],
        capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    version = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; "
                              "print(m.version('smg'))"], capture_output=True, text=True)
    assert version.stdout.strip() == lock.packages["smg"]
