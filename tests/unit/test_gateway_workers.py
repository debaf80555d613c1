"""The gateway's worker script (``pve_sglang/remote/gateway_workers.py``), fast: its pure parts on
tables, its ``sync`` and ``status`` run as the deploy runs them (the uploaded file, its own
process) against a stand-in of smg 1.13.0's worker API (``tests/standin_smg.py``: the real
smg's answers, codes and background registration, copied from it), its ``check`` against
stand-in SGLang servers (``tests/standin_sglang.py``) that fail as real ones do; and the tests'
client (``tests/gateway_client.py``) on a stream cut short. The same script with the real smg
in LXC: ``tests/lxc/test_gateway_lxc.py``."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pve_sglang.remote import gateway_workers as gw
from standin_smg import StandinSmg

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "pve_sglang" / "remote" / "gateway_workers.py"
GATEWAY_KEY = "sk-gateway-Fq3"
W1, W2, W3 = "http://10.9.0.1:30000", "http://10.9.0.2:30000", "http://10.9.0.3:30000"


# --- pure parts, on tables ----------------------------------------------------------------------


@pytest.mark.parametrize("size, limit, read", [
    (0, 10, True), (9, 10, True), (10, 10, True),  # up to the limit: read whole
    (11, 10, False),  # one byte over: refused, not cut
    (3 * gw.READ_CHUNK + 1, 3 * gw.READ_CHUNK + 1, True),  # several chunks, the last of one byte
    (3 * gw.READ_CHUNK + 1, 3 * gw.READ_CHUNK, False),
])
def test_an_answer_is_read_to_its_limit_and_refused_past_it(size, limit, read):
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    if read:
        assert gw.read_bounded(io.BytesIO(data), limit) == data
    else:
        with pytest.raises(gw.TooLarge):
            gw.read_bounded(io.BytesIO(data), limit)


@pytest.mark.parametrize("text, code, said", [
    # smg 1.13.0's worker API
    ('{"error":"Worker creation already in progress for URL \'http://a:1\' with ID 01a2. Poll '
     'GET /workers/01a2.","code":"WORKER_CREATE_IN_PROGRESS"}', "WORKER_CREATE_IN_PROGRESS",
     "Worker creation already in progress for URL 'http://a:1' with ID 01a2. Poll GET /workers/01a2."),
    # its data plane's (a wrong key)
    ('{"error":{"message":"Invalid API key","type":"invalid_request_error","param":null,'
     '"code":"invalid_api_key"}}', "invalid_api_key", "Invalid API key"),
    ('{"error": "no code"}', None, "no code"),
    # SGLang's (an exception in a request), FastAPI's
    ('{"object": "error", "message": "Internal server error", "type": "InternalServerError", '
     '"code": 500}', None, "Internal server error"),
    ('{"detail": "Not Found"}', None, "Not Found"),
    ('{"other": 1}', None, '{"other": 1}'),
    ("<html>502 Bad\n Gateway</html>", None, "<html>502 Bad Gateway</html>"),
    ('["a list"]', None, '["a list"]'),
    ("", None, ""),
])
def test_smgs_error_answers_are_read(text, code, said):
    assert gw.smg_error(text) == (code, said)


@pytest.mark.parametrize("message, ident", [
    ("POST /workers: HTTP 409 WORKER_CREATE_IN_PROGRESS: Worker creation already in progress for "
     "URL 'http://a:1' with ID 01a24e9f-9217-75cc-a596-2fa511bb440c. Poll GET /workers/01a24e9f-"
     "9217-75cc-a596-2fa511bb440c.", "01a24e9f-9217-75cc-a596-2fa511bb440c"),
    ("Worker creation already in progress for URL 'http://a:1'", None),
    ("with IDs", None),
])
def test_the_pending_registrations_id_is_read_from_smgs_409(message, ident):
    assert gw.in_progress_id(message) == ident


@pytest.mark.parametrize("wanted, listed, ours, changed, expect", [
    # a wanted worker not listed is posted, whoever registered it before
    ([W1, W2], {W1: "i1"}, set(), set(), ([W2], [], [], [])),
    ([W1, W2], {}, {W1}, set(), ([W1, W2], [], [], [])),
    # someone else's, listed: never deleted, never registered again, whatever its key
    ([W1], {W1: "i1", W2: "i2"}, set(), {W1}, ([], [], [], [])),
    # ours, its key changed: registered again; its key the same: nothing
    ([W1], {W1: "i1"}, {W1}, {W1}, ([], [W1], [], [])),
    ([W1], {W1: "i1"}, {W1}, set(), ([], [], [], [])),
    # ... but not without an id to delete it by
    ([W1], {W1: None}, {W1}, {W1}, ([], [], [], [])),
    # ours, no longer wanted: deleted where listed with an id; else asked about (pending?)
    ([W1], {W1: "i1", W2: "i2"}, {W1, W2}, set(), ([], [], [W2], [])),
    ([W1], {W1: "i1", W2: None}, {W1, W2}, set(), ([], [], [], [])),
    ([W1], {W1: "i1"}, {W1, W2}, set(), ([], [], [], [W2])),
    ([], {}, set(), set(), ([], [], [], [])),
])
def test_the_sync_plan(wanted, listed, ours, changed, expect):
    found = gw.plan(wanted, listed, ours, changed)
    assert (list(found.post), list(found.rekey), list(found.delete), list(found.unlisted)) == expect


@pytest.mark.parametrize("status, events, ended, error, why", [
    (200, 8, True, None, None),
    (200, 1, True, None, None),  # one token is an answer
    (200, 0, True, None, "HTTP 200, then its end with no token"),
    (500, 0, False, "Internal server error", "HTTP 500: Internal server error"),
    (401, 0, False, "", "HTTP 401"),
    (None, 0, False, "ConnectionRefusedError: [Errno 111] Connection refused",
     "no answer: ConnectionRefusedError: [Errno 111] Connection refused"),
    (200, 0, False, "timeout", "HTTP 200, then nothing for 5s after its headers (the stream stalled)"),
    (200, 3, False, "timeout", "HTTP 200, then nothing for 5s after 3 events (the stream stalled)"),
    (200, 4, False, None, "HTTP 200, then the stream ended without its last event "
                          "(data: [DONE]) after 4 events"),
    (200, 4, False, "IncompleteRead: x", "HTTP 200, then the stream ended without its last event "
                                         "(data: [DONE]) after 4 events: IncompleteRead: x"),
])
def test_a_workers_answer_judged(status, events, ended, error, why):
    assert gw.stream_verdict(status, events, ended, error, 5) == why


@pytest.mark.parametrize("state, registrations", [
    ('{"registered": ["http://a:1/"], "ids": {"http://a:1/": "i1"}}', {"http://a:1": "i1"}),
    ('{"registered": ["http://a:1", "http://b:2"], "ids": {"http://a:1": 7}}',
     {"http://a:1": None, "http://b:2": None}),
    ('{"registered": ["http://a:1"]}', {"http://a:1": None}),  # before ids were kept
    ('["http://a:1"]', {"http://a:1": None}),  # the oldest form
    ('{"registered": "http://a:1", "ids": []}', {}),
    (None, {}),
])
def test_the_state_is_read_in_each_form(tmp_path, state, registrations):
    path = tmp_path / "state.json"
    if state is not None:
        path.write_text(state)
    assert gw.read_registrations(str(path)) == registrations


def test_the_state_holds_ids_and_no_key(tmp_path):
    path = str(tmp_path / "state.json")
    gw.write_registrations(path, {W2: "i2", W1: None})
    assert json.loads(Path(path).read_text()) == {"registered": [W1, W2], "ids": {W2: "i2"}}
    assert gw.read_registrations(path) == {W1: None, W2: "i2"}
    assert not Path(path + ".tmp").exists()


@pytest.mark.parametrize("worker, keys, key", [
    ({"url": W1, "key_env": "K0"}, {"K0": "k"}, "k"),
    ({"url": W1, "key_env": "K0"}, {"K0": ""}, None),  # an empty value is no key
    ({"url": W1, "key_env": "K1"}, {"K0": "k"}, None),
    ({"url": W1, "key_env": None}, {"K0": "k"}, None),
    ({"url": W1}, {"K0": "k"}, None),
])
def test_a_workers_key_and_body(worker, keys, key):
    assert gw.worker_key(worker, keys) == key
    assert gw.worker_spec(worker, keys) == {"url": W1, **({"api_key": key} if key else {})}


@pytest.mark.parametrize("result, words", [
    ({"not_up": [], "stray": []}, []),
    ({"not_up": [{"name": "@lxc/b", "url": W2, "pending": True}]},
     ["worker @lxc/b (http://10.9.0.2:30000) is not up: the gateway holds its registration"]),
    ({"not_up": [{"name": "@lxc/b", "url": W2, "pending": False}]},
     ["worker @lxc/b (http://10.9.0.2:30000) is not up: the gateway does not list it"]),
    ({"stray": [W3]}, ["http://10.9.0.3:30000 is no longer a worker of this gateway, but the "
                       "gateway still holds the registration"]),
])
def test_a_syncs_problems_in_words(result, words):
    lines = gw.sync_problems(result)
    assert len(lines) == len(words)
    assert all(line.startswith(word) for line, word in zip(lines, words)), lines


# --- sync and status against the stand-in of smg's worker API -----------------------------------


class Site:
    """The worker script uploaded as the deploy uploads it, its files, and the stand-in smg."""

    def __init__(self, folder: Path, smg: StandinSmg):
        self.folder, self.smg = folder, smg
        for name in ("gateway_workers.py", "remote_env.py"):
            shutil.copy(SCRIPT.parent / name, folder / name)
        self.env = folder / "smg.env"
        self.env.write_text(f'SGLANG_API_KEY="{GATEWAY_KEY}"\n')
        self.keys = folder / "smg-workers.env"
        self.state = folder / "smg-registered.json"

    def write_keys(self, **keys: str) -> None:
        """A new keys file renamed into place, as the deploy writes it."""
        new = self.folder / "keys.new"
        new.write_text("".join(f'{name}="{value}"\n' for name, value in keys.items()))
        os.chmod(new, 0o600)
        new.rename(self.keys)

    def run(self, command: str, workers: list, timeout: float = 30, *extra: str):
        """``gateway_workers.py COMMAND`` with WORKERS (URLs, or (name, url, key_env)):
        (exit code, its JSON line, its stderr)."""
        listed = [w if isinstance(w, tuple) else (f"@lxc/{w.split('//')[1]}", w, None)
                  for w in workers]
        path = self.folder / "smg-workers.json"
        path.write_text(json.dumps({"workers": [{"name": n, "url": u, "key_env": k}
                                                for n, u, k in listed]}))
        done = subprocess.run(
            [sys.executable, str(self.folder / "gateway_workers.py"), command, "--gateway",
             self.smg.url, "--workers", str(path), "--env-file", str(self.env), "--keys-file",
             str(self.keys), "--state", str(self.state), "--timeout", str(timeout), *extra],
            capture_output=True, text=True, timeout=300, cwd=self.folder)
        lines = done.stdout.strip().splitlines()
        return done.returncode, json.loads(lines[-1]) if lines else None, done.stderr

    def registered(self) -> dict:
        return gw.read_registrations(str(self.state))


@pytest.fixture
def site(tmp_path):
    smg = StandinSmg(key=GATEWAY_KEY).start()
    yield Site(tmp_path, smg)
    smg.stop()


def wait_for(condition, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_sync_standin_smg_registers_each_worker_with_its_key_and_reads_the_count_back(site):
    site.smg.up |= {W1, W2}
    site.write_keys(SMG_WORKER_KEY_1="sk-worker-b")
    code, result, _ = site.run("sync", [W1, ("@lxc/b", W2, "SMG_WORKER_KEY_1")])
    assert code == 0, result
    assert result["added"] == [W1, W2] and result["not_up"] == [] and result["listed"] == 2
    assert site.smg.listed_urls() == [W1, W2]
    assert site.smg.key_of(W1) is None and site.smg.key_of(W2) == "sk-worker-b"
    ids = {w["url"]: w["id"] for w in site.smg.listing()["workers"]}
    assert site.registered() == ids
    assert "sk-worker-b" not in site.state.read_text()
    # Nothing to do: no request but the reads.
    site.smg.requests.clear()
    code, result, _ = site.run("sync", [W1, ("@lxc/b", W2, "SMG_WORKER_KEY_1")])
    assert code == 0 and result["added"] == [] and result["listed"] == 2
    assert {method for method, _ in site.smg.requests} == {"GET"}


def test_sync_standin_smg_a_worker_down_is_not_up_and_the_next_sync_no_409(site):
    """A worker whose server does not answer: reported not up (exit 4), the count read back
    from the gateway; the next sync finds smg's registration pending (409 in progress) and says
    the same, no error; once its server answers, it is listed."""
    site.smg.up.add(W1)
    code, result, stderr = site.run("sync", [W1, W2], 0.5)
    assert code == gw.EXIT_NOT_UP, (result, stderr)
    assert result["listed"] == 1 == len(site.smg.listed_urls())
    assert result["added"] == [W1]
    assert result["not_up"] == [{"name": "@lxc/10.9.0.2:30000", "url": W2, "pending": True}]
    assert "worker @lxc/10.9.0.2:30000 (http://10.9.0.2:30000) is not up" in stderr
    assert site.smg.pending_urls() == [W2]
    assert set(site.registered()) == {W1, W2}
    code, result, stderr = site.run("sync", [W1, W2], 0.5)
    assert code == gw.EXIT_NOT_UP and "error" not in result, (result, stderr)
    assert result["not_up"] == [{"name": "@lxc/10.9.0.2:30000", "url": W2, "pending": True}]
    assert ("POST", "/workers") in site.smg.requests  # answered 409 in progress
    site.smg.up.add(W2)
    code, result, _ = site.run("sync", [W1, W2])
    assert code == 0 and result["not_up"] == [] and result["listed"] == 2, result
    # The unit's start: a worker still loading is said, and fails nothing.
    code, result, stderr = site.run("sync", [W1, W2, W3], 0.5, "--not-up-ok")
    assert code == 0 and result["not_up"][0]["url"] == W3 and "is not up" in stderr


def test_sync_standin_smg_a_worker_dropped_while_pending_is_reported_then_removed(site):
    """smg cannot withdraw a pending registration (a DELETE does not stop it): the sync keeps
    it as its own, reports it until it is listed, then removes it."""
    site.smg.up.add(W1)
    assert site.run("sync", [W1, W3], 0.5)[0] == gw.EXIT_NOT_UP
    code, result, stderr = site.run("sync", [W1], 0.5)
    assert code == gw.EXIT_NOT_UP and result["stray"] == [W3], (result, stderr)
    assert ("http://10.9.0.3:30000 is no longer a worker of this gateway, but the gateway still "
            "holds the registration") in stderr
    assert W3 in site.registered()
    code, status, _ = site.run("status", [W1])
    assert code == 0 and status["pending"] == [W3] and W3 in status["registered"]
    site.smg.up.add(W3)  # its server comes up: smg adds it, and it would serve
    wait_for(lambda: W3 in site.smg.listed_urls(), "smg never added the worker")
    code, result, _ = site.run("sync", [W1])
    assert code == 0 and result["removed"] == [W3] and result["listed"] == 1, result
    assert site.smg.listed_urls() == [W1] and set(site.registered()) == {W1}
    # A registration smg gave up on is forgotten, no longer reported.
    site.smg.up.discard(W3)
    site.smg.startup_timeout = 0.2
    assert site.run("sync", [W1, W3], 0.5)[0] == gw.EXIT_NOT_UP
    wait_for(lambda: not site.smg.pending_urls(), "smg kept the registration")
    code, result, _ = site.run("sync", [W1])
    assert code == 0 and result["stray"] == [] and set(site.registered()) == {W1}, result


def test_sync_standin_smg_a_worker_someone_else_added_stays_when_dropped(site):
    """Named by the inventory, then dropped: a worker someone else registered is never the
    sync's, so never deleted (nor registered again when its key changes)."""
    other = site.smg.add_other(W2, "sk-theirs")
    site.smg.up.add(W1)
    site.write_keys(SMG_WORKER_KEY_1="sk-ours")
    code, result, _ = site.run("sync", [W1, ("@lxc/b", W2, "SMG_WORKER_KEY_1")])
    assert code == 0 and result["added"] == [W1] and result["listed"] == 2, result
    assert set(site.registered()) == {W1}
    site.write_keys(SMG_WORKER_KEY_1="sk-rotated")
    code, result, _ = site.run("sync", [W1, ("@lxc/b", W2, "SMG_WORKER_KEY_1")])
    assert code == 0 and result["rekeyed"] == [], result
    assert site.smg.key_of(W2) == "sk-theirs"
    code, result, _ = site.run("sync", [W1])
    assert code == 0 and result["removed"] == [], result
    assert site.smg.listed_urls() == [W1, W2]
    assert ("DELETE", f"/workers/{other}") not in site.smg.requests


