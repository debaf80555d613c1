"""The model store in real LXC containers: this machine as the plain LXC host (``@local``)
fetches the model once into the store with the real huggingface_hub client from
tests/standin_hub.py; two unprivileged containers (no network: a loopback-only namespace)
mount the commit's serving link read-only at model_path, as ``ContainerSettings.all_mounts``
renders it, and the verify step says which commit each serves. The deploy is
``devtools/deploys/model_store.py`` through the pyinfra CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.lxc_env import reachable_by_container_root
from pve_sglang.config.settings import ContainerSettings, settings_for
from pve_sglang.container_config.lxc_keys import mount_lines
from pve_sglang.project import load_defaults
from pve_sglang.model_store import entry, serving_link
from pve_sglang.remote import source
from standin_hub import Repo, StandinHub, synthetic_files

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY = "devtools/deploys/model_store.py"
NAME = "standin-org/Standin-7B"
COMMIT = "5" * 40
MODEL_PATH = "/models/model"


@pytest.fixture
def hub(tmp_path):
    files = synthetic_files(tmp_path / "hubfiles", 3, 8 * 1024 * 1024, seed="lxc")
    hub = StandinHub(repos={NAME: Repo(refs={"main": COMMIT}, commits={COMMIT: files})})
    hub.start()
    yield hub
    hub.stop()


def file_gets(hub: StandinHub) -> int:
    return sum(1 for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path)


def deploy(tmp: Path, hosts: list) -> tuple[dict, str]:
    inventory = tmp / "inventory.py"
    inventory.write_text(f"hosts = {hosts!r}\n")
    done = subprocess.run([str(PYINFRA), str(inventory), DEPLOY, "-y", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    changed: dict = {}
    for op in json.loads(done.stdout[done.stdout.find("{"):])["results"]["operations"]:
        for name in op["success"]:
            changed.setdefault(name, []).append(op["name"])
    return changed, output


def test_store_fetched_once_per_host_and_mounted_read_only_in_each_container(
        hf_python, hub, tmp_path, lxc_container_factory):
    store = tmp_path / "store"
    store.mkdir()
    reachable_by_container_root(store)
    env_file = tmp_path / "hf.env"
    env_file.write_text(f'HF_ENDPOINT="{hub.url}"\n')
    env_file.chmod(0o600)
    link = serving_link(str(store), NAME, None)
    local = ("@local", {"fetch": True, "python": hf_python, "script": str(source("model_fetch.py")),
                        "repo": NAME, "root": entry(str(store), NAME), "link": link,
                        "env_file": str(env_file), "interval_s": 0.5})
    changed, output = deploy(tmp_path, [local])
    assert changed == {"@local": [f"Model {NAME}"]}
    fetched = file_gets(hub)
    assert fetched == 6

    # The mount line the deploy writes for model_store (lxc_keys.mount_lines), on the link.
    cs = settings_for({**load_defaults(), "model_store": str(store), "model_download": NAME,
                       "model_path": MODEL_PATH}, ContainerSettings)
    [line] = [line for line in mount_lines(cs) if str(store) in line]
    assert line.startswith(f"lxc.mount.entry = {link} models/model none bind,ro,")
    boxes = lxc_container_factory(2, extra_config=[line], unprivileged=True)
    served = [(box.inventory_name, {**box.host_data(), "serves": MODEL_PATH, "repo": NAME})
              for box in boxes]
    changed, output = deploy(tmp_path, [local, *served])
    assert changed == {}, output[-3000:]  # the host's model is verified: nothing to fetch
    assert file_gets(hub) == fetched
    for box in boxes:
        assert f"@lxc/{box.name}: serves {NAME} at commit {COMMIT}: 6 files" in output
        listing = box.attach(f"cat {MODEL_PATH}/config.json").stdout
        assert "StandinForCausalLM" in listing
        write = box.attach(f"touch {MODEL_PATH}/x", check=False)
        assert write.returncode != 0 and "Read-only file system" in write.stderr
