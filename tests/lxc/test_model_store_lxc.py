"""The model store in real LXC containers: this machine as the plain LXC host (``@local``)
fetches the model once into the store with the real huggingface_hub client from
tests/standin_hub.py; two unprivileged containers (no network: a loopback-only namespace)
mount the commit's serving link read-only at model_path, as ``ContainerSettings.all_mounts``
renders it, and the verify step says which commit each serves. The deploy is
``devtools/deploys/model_store.py`` through the pyinfra CLI.

Inside a container, as a container without a model store fetches: the real huggingface_hub
client (the lock's release, copied offline from the test cache's venv into a venv of the
container's own Python) runs ``model_store/model_fetch.py`` against the stand-in hub, which listens
on the bridge's address (the container's gateway over its veth): a fetch killed mid-shard resumes
without fetching a complete file again, and a corrupted file is fetched again.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.lxc_env import reachable_by_container_root
from pve_sglang.config.settings import ContainerSettings, settings_for
from pve_sglang.container_config.lxc_keys import mount_lines
from pve_sglang.project import load_defaults
from pve_sglang.model_store.rules import entry, serving_link
from pve_sglang import remote
from pve_sglang.remote import source
from standin_hub import StandinHub, serving, synthetic_files

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY = "devtools/deploys/model_store.py"
NAME = "standin-org/Standin-7B"
COMMIT = "5" * 40
MODEL_PATH = "/models/model"


@pytest.fixture
def hub(tmp_path):
    with serving(NAME, COMMIT, synthetic_files(tmp_path / "hubfiles", 3, 8 * 1024 * 1024,
                                               seed="lxc")) as hub:
        yield hub


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
    local = ("@local", {"fetch": True, "python": hf_python, "script": str(remote.stage(remote.MODEL_FETCH, tmp_path / "tools")),
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


# --- in a container: the real client offline, killed and resumed, a file corrupted --------

#: The container's own venv with the client, and where the fetcher goes (as remote.path puts it).
CT_VENV = "/opt/hf"
CT_TOOLS = "/opt/sglang"
CT_ENV = "/etc/sglang/sglang.env"
CT_ROOT = "/models/model"
BIG_SHARD = 24 * 1024 * 1024  # above the client's 10 MB writes: a partial shard reaches the disk


@pytest.fixture(scope="module")
def fetch_box(lxc_env, hf_clients):
    """A container on the bridge with each huggingface_hub release of the locks in a venv of its
    own Python (``CT_VENV-VERSION``), installed offline from the test cache's client venvs (the
    container never reaches an index), and the fetcher uploaded as the deploy uploads it."""
    box = lxc_env.create(network="bridge")
    box.attach(f"mkdir -p {CT_TOOLS} /etc/sglang {CT_ROOT}")
    for version, python in hf_clients.items():
        [site] = (Path(python).parents[1] / "lib").glob("python3.*/site-packages")
        venv = f"{CT_VENV}-{version}"
        box.attach(f"python3 -m venv {venv}")
        packed = subprocess.run(["tar", "-C", str(site), "-c", "."], capture_output=True,
                                check=True).stdout
        box.attach(f"tar -x -C $(echo {venv}/lib/python3.*/site-packages)", input=packed)
        found = box.attach([f"{venv}/bin/python", "-c",
                            "import huggingface_hub as h; print(h.__version__)"]).stdout.strip()
        assert found == version
    for script in (remote.MODEL_FETCH, *remote.companions(remote.MODEL_FETCH)):
        box.attach(f"cat > {remote.path(script, CT_TOOLS)}", input=source(script).read_bytes())
    yield box
    box.destroy()


class InBox:
    """``model_fetch.py`` run in BOX with the client VERSION's venv, flat in CT_ROOT (no model
    store, a fresh one), the hub named in the 0600 env file."""

    def __init__(self, box, hub: StandinHub, version: str):
        self.box, self.hub, self.venv = box, hub, f"{CT_VENV}-{version}"
        box.attach(f"rm -rf {CT_ROOT} && mkdir -p {CT_ROOT} && printf 'HF_ENDPOINT=\"%s\"\\n' "
                   f"{hub.url} > {CT_ENV} && chmod 600 {CT_ENV}")

    def argv(self, command: str, *extra: str) -> list[str]:
        return [f"{self.venv}/bin/python", remote.path(remote.MODEL_FETCH, CT_TOOLS), command,
                "--repo", NAME, "--root", CT_ROOT, "--flat", "--env-file", CT_ENV, *extra]

    def run(self, command: str, *extra: str) -> list[dict]:
        out = self.box.attach(self.argv(command, *extra), timeout=300).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def python(self, code: str):
        """CODE's printed JSON, run by the venv's Python with the fetcher importable."""
        done = self.box.attach([f"{self.venv}/bin/python", "-c", "import sys, json; sys.path.insert("
                                f"0, {CT_TOOLS!r}); import model_fetch as m; " + code])
        return json.loads(done.stdout)


@pytest.mark.parametrize("version", ["0.36.2", "1.33.0"])
def test_in_a_container_a_killed_fetch_resumes_and_a_corrupted_file_is_fetched_again(
        fetch_box, tmp_path, version, hf_clients):
    if version not in hf_clients:
        pytest.skip(f"no lock has huggingface_hub {version} now: {sorted(hf_clients)}")
    files = synthetic_files(tmp_path / "hubfiles", 3, BIG_SHARD, seed="ct")
    # On the bridge's address: the container's way out.
    with serving(NAME, COMMIT, files, host=str(fetch_box.gateway)) as hub:
        box = InBox(fetch_box, hub, version)
        plan = box.run("plan")[-1]
        assert (plan["commit"], plan["missing_files"], plan["complete"]) == (COMMIT, 6, False), plan
        hub.rate = BIG_SHARD // 2  # a shard in two seconds
        started = box.box.attach(" ".join(box.argv("fetch", "--commit", COMMIT, "--workers", "1",
                                                   "--interval", "0.1"))
                                 + " </dev/null >/dev/null 2>&1 & echo $!").stdout.strip()
        shards = [name for name in files if name.endswith(".safetensors")]
        probe = (f"d = {CT_ROOT!r}; import os; print(json.dumps([[n for n in {shards!r} if "
                 "os.path.exists(os.path.join(d, n))], m.partial_bytes(d)]))")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # killed with a shard whole and the next one begun
            whole, partial = box.python(probe)
            if whole and partial > BIG_SHARD // 4:
                break
            time.sleep(0.1)
        else:
            pytest.fail("no whole shard and a partial one within 90s")
        box.box.attach(f"kill -KILL {int(started)}")
        whole, partial = box.python(probe)
        assert whole and partial > 0
        plan = box.run("plan")[-1]
        assert not plan["complete"] and plan["partial_bytes"] > 0
        hub.rate = None
        before = len(hub.requests)
        assert "done" in box.run("fetch", "--commit", COMMIT)[-1]
        after = [(path.rsplit("/", 1)[1], start) for method, path, start in hub.requests[before:]
                 if method == "GET" and "/resolve/" in path]
        assert after and not {name for name, _ in after} & set(whole)  # nothing whole again
        assert box.python("print(json.dumps(m.client_resumes()))") == (version == "0.36.2")
        if version == "0.36.2":
            assert any(start > 0 for _, start in after)  # the cut shard resumed from its bytes
        else:  # huggingface_hub 1.33 starts a cut file again, its killed part removed first
            assert all(start == 0 for _, start in after)
        digests = box.box.attach(f"cd {CT_ROOT} && sha256sum {' '.join(files)}").stdout
        assert digests.split() == [x for name, path in files.items()
                                   for x in (hashlib.sha256(path.read_bytes()).hexdigest(), name)]

        # A byte flipped in a shard: the plan sees it, the fetch gets that file alone again.
        victim = shards[-1]
        box.python(f"p = {CT_ROOT + '/' + victim!r}; f = open(p, 'r+b'); f.seek({BIG_SHARD // 2}); "
                   "b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 255])); f.close(); print(1)")
        plan = box.run("plan")[-1]
        assert (plan["complete"], plan["missing_files"]) == (False, 1)
        gets = {name: hub.model_files_gets(name) for name in files}
        done = box.run("fetch", "--commit", COMMIT)[-1]["done"]
        assert done["fetched_files"] == 1
        assert {n: hub.model_files_gets(n) - gets[n] for n in files} == {
            n: int(n == victim) for n in files}
        assert box.run("plan")[-1]["complete"]