def test_sync_standin_smg_a_key_rotated_registers_the_syncs_own_worker_again(site):
    site.smg.up |= {W1, W2}
    site.write_keys(SMG_WORKER_KEY_0="sk-first", SMG_WORKER_KEY_1="sk-second")
    workers = [("@lxc/a", W1, "SMG_WORKER_KEY_0"), ("@lxc/b", W2, "SMG_WORKER_KEY_1")]
    assert site.run("sync", workers)[0] == 0
    before = site.registered()
    site.write_keys(SMG_WORKER_KEY_0="sk-rotated", SMG_WORKER_KEY_1="sk-second")
    code, result, _ = site.run("sync", workers)
    assert code == 0 and result["rekeyed"] == [W1] and result["listed"] == 2, result
    assert site.smg.key_of(W1) == "sk-rotated" and site.smg.key_of(W2) == "sk-second"
    after = site.registered()
    assert after[W2] == before[W2] and after[W1] != before[W1]  # the new registration's id


def test_sync_standin_smg_a_listing_of_6_mb_is_read(site):
    site.smg.filler = 7000  # a fleet: someone else's workers
    site.smg.up.add(W1)
    assert len(site.smg.listing_bytes()) > 6 * 1024 * 1024
    code, result, stderr = site.run("sync", [W1])
    assert code == 0 and result["listed"] == 7001, (result, stderr)
    with pytest.raises(gw.GatewayError, match=r"GET /workers: the answer is over 4 MiB, the most"):
        gw.call(site.smg.url, "GET", "/workers", GATEWAY_KEY, limit=4 * 1024 * 1024)


