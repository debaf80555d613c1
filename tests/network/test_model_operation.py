"""model_store/operations.py through pyinfra's CLI on this machine (``@local``,
devtools/deploys/model_store.py): the real huggingface_hub client against tests/standin_hub.py.
What a user sees while it downloads (the progress lines), a re-run that changes nothing, the
checks before any byte moves (too little space, a gated model without a token, a missing
repository), a moved branch reported and not followed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pve_sglang.model_store.rules import entry, serving_link
from pve_sglang.remote import stage
from pve_sglang.model_store.model_fetch import MARKER
from standin_hub import StandinHub, serving, synthetic_files

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
DEPLOY = "devtools/deploys/model_store.py"
NAME = "standin-org/Standin-7B"
TOKEN = "hf_standin_token_Op4"
SHARD = 12 * 1024 * 1024


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, Path]:
    return synthetic_files(tmp_path_factory.mktemp("hubfiles"), 3, SHARD, seed="op")


@pytest.fixture
def hub(shards):
    with serving(NAME, "3" * 40, shards, {TOKEN}) as hub:
        yield hub


class Site:
    def __init__(self, python: str, hub: StandinHub, tmp: Path):
        self.hub, self.tmp = hub, tmp
        self.store = tmp / "store"
        self.env_file = tmp / "hf.env"
        self.write_env()
        self.data = {"fetch": True, "python": python, "script": str(stage("model_fetch.py", tmp / "tools")),
                     "repo": NAME, "root": entry(str(self.store), NAME),
                     "link": serving_link(str(self.store), NAME, None),
                     "env_file": str(self.env_file), "interval_s": 0.2,
                     "space_of": f"the store {self.store}"}

    def write_env(self, token: str | None = None) -> None:
        lines = [f'HF_ENDPOINT="{self.hub.url}"'] + ([f'HF_TOKEN="{token}"'] if token else [])
        self.env_file.write_text("\n".join(lines) + "\n")
        self.env_file.chmod(0o600)

    def deploy(self, dry: bool = False, **data) -> tuple[bool, list[str], str]:
        """(it succeeded, the operations it changed, its output); DRY: a plan (``--dry``)."""
        inventory = self.tmp / "inventory.py"
        inventory.write_text(f"hosts = {[('@local', {**self.data, **data})]!r}\n")
        done = subprocess.run([str(PYINFRA), str(inventory), DEPLOY, "--dry" if dry else "-y",
                               "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        assert TOKEN not in output
        changed = []
        if done.returncode == 0 and dry:  # the operations the plan lists as changes
            plan = json.loads(done.stdout[done.stdout.find("{"):done.stdout.find("\n--> ")])
            changed = [op["name"] for op in plan["plan"] if op["hosts_with_change"]]
        elif done.returncode == 0:
            start = done.stdout.find("{")
            for op in json.loads(done.stdout[start:])["results"]["operations"]:
                changed += [op["name"] for name in op["success"]]
        return done.returncode == 0, changed, output


@pytest.fixture
def site(hf_python, hub, tmp_path) -> Site:
    return Site(hf_python, hub, tmp_path)


def file_gets(hub: StandinHub) -> int:
    return sum(1 for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path)


def test_download_shows_progress_then_a_rerun_changes_nothing(site, hub, shards):
    hub.rate = SHARD  # a shard a second: a few progress lines
    ok, changed, output = site.deploy()
    assert ok, output[-3000:]
    assert changed == [f"Model {NAME}"]
    progress = [line for line in output.splitlines() if "files" in line and " of " in line and "/s" in line]
    assert progress, output[-3000:]
    print("\n".join(progress))
    assert "0 of 6 files to fetch" not in output and "6 of 6 files to fetch" in output
    link = Path(site.data["link"])
    commit = "3" * 40
    assert link.resolve() == Path(site.data["root"]) / commit
    assert json.loads((link / MARKER).read_text())["commit"] == commit
    for name, path in shards.items():
        assert (link / name).read_bytes() == path.read_bytes()
    gets = file_gets(hub)
    ok, changed, output = site.deploy()
    assert ok and changed == [], output[-3000:]
    assert f"model {NAME} at commit {commit}: 6 files" in output
    assert file_gets(hub) == gets


def test_too_little_space_is_refused_before_any_byte_moves(site, hub, shards):
    hub.repos[NAME].declared = {name: 10**15 for name in shards if name.endswith(".safetensors")}
    for dry in (True, False):  # a plan shows the error the run hits, before any change
        ok, _, output = site.deploy(dry=dry)
        assert not ok
        print(output)
        assert "host @local: model standin-org/Standin-7B@333333333333 needs 3000.0 TB more" in output
        assert f"the store {site.store} has" in output and "free" in output
        assert "Preparing operation files" in output and "--> Beginning operation run" not in output
        assert not Path(site.data["root"]).exists()
    assert file_gets(hub) == 0
    assert not any(p.is_file() for p in Path(site.data["root"]).rglob("*.safetensors"))


def test_gated_model_without_a_token_is_refused_then_fetched_with_one(site, hub):
    hub.repos[NAME].gated = True
    for dry in (True, False):  # a plan shows the error the run hits, before any change
        ok, _, output = site.deploy(dry=dry)
        print(output)
        assert not ok and "host @local: standin-org/Standin-7B at revision '3333333333333333333333333333333333333333' is gated and the token (hf_token) has no access" in output
        assert "--> Beginning operation run" not in output
    assert file_gets(hub) == 0
    site.write_env(TOKEN)
    ok, changed, output = site.deploy()
    assert ok and changed == [f"Model {NAME}"], output[-3000:]


def test_missing_repository_is_named(site, hub):
    for dry in (True, False):
        ok, _, output = site.deploy(dry=dry, repo="standin-org/Nothing-Here",
                                    root=entry(str(site.store), "standin-org/Nothing-Here"))
        assert not ok and "host @local: repository standin-org/Nothing-Here does not exist" in output
        assert "--> Beginning operation run" not in output


def test_moved_branch_is_reported_and_the_recorded_commit_served(site, hub, shards, tmp_path):
    ok, _, _ = site.deploy()
    assert ok
    moved = "4" * 40
    newer = dict(shards, **{"config.json": tmp_path / "config-v2.json"})
    newer["config.json"].write_text('{"v": 2}')
    hub.repos[NAME].commits[moved] = newer
    hub.repos[NAME].refs["main"] = moved
    ok, changed, output = site.deploy()
    assert ok and changed == [], output[-3000:]
    assert f"the default branch of {NAME} moved on the hub to {moved}" in output
    assert f"keeps serving {'3' * 40}" in output
    assert Path(site.data["link"]).resolve().name == "3" * 40
    ok, changed, output = site.deploy(revision=moved, link=serving_link(str(site.store), NAME, moved))
    assert ok and changed == [f"Model {NAME}"]
    assert Path(serving_link(str(site.store), NAME, moved)).resolve().name == moved
    assert Path(site.data["link"]).resolve().name == "3" * 40  # the default branch's link stays


def test_flat_model_path_is_verified_not_taken_on_sight(site, hub, shards):
    flat = site.tmp / "models" / "model"
    flat.mkdir(parents=True)
    (flat / "config.json").write_text("{}")  # what the old check called a present model
    ok, changed, output = site.deploy(root=str(flat), flat=True, link=None)
    assert ok and changed == [f"Model {NAME}"], output[-3000:]
    assert (flat / "config.json").read_bytes() == shards["config.json"].read_bytes()
    ok, changed, _ = site.deploy(root=str(flat), flat=True, link=None)
    assert ok and changed == []


def test_dry_run_lists_the_fetch_then_nothing_once_verified(site, hub):
    ok, changed, output = site.deploy(dry=True)
    assert ok and changed == [f"Model {NAME}"], output[-3000:]  # a change: a restart reason too
    assert f"host @local: model {NAME}: commit {'3' * 40}: 6 of 6 files to fetch" in output
    assert file_gets(hub) == 0 and not Path(site.data["root"]).exists()
    ok, _, _ = site.deploy()
    assert ok
    ok, changed, output = site.deploy(dry=True)
    assert ok and changed == [], output[-3000:]
    assert f"host @local: model {NAME}: commit {'3' * 40}, 6 files" in output


def test_served_needs_each_file_of_the_marker_not_the_marker_alone(site, hub, shards):
    ok, _, output = site.deploy()
    assert ok, output[-3000:]
    link = Path(site.data["link"])
    ok, changed, output = site.deploy(fetch=False, serves=str(link))
    assert ok and changed == [] and f"serves {NAME} at commit {'3' * 40}: 6 files" in output
    shard = sorted(name for name in shards if name.endswith(".safetensors"))[0]
    (link / shard).unlink()  # the marker stays: it alone would call the model verified
    ok, _, output = site.deploy(fetch=False, serves=str(link))
    assert not ok
    assert f"{link}: {shard} of {NAME} at commit {'3' * 40} is missing: the next deploy fetches it again" in output


# --- issue 47 ----------------------------------------------------------------------------------


def test_a_hostile_answer_fails_the_run_saying_what_it_was_not_that_it_resumes(site, hub):
    """The mirror's ETag for a file is a path: the run stops naming it; a retry cures nothing,
    and the deploy does not say it would."""
    hub.repos[NAME].answers = {"config.json": {"ETag": '"x/../../../OUTSIDE"'}}
    ok, _, output = site.deploy()
    assert not ok
    assert f"host @local: model {NAME} at commit {'3' * 40}: the hub {hub.url} answered {NAME} " \
           "with ETag 'x/../../../OUTSIDE' for file 'config.json'" in output, output[-3000:]
    assert "the next run resumes" not in output


def test_a_mirror_without_hashes_is_taken_when_accepted_and_said(site, hub, shards):
    hub.repos[NAME].bare = set(shards)
    ok, _, output = site.deploy(dry=True)
    assert not ok and "6 files that cannot be verified" in output and "model_accept_unhashed: true" in output
    ok, changed, output = site.deploy(accept_unhashed=True)
    assert ok and changed == [f"Model {NAME}"], output[-3000:]
    assert "fetched 6 files" in output and "; 6 files not verified" in output
    ok, changed, output = site.deploy(accept_unhashed=True)
    assert ok and changed == [] and "; 6 files not verified" in output
