"""model_store/model_fetch.py with the real huggingface_hub client (the version the container's
locked venv has) against tests/standin_hub.py, on this machine: a clean download, one killed
mid-shard and resumed, a corrupted and a short file fetched again, a moved branch reported and
not followed, a gated model without a token, a missing repository and revision, a second run
that fetches nothing. Each case reads the hub's request log: what was fetched, from which byte.
On a full disk and in a read-only mount namespace alone (root): tests/root/test_model_fetch.py.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pve_sglang.remote import stage
from pve_sglang.model_store.model_fetch import MARKER, partial_bytes
from pve_sglang.model_store.rules import preflight
from conftest import hub_client_versions
from standin_hub import StandinHub, serving, synthetic_files

NAME = "standin-org/Standin-7B"
TOKEN = "hf_standin_token_Zq9"
SHARD = 4 * 1024 * 1024
BIG_SHARD = 24 * 1024 * 1024
#: The huggingface_hub release of each lock (one resumes a cut file, one starts it again).
CLIENTS = list(dict.fromkeys(hub_client_versions()))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, Path]:
    return synthetic_files(tmp_path_factory.mktemp("hubfiles"), 4, SHARD)


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> str:
    """The fetcher beside its companions, as the deploy uploads it."""
    return str(stage("model_fetch.py", tmp_path_factory.mktemp("tools")))


@pytest.fixture
def hub(shards):
    with serving(NAME, "1" * 40, shards, {TOKEN}) as hub:
        yield hub


class Runner:
    def __init__(self, python: str, script: str, hub: StandinHub, root: Path,
                 env_file: Path | None = None, without: str = ""):
        self.python, self.script, self.hub, self.root, self.env_file = python, script, hub, root, env_file
        #: Python run before the fetcher's main, taking one of its defences away (to show
        #: that the other holds alone): ``model_fetch`` and ``confine`` are imported.
        self.without = without

    def env(self) -> dict:
        return {**os.environ, "HF_ENDPOINT": self.hub.url, "HF_HOME": str(self.root.parent / "hf-home")}

    def argv(self, command: str, *extra: str) -> list[str]:
        start = [self.python, self.script]
        if self.without:
            start = [self.python, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                     f"import confine, model_fetch; {self.without}; "
                     "sys.exit(model_fetch.main(sys.argv[1:]))", str(Path(self.script).parent)]
        argv = [*start, command, "--repo", NAME, "--root", str(self.root), *extra]
        return argv + (["--env-file", str(self.env_file)] if self.env_file else [])

    def call(self, command: str, *extra: str, **kwargs) -> tuple[int, list[dict], str]:
        """(exit status, the JSON lines, stderr) of COMMAND."""
        done = subprocess.run(self.argv(command, *extra), env=self.env(), capture_output=True,
                              text=True, timeout=120, **kwargs)
        assert TOKEN not in done.stdout + done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return done.returncode, lines, done.stderr

    def run(self, command: str, *extra: str) -> list[dict]:
        return self.call(command, *extra)[1]

    def plan(self, *extra: str) -> dict:
        return self.run("plan", *extra)[-1]

    def fetch(self, commit: str, *extra: str) -> dict:
        return self.run("fetch", "--commit", commit, "--interval", "0.2", *extra)[-1]


@pytest.fixture
def runner(hf_python, script, hub, tmp_path) -> Runner:
    return Runner(hf_python, script, hub, tmp_path / "store" / "standin-org--Standin-7B")


def client_resumes(python: str, script: str) -> bool:
    """model_fetch.client_resumes() under PYTHON (its huggingface_hub)."""
    done = subprocess.run([python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                           "import model_fetch; print(model_fetch.client_resumes())",
                           str(Path(script).parent)], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def gets(hub: StandinHub) -> list[tuple[str, int]]:
    return [(path.rsplit("/", 1)[1], start) for method, path, start in hub.requests
            if method == "GET" and "/resolve/" in path]


def test_clean_download_is_verified_and_marked_last(runner, hub, shards):
    plan = runner.plan()
    assert (plan["files"], plan["missing_files"], plan["complete"]) == (7, 7, False)
    assert plan["bytes"] == plan["missing_bytes"] == sum(p.stat().st_size for p in shards.values())
    lines = runner.run("fetch", "--commit", plan["commit"], "--interval", "0.05")
    assert lines[-1]["done"]["fetched_files"] == 7
    folder = Path(plan["dir"])
    assert folder == runner.root / plan["commit"]
    for name, path in shards.items():
        assert (folder / name).read_bytes() == path.read_bytes()
    marker = json.loads((folder / MARKER).read_text())
    assert (marker["commit"], marker["files"]) == (plan["commit"], 7)
    again = runner.plan()
    assert again["complete"] and again["missing_files"] == 0
    assert sorted(name for name, _ in gets(hub)) == sorted(shards)  # each file fetched once


def test_second_fetch_fetches_nothing(runner, hub):
    commit = runner.plan()["commit"]
    runner.fetch(commit)
    before = len(gets(hub))
    assert runner.plan()["complete"]
    result = runner.fetch(commit)
    assert result["done"]["fetched_files"] == 0
    assert len(gets(hub)) == before


@pytest.fixture(scope="module")
def big_shards(tmp_path_factory) -> dict[str, Path]:
    """Shards above huggingface_hub's write size (10 MB, ``DOWNLOAD_CHUNK_SIZE``): a partial
    one reaches the disk before it is whole."""
    return synthetic_files(tmp_path_factory.mktemp("bighubfiles"), 3, BIG_SHARD, seed="big")


@pytest.mark.parametrize("version", CLIENTS)
def test_killed_mid_shard_resumes_without_fetching_a_complete_file_again(hf_clients, version, script, hub,
                                                                          big_shards, tmp_path):
    runner = Runner(hf_clients[version], script, hub, tmp_path / "store" / "standin-org--Standin-7B")
    shards = big_shards
    hub.repos[NAME].commits[hub.repos[NAME].refs["main"]] = shards
    commit = runner.plan()["commit"]
    hub.rate = BIG_SHARD // 2  # a shard in two seconds, per connection
    process = subprocess.Popen(runner.argv("fetch", "--commit", commit, "--workers", "1",
                                           "--interval", "0.1"),
                               env=runner.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = runner.root / commit
    deadline = time.monotonic() + 60
    # Killed once at least one shard is whole and another is partly there.
    while time.monotonic() < deadline:
        whole = [n for n in shards if n.endswith(".safetensors") and (folder / n).exists()]
        if whole and partial_bytes(str(folder)) > BIG_SHARD // 4:
            break
        time.sleep(0.02)
    else:
        pytest.fail("no whole shard and a partial one within 60s")
    process.send_signal(signal.SIGKILL)
    process.wait()
    whole = {n for n in shards if (folder / n).exists()}
    assert whole and partial_bytes(str(folder)) > 0
    plan = runner.plan()
    assert not plan["complete"] and plan["partial_bytes"] > 0
    assert (folder / "config.json").exists()  # what the old check took for a present model
    hub.rate = None
    fetched_before = len(gets(hub))
    result = runner.fetch(commit)
    assert "done" in result
    after = gets(hub)[fetched_before:]
    assert not {name for name, _ in after} & whole  # a complete file is not fetched again
    if client_resumes(runner.python, runner.script):
        assert any(start > 0 for _, start in after)  # the interrupted shard resumed from its bytes
        # what was there is not counted again (nor in the space the fetch asks for)
        assert result["done"]["fetched_bytes"] == plan["missing_bytes"] - plan["partial_bytes"]
    else:
        # huggingface_hub 1.33 starts a cut file again: the killed run's part is not left behind.
        assert all(start == 0 for _, start in after) and partial_bytes(str(folder)) == 0
        assert result["done"]["fetched_bytes"] == plan["missing_bytes"]
    for name, path in shards.items():
        assert (folder / name).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_changed_or_short_file_is_fetched_again(runner, hub, shards, damage):
    commit = runner.plan()["commit"]
    runner.fetch(commit)
    shard = runner.root / commit / "model-00002-of-00004.safetensors"
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[SHARD // 2] ^= 0xFF
    else:
        data = data[: SHARD // 3]
    shard.write_bytes(bytes(data))
    plan = runner.plan()
    assert (plan["complete"], plan["missing_files"]) == (False, 1)
    lines = runner.run("fetch", "--commit", commit, "--interval", "0.05")
    assert lines[-1]["done"]["fetched_files"] == 1
    assert shard.read_bytes() == shards[shard.name].read_bytes()
    counts = {name: n for name in shards if (n := hub.model_files_gets(name))}
    assert counts[shard.name] == 2 and all(n == 1 for name, n in counts.items() if name != shard.name)
    assert runner.plan()["complete"]


def test_moved_branch_is_reported_and_the_recorded_commit_kept(runner, hub, shards, tmp_path):
    first = runner.plan()["commit"]
    runner.fetch(first)
    moved = "2" * 40
    newer = dict(shards, **{"config.json": tmp_path / "config.json"})
    newer["config.json"].write_text('{"architectures": ["StandinForCausalLM"], "v": 2}')
    hub.repos[NAME].commits[moved] = newer
    hub.repos[NAME].refs["main"] = moved
    plan = runner.plan()
    assert (plan["commit"], plan["recorded"], plan["hub_commit"]) == (first, first, moved)
    assert plan["complete"]
    chosen = runner.plan("--revision", moved)
    assert (chosen["commit"], chosen["complete"]) == (moved, False)


def test_gated_model_needs_a_token_from_the_env_file(runner, hub, tmp_path):
    hub.repos[NAME].gated = True
    assert runner.plan()["error"]["kind"] == "gated"
    env = tmp_path / "sglang.env"
    env.write_text(f'HF_TOKEN="{TOKEN}"\n')
    env.chmod(0o600)
    runner.env_file = env
    plan = runner.plan()
    assert "error" not in plan
    assert "done" in runner.fetch(plan["commit"])


def test_missing_repository_and_revision_are_named(runner):
    assert runner.plan("--revision", "no-such-branch")["error"]["kind"] == "revision-not-found"
    runner_other = Runner(runner.python, runner.script, runner.hub, runner.root)
    argv = runner_other.argv("plan")
    argv[argv.index("--repo") + 1] = "standin-org/Nothing-Here"
    out = subprocess.run(argv, env=runner.env(), capture_output=True, text=True).stdout
    error = json.loads(out.splitlines()[-1])["error"]
    assert error["kind"] == "not-found" and "standin-org/Nothing-Here" in error["message"]


def test_flat_layout_keeps_its_state_out_of_the_way(hf_python, script, hub, tmp_path, shards):
    flat = Runner(hf_python, script, hub, tmp_path / "models" / "model")
    plan = flat.plan("--flat")
    assert plan["dir"] == str(flat.root)
    assert "done" in flat.fetch(plan["commit"], "--flat")
    assert flat.plan("--flat")["complete"]
    assert (flat.root / ".cache" / "pve-sglang" / "revisions.json").exists()
    assert {p.name for p in flat.root.iterdir()} == {*shards, ".cache", MARKER}


# --- what the hub answers is not trusted (issue 33) ----------------------------------------


def test_a_file_name_leaving_the_model_folder_is_refused_and_nothing_outside_touched(runner, hub, shards, tmp_path):
    commit = runner.plan()["commit"]
    runner.fetch(commit)
    victim = runner.root.parent.parent / "victim.txt"  # ROOT/<commit>/../../victim.txt
    victim.write_text("not the model's")
    hostile = dict(shards, **{"../../victim.txt": shards["config.json"]})
    hub.repos[NAME].commits[commit] = hostile
    plan = runner.plan()
    assert plan["error"]["kind"] == "untrusted", plan
    assert "file name '../../victim.txt' has an empty, '.' or '..' part" in plan["error"]["message"]
    assert hub.url in plan["error"]["message"]
    assert runner.fetch(commit)["error"]["kind"] == "untrusted"
    assert victim.read_text() == "not the model's"


def test_a_commit_that_is_no_commit_is_refused_from_the_hub_and_the_command_line(runner, hub):
    hub.repos[NAME].claimed = "../../victim"
    plan = runner.plan()
    assert plan["error"]["kind"] == "untrusted" and "commit '../../victim'" in plan["error"]["message"]
    hub.repos[NAME].claimed = None
    done = subprocess.run(runner.argv("fetch", "--commit", "../../victim"), env=runner.env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "argument --commit: '../../victim' is not a commit: 40 lowercase hex digits" in done.stderr
    assert not (runner.root.parent.parent / "victim.log").exists()
    assert not list(runner.root.parent.parent.glob("victim*"))


def test_an_invalid_repository_id_is_named_invalid(runner):
    argv = runner.argv("plan")
    argv[argv.index("--repo") + 1] = "standin-org/bad name"
    done = subprocess.run(argv, env=runner.env(), capture_output=True, text=True, timeout=60)
    error = json.loads(done.stdout.splitlines()[-1])["error"]
    assert error["kind"] == "invalid" and "repository id 'standin-org/bad name' is invalid" in error["message"]
    assert done.returncode == 1  # a plan with an error fails


def test_flat_commit_that_only_deletes_a_file_is_complete(hf_python, script, hub, tmp_path, shards):
    flat = Runner(hf_python, script, hub, tmp_path / "models" / "model")
    first = flat.plan("--flat")["commit"]
    assert "done" in flat.fetch(first, "--flat")
    fewer = "6" * 40
    hub.repos[NAME].commits[fewer] = {n: p for n, p in shards.items() if n != "generation_config.json"}
    plan = flat.plan("--flat", "--revision", fewer)
    assert (plan["missing_files"], plan["complete"]) == (0, False)  # the marker is the old commit's
    assert "done" in flat.fetch(fewer, "--flat", "--revision", fewer)
    assert json.loads((flat.root / MARKER).read_text())["commit"] == fewer
    assert flat.plan("--flat", "--revision", fewer)["complete"]


def start_slow_fetch(runner: Runner, commit: str, *extra: str) -> subprocess.Popen:
    """A fetch of COMMIT, one file at a time, stopped by the caller once a shard is whole."""
    runner.hub.rate = BIG_SHARD // 2
    process = subprocess.Popen(runner.argv("fetch", "--commit", commit, "--workers", "1",
                                           "--interval", "0.1", *extra),
                               env=runner.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    folder, deadline = runner.root / commit, time.monotonic() + 60
    while time.monotonic() < deadline:
        names = os.listdir(folder) if folder.is_dir() else []
        if any(n.endswith(".safetensors") for n in names) and partial_bytes(str(folder)) > 0:
            return process
        time.sleep(0.02)
    process.kill()
    pytest.fail("no whole shard and a partial one within 60s")


def killed_first_fetch(runner: Runner, hub: StandinHub, shards: dict[str, Path]) -> tuple[str, str]:
    """(the commit main resolved to, whose first fetch was killed half way; another commit of
    the same files the hub also has)."""
    hub.repos[NAME].commits[hub.repos[NAME].refs["main"]] = shards
    first = runner.plan()["commit"]
    process = start_slow_fetch(runner, first)
    process.kill()
    process.wait()
    hub.rate = None
    other = "2" * 40
    hub.repos[NAME].commits[other] = dict(shards)
    return first, other


def test_a_branch_moved_during_the_first_fetch_stays_pinned(runner, hub, big_shards):
    first, moved = killed_first_fetch(runner, hub, big_shards)
    hub.repos[NAME].refs["main"] = moved
    plan = runner.plan()
    assert (plan["commit"], plan["recorded"], plan["hub_commit"]) == (first, first, moved)
    assert "done" in runner.fetch(first)


def test_a_changed_pin_removes_what_it_left_half_fetched(runner, hub, big_shards):
    first, other = killed_first_fetch(runner, hub, big_shards)
    assert (runner.root / first).is_dir()
    # The pin of main moves to another commit (as a fetch given it pins it): the old one's
    # half-fetched folder is the deploy's own, and nothing serves it.
    assert "done" in runner.fetch(other)
    assert not (runner.root / first).exists() and not (runner.root / f"{first}.log").exists()
    assert runner.plan()["commit"] == other


#: tgkill(2), by architecture: a signal to one thread of another process (os has none).
TGKILL = {"x86_64": 234, "aarch64": 131}


def signal_threads(pid: int, sig: int) -> int:
    """SIG to each thread of process PID but its main one (what the kernel may pick for a
    Ctrl-C); returns how many."""
    libc = ctypes.CDLL(None, use_errno=True)
    threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
    for tid in threads:
        libc.syscall(TGKILL[os.uname().machine], pid, tid, sig)
    return len(threads)


@pytest.mark.parametrize("to", ["the process", "its other threads"])
def test_ctrl_c_on_a_foreground_fetch_ends_in_one_line(runner, hub, big_shards, to):
    """A Ctrl-C ends the fetch whatever its download threads do, and whichever thread the
    kernel gives it to (to the threads: Python runs the handler in the main thread, which then
    waited for the downloads, 30 s and more on a loaded machine)."""
    hub.repos[NAME].commits[hub.repos[NAME].refs["main"]] = big_shards
    commit = runner.plan()["commit"]
    process = start_slow_fetch(runner, commit)
    # The rest nearly stalls: no download can end before the Ctrl-C is answered, however
    # loaded the machine (a fetch that waits for them is still running at the timeout below).
    hub.rate = 1024
    try:
        if to == "the process":
            process.send_signal(signal.SIGINT)
        else:
            assert signal_threads(process.pid, signal.SIGINT) >= 2  # the download and the meter
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
        hub.rate = None
    assert process.returncode == 130, err
    assert "Traceback" not in err
    last = json.loads(out.splitlines()[-1])
    assert last["error"]["kind"] == "interrupted" and "the next run resumes" in last["error"]["message"]
    log = (runner.root / f"{commit}.log").read_text().splitlines()
    assert json.loads(log[-1]) == last


def test_each_file_is_verified_as_it_completes(runner, hub, big_shards):
    hub.repos[NAME].commits[hub.repos[NAME].refs["main"]] = big_shards
    commit = runner.plan()["commit"]
    process = start_slow_fetch(runner, commit)
    process.communicate(timeout=60)
    lines = [json.loads(line) for line in (runner.root / f"{commit}.log").read_text().splitlines()]
    progress = [line["p"] for line in lines if "p" in line]
    assert any(0 < p["verified"] < p["files"] for p in progress)  # before the downloads ended
    assert progress[-1]["verified"] == progress[-1]["files"] == 6
    assert "done" in lines[-1]


# --- issue 47: what a mirror answers per file, an empty or unhashed model, errors no run cures

#: From huggingface_hub's ``.cache/huggingface/download/<hash>.x`` six levels up: the store's
#: folder, beside the model's own (ROOT/..).
ESCAPE = "x/../../../../../../OUTSIDE"


def client_folder(name: str) -> str:
    """The first part of the ``.incomplete`` file's name huggingface_hub downloads NAME into
    (``_local_folder._short_hash`` of its ``.metadata`` file's name, in every release here)."""
    return base64.urlsafe_b64encode(hashlib.sha1(f"{name}.metadata".encode()).digest()).decode()


def hostile_mirror(hub: StandinHub, shards: dict[str, Path], attack: str) -> str:
    """The stand-in hub made a hostile mirror of ATTACK, by config.json's answer: ``etag``, the
    ESCAPE, with a harmless sibling whose name makes the client create the folder the ESCAPE
    climbs out of (the kernel follows '..' only out of a folder that exists); ``commit``,
    another commit; ``size``, another size. Returns the commit."""
    commit = hub.repos[NAME].refs["main"]
    files = dict(shards)
    if attack == "etag":
        files[f"{client_folder('config.json')}.x/pad.json"] = shards["tokenizer_config.json"]
        answer = {"ETag": f'"{ESCAPE}"'}
    elif attack == "commit":
        answer = {"X-Repo-Commit": "2" * 40}
    else:
        answer = {"Content-Length": "1"}
    hub.repos[NAME].commits[commit] = files
    hub.repos[NAME].answers = {"config.json": answer}
    return commit


def tree(folder: Path, but: Path) -> dict[str, tuple[int, int]]:
    """Each path under FOLDER but under BUT, with its size and mtime."""
    found = {}
    for path in folder.rglob("*"):
        if path != but and but not in path.parents:
            found[str(path)] = (path.lstat().st_size, path.lstat().st_mtime_ns)
    return found


def fetched_from_a_hostile_mirror(runner: Runner, hub: StandinHub, shards: dict[str, Path],
                                  attack: str, tmp_path: Path) -> tuple:
    """One fetch with RUNNER from a mirror whose answer for config.json is hostile (ATTACK,
    ``hostile_mirror``), a victim file beside the model folder: (exit status, the last line's
    error, stderr, the victim, the tree outside the model folder before, the commit)."""
    commit = hostile_mirror(hub, shards, attack)
    victim = tmp_path / "store" / "OUTSIDE.incomplete"
    runner.root.mkdir(parents=True)
    victim.write_text("not the model's\n")
    before = tree(tmp_path, runner.root)
    status, lines, err = runner.call("fetch", "--commit", commit, "--workers", "1")
    return status, lines[-1]["error"], err, victim, before, commit


@pytest.mark.parametrize("version", CLIENTS)
@pytest.mark.parametrize("attack", ["etag", "commit", "size"])
def test_a_file_answer_unlike_its_listing_is_refused_before_the_client_writes(
        hf_clients, version, attack, script, hub, shards, tmp_path):
    """huggingface_hub builds its ``.incomplete`` path of the ETag: 0.36.2 appended to a file
    outside the model folder, moved it in and deleted it; 1.33 created one there."""
    runner = Runner(hf_clients[version], script, hub, tmp_path / "store" / "standin-org--Standin-7B")
    status, error, err, victim, before, commit = fetched_from_a_hostile_mirror(
        runner, hub, shards, attack, tmp_path)
    expected = {"etag": f"ETag {ESCAPE!r} for file 'config.json'",
                "commit": f"commit {'2' * 40!r} for file 'config.json'",
                "size": "size 1 for file 'config.json'"}[attack]
    assert status == 1 and error["kind"] == "untrusted" and expected in error["message"], (error, err)
    assert not (runner.root / commit / "config.json").exists()
    assert victim.read_text() == "not the model's\n"
    assert tree(tmp_path, runner.root) == before


@pytest.mark.parametrize("version", CLIENTS)
def test_the_confinement_alone_keeps_a_hostile_etag_inside_the_store(hf_clients, version, script, hub, shards, tmp_path):
    """With the check of the answers taken away, the client follows the ETag out: the write is
    refused (Landlock, as root too), the victim and everything outside the store untouched."""
    runner = Runner(hf_clients[version], script, hub, tmp_path / "store" / "standin-org--Standin-7B",
                    without="model_fetch.Answers.install = lambda self, hub: None")
    status, error, err, victim, before, _ = fetched_from_a_hostile_mirror(
        runner, hub, shards, "etag", tmp_path)
    assert status == 1 and error["kind"] == "denied", (error, err)
    assert "OUTSIDE" in error["message"] and f"writes only under {runner.root}" in error["message"]
    assert victim.read_text() == "not the model's\n"
    assert tree(tmp_path, runner.root) == before


@pytest.mark.parametrize("listing", ["no files", "no weights"])
def test_a_model_without_weights_is_refused_and_never_marked(runner, hub, shards, listing):
    commit = hub.repos[NAME].refs["main"]
    hub.repos[NAME].commits[commit] = ({} if listing == "no files" else
                                       {n: p for n, p in shards.items() if n.endswith(".json")})
    status, lines, _err = runner.call("plan")
    assert status == 1 and lines[-1]["error"]["kind"] == "no-weights"
    assert f"answered {NAME} at commit {commit} with" in lines[-1]["error"]["message"]
    assert ("no files" if listing == "no files" else "3 files and no weights") in lines[-1]["error"]["message"]
    status, lines, _err = runner.call("fetch", "--commit", commit)
    assert status == 1 and lines[-1]["error"]["kind"] == "no-weights"
    assert not (runner.root / commit / MARKER).exists() and not gets(hub)


def test_files_without_a_hash_or_size_are_refused_unless_accepted_and_then_said(runner, hub, shards):
    bare = {"config.json", "model-00001-of-00004.safetensors"}
    hub.repos[NAME].bare = bare
    status, lines, _err = runner.call("plan")
    error = lines[-1]["error"]
    assert status == 1 and error["kind"] == "unverifiable", error
    assert "2 files that cannot be verified, e.g. 'config.json': no size and no sha256 or git blob id" in error["message"]
    assert "model_accept_unhashed: true" in error["message"]
    commit = hub.repos[NAME].refs["main"]
    status, lines, _err = runner.call("fetch", "--commit", commit)
    assert status == 1 and lines[-1]["error"]["kind"] == "unverifiable" and not gets(hub)
    plan = runner.plan("--accept-unhashed")
    assert plan["unverified"] == 2
    assert plan["missing_bytes"] == sum(p.stat().st_size for n, p in shards.items() if n not in bare)
    assert "not verified" in preflight(plan, "host h", NAME, None, "the store").text
    done = runner.fetch(commit, "--accept-unhashed")["done"]
    assert (done["fetched_files"], done["unverified"]) == (7, 2)
    for name, path in shards.items():
        assert (runner.root / commit / name).read_bytes() == path.read_bytes()
    again = runner.plan("--accept-unhashed")
    assert again["complete"] and again["unverified"] == 2


def test_a_name_longer_than_the_filesystem_takes_is_named_not_a_network_error(hf_python, script, hub, shards, tmp_path):
    """The store's path and the hub's name are more than Linux's 4096 bytes together: no
    retry cures it, and the error says what to change."""
    deep = tmp_path.joinpath(*["d" * 240] * 16)
    runner = Runner(hf_python, script, hub, deep / "standin-org--Standin-7B")
    commit = hub.repos[NAME].refs["main"]
    hub.repos[NAME].commits[commit] = dict(shards, **{"t" * 200 + "/" + "v" * 200 + ".json": shards["config.json"]})
    status, lines, err = runner.call("fetch", "--commit", commit, cwd=tmp_path)
    error = lines[-1]["error"]
    assert status == 1 and error["kind"] == "name-too-long", (error, err)
    assert "set model_store (or model_path) to a shorter folder" in error["message"]


def test_a_file_in_the_way_of_a_folder_is_named_not_a_network_error(runner, hub, shards, tmp_path):
    commit = hub.repos[NAME].refs["main"]
    hub.repos[NAME].commits[commit] = dict(shards, **{"tokenizer/vocab.json": shards["config.json"]})
    (runner.root / commit).mkdir(parents=True)
    (runner.root / commit / "tokenizer").write_text("put here by hand")
    status, lines, err = runner.call("fetch", "--commit", commit)
    error = lines[-1]["error"]
    assert status == 1 and error["kind"] == "in-the-way", (error, err)
    assert f"{str(runner.root / commit / 'tokenizer')!r} is in the way" in error["message"]
    assert (runner.root / commit / "tokenizer").read_text() == "put here by hand"


def test_a_name_the_client_refuses_is_refused_before_any_byte(runner, hub, shards):
    """huggingface_hub 1.33 refuses a name with a backslash ('Invalid filename'), which was
    called a network error the next run would cure."""
    commit = hub.repos[NAME].refs["main"]
    hub.repos[NAME].commits[commit] = dict(shards, **{"tok\\vocab.json": shards["config.json"]})
    for command in (("plan",), ("fetch", "--commit", commit)):
        status, lines, _err = runner.call(*command)
        error = lines[-1]["error"]
        assert status == 1 and error["kind"] == "untrusted", error
        assert "file name 'tok\\\\vocab.json' holds a backslash" in error["message"]
    assert not gets(hub)


def test_plan_with_a_relative_root_that_does_not_exist_answers(hf_python, script, hub, tmp_path):
    """It looped for ever, looking for an existing folder above ''."""
    runner = Runner(hf_python, script, hub, Path("rel") / "missing")
    status, lines, err = runner.call("plan", cwd=tmp_path)
    plan = lines[-1]
    assert status == 0 and not plan["complete"], (plan, err)
    assert plan["dir"] == str(tmp_path / "rel" / "missing" / plan["commit"]) and plan["free_bytes"] > 0
    assert not (tmp_path / "rel").exists()  # a plan makes nothing