def test_sync_standin_smg_refusals_show_smgs_answer_and_no_key(site):
    site.env.write_text('SGLANG_API_KEY="sk-wrong"\n')
    code, result, _ = site.run("sync", [W1], 0.5)
    assert code == gw.EXIT_GATEWAY
    assert "GET /workers: HTTP 401 invalid_api_key: Invalid API key" in result["error"]
    assert "sk-wrong" not in json.dumps(result)
    # A gateway that quotes the body it refused: the worker's key is masked.
    site.env.write_text(f'SGLANG_API_KEY="{GATEWAY_KEY}"\n')
    site.smg.echo_bad_body = True
    site.write_keys(SMG_WORKER_KEY_0="sk-worker-secret")
    code, result, stderr = site.run("sync", [("@lxc/a", W1, "SMG_WORKER_KEY_0")])
    assert code == gw.EXIT_GATEWAY
    assert "POST /workers: HTTP 400 BAD_REQUEST: Invalid JSON data:" in result["error"]
    assert "<secret>" in result["error"] and "sk-worker-secret" not in result["error"] + stderr


# --- out and in: a roll's two ends ------------------------------------------------------------


def listing(*workers: tuple[str, object]) -> list[dict]:
    return [{"url": url, "is_healthy": healthy} for url, healthy in workers]


@pytest.mark.parametrize("workers, problem", [
    # One other, healthy: it may go (the smallest roll).
    (listing((W1, True), (W2, True)), None),
    (listing((W1, True), (W2, True), (W3, True)), None),
    # Itself out already (a killed roll): the others decide.
    (listing((W2, True)), None),
    # The last one: never.
    (listing((W1, True)), "no other worker is listed: it is the last one serving"),
    (listing(), "no other worker is listed: it is the last one serving"),
    # Itself unhealthy decides nothing; another unhealthy (or unknown) does.
    (listing((W1, False), (W2, True)), None),
    (listing((W1, True), (W2, False)),
     "1 other worker not healthy in the gateway's view: http://10.9.0.2:30000"),
    (listing((W1, True), (W2, None), (W3, False)),
     "2 other workers not healthy in the gateway's view: http://10.9.0.2:30000, "
     "http://10.9.0.3:30000"),
    (listing((W1 + "/", True)), "no other worker is listed: it is the last one serving"),
])
def test_a_worker_goes_out_only_while_the_others_serve(workers, problem):
    assert gw.capacity_problem(W1, workers) == problem


@pytest.mark.parametrize("text, running", [
    ("sglang:num_running_reqs{tp_rank=\"0\"} 3.0\n", 3),
    ("sglang:num_running_reqs{tp_rank=\"0\"} 2.0\nsglang:num_running_reqs{tp_rank=\"1\"} 1.0\n", 3),
    ("sglang:num_running_reqs 0.0\n", 0),
    # Its help line, and a longer name that starts alike, are not its samples.
    ("# HELP sglang:num_running_reqs The number\nsglang:num_running_reqs_total 9\n", None),
    ("", None),
])
def test_a_servers_requests_in_flight_are_read_from_its_metrics(text, running):
    assert gw.running_requests(text) == running


def test_out_standin_smg_waits_for_the_others_then_drains_and_in_gives_it_back(site, standins):
    """A roll's ends as the deploy runs them: the worker stays in while another is unhealthy
    (exit 5, nothing deleted), goes out once it is healthy, after its request in flight ended;
    ``in`` registers it again and returns once it is listed healthy."""
    slow, other = standins["metrics"], standins["normal"]
    site.smg.up |= {slow, other}
    workers = [("@lxc/slow", slow, None), ("@lxc/other", other, None)]
    assert site.run("sync", workers)[0] == 0
    site.smg.sick.add(other)
    code, result, _ = site.run("out", workers, 0.5, "--worker", "@lxc/slow")
    assert code == gw.EXIT_CAPACITY, result
    assert "1 other worker not healthy in the gateway's view" in result["error"]
    assert sorted(site.smg.listed_urls()) == sorted([slow, other])
    # A request in flight on it: the drain waits for its end.
    client = subprocess.Popen([sys.executable, str(REPO / "tests" / "gateway_client.py"),
                               "requests", "--url", slow, "--count", "1", "--tokens", "60"],
                              stdout=subprocess.PIPE, text=True)
    wait_for(lambda: gw.in_flight(slow) == 1, "the request did not start")
    site.smg.sick.clear()
    code, result, _ = site.run("out", workers, 10, "--worker", "@lxc/slow", "--drain", "60")
    assert code == 0, result
    assert result["was_listed"] and result["in_flight"] == 0 and result["cut"] == 0
    assert client.poll() is not None  # done before the drain said so
    assert json.loads(client.communicate()[0])["codes"] == {"200": 1}
    assert site.smg.listed_urls() == [other]
    code, result, _ = site.run("in", workers, 10, "--worker", "@lxc/slow")
    assert code == 0, result
    assert sorted(site.smg.listed_urls()) == sorted([slow, other])
    assert site.registered()[slow] == next(w["id"] for w in site.smg.listing()["workers"]
                                           if w["url"] == slow)
    # Out again, with a drain bound shorter than the request: it is cut, and counted.
    client = subprocess.Popen([sys.executable, str(REPO / "tests" / "gateway_client.py"),
                               "requests", "--url", slow, "--count", "1", "--tokens", "200"],
                              stdout=subprocess.PIPE, text=True)
    wait_for(lambda: gw.in_flight(slow) == 1, "the request did not start")
    code, result, _ = site.run("out", workers, 10, "--worker", "@lxc/slow", "--drain", "0.2")
    assert code == 0 and result["cut"] == 1, result
    client.wait(timeout=120)
    # The last one serving never goes out.
    code, result, _ = site.run("out", workers, 0.3, "--worker", "@lxc/other")
    assert code == gw.EXIT_CAPACITY and "the last one serving" in result["error"]
    code, result, _ = site.run("out", workers, 0.3, "--worker", "@lxc/nobody")
    assert code == gw.EXIT_USAGE and "no worker named '@lxc/nobody'" in result["error"]


# --- check: each worker's answer, straight from the gateway's container -------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """Stand-in SGLang servers, one per case (a server that dies mid-stream once for each test
    that kills it): {name: URL}; a closed port as ``down``."""
    folder = tmp_path_factory.mktemp("standins")
    cases = {"normal": "normal", "fail-generation": "fail-generation",
             "headers-then-silence": "headers-then-silence", "die-mid-stream": "die-mid-stream",
             "die-mid-stream-client": "die-mid-stream", "die-mid-whole-client": "die-mid-stream"}
    found, processes = {}, []
    for name, case in cases.items():
        port = free_port()
        env = {**os.environ, "SGLANG_API_KEY": "sk-worker-Z" if case == "normal" else ""}
        processes.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "standin_sglang.py"), "--logs",
             str(REPO / "tests" / "fixtures" / "sglang_logs"), "--port", str(port), "--case", case,
             "--event-file", str(folder / f"{name}.event"), "--pause-scale", "0.001"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        found[name] = f"http://127.0.0.1:{port}"
    # A server with SGLang's /metrics and tokens slow enough for a request to be in flight.
    port = free_port()
    processes.append(subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "standin_sglang.py"), "--logs",
         str(REPO / "tests" / "fixtures" / "sglang_logs"), "--port", str(port), "--event-file",
         str(folder / "metrics.event"), "--pause-scale", "0.001", "--enable-metrics",
         "--token-delay", "0.02"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "SGLANG_API_KEY": ""}))
    found["metrics"] = f"http://127.0.0.1:{port}"
    found["down"] = f"http://127.0.0.1:{free_port()}"

    def ready(url: str) -> bool:
        try:
            return urllib.request.urlopen(url + "/health", timeout=2).status == 200
        except OSError:
            return False

    for case in [*cases, "metrics"]:
        wait_for(lambda case=case: ready(found[case]), f"the {case} stand-in did not start")
    yield found
    for process in processes:
        process.kill()
        process.wait()


def test_check_names_each_worker_that_fails_a_generation(site, standins):
    """/health answers 200 on every one of them: only the generation tells."""
    site.write_keys(SMG_WORKER_KEY_0="sk-worker-Z")
    workers = [("@lxc/good", standins["normal"], "SMG_WORKER_KEY_0"),
               *((f"@lxc/{case}", standins[case], None) for case in (
                   "fail-generation", "headers-then-silence", "die-mid-stream", "down"))]
    code, result, _ = site.run("check", workers, 3)
    assert code == 0, result
    found = {w["name"]: w for w in result["workers"]}
    assert list(found) == ["@lxc/good", "@lxc/fail-generation", "@lxc/headers-then-silence",
                           "@lxc/die-mid-stream", "@lxc/down"]
    assert found["@lxc/good"]["ok"] and found["@lxc/good"]["events"] == gw.CHECK_TOKENS
    assert found["@lxc/fail-generation"]["why"] == "HTTP 500: Internal server error"
    assert found["@lxc/headers-then-silence"]["why"] == (
        "HTTP 200, then nothing for 3s after its headers (the stream stalled)")
    assert found["@lxc/die-mid-stream"]["why"].startswith(
        "HTTP 200, then the stream ended without its last event (data: [DONE]) after 4 events")
    assert found["@lxc/down"]["why"].startswith("no answer: ConnectionRefusedError")
    assert not any(w["ok"] for name, w in found.items() if name != "@lxc/good")
    # The key is the worker's: without it, the server refuses.
    code, result, _ = site.run("check", [("@lxc/good", standins["normal"], None)], 3)
    assert result["workers"][0]["why"].startswith("HTTP 401")


def test_a_stream_cut_short_is_a_failed_request_for_the_tests_client(standins):
    """A worker that dies mid-stream ends its answer without ``data: [DONE]`` (smg passes it on
    so, with status 200): a failed request, whatever its status."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "gateway_client.py"), "requests",
                           "--url", standins["die-mid-stream-client"], "--count", "1",
                           "--tokens", "8"],
                          capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout)["codes"] == {"cut": 1}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "gateway_client.py"), "requests",
                           "--url", standins["normal"], "--count", "2", "--tokens", "8"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "API_KEY": "sk-worker-Z"})
    assert json.loads(done.stdout)["codes"] == {"200": 2}


def test_the_client_counts_an_answer_asked_whole_that_never_came_as_failed(standins):
    """Every other request asks its answer whole (not streamed): counted per kind; one whose
    worker died before its answer was whole failed."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "gateway_client.py"), "requests",
                           "--url", standins["normal"], "--count", "4", "--tokens", "8",
                           "--whole-every", "2"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "API_KEY": "sk-worker-Z"})
    assert json.loads(done.stdout)["by_kind"] == {"stream": {"200": 2}, "whole": {"200": 2}}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "gateway_client.py"), "requests",
                           "--url", standins["die-mid-whole-client"], "--count", "1",
                           "--tokens", "8", "--whole-every", "1"],
                          capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout)["by_kind"] == {"whole": {"error": 1}}
