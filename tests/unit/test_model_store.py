"""model_store.preflight: the verdict on a model's plan, read before any change (a plan, ``--dry``,
and a run alike), on a table of the answers ``model_store/model_fetch.py plan`` gives."""

from __future__ import annotations

import pytest

from pve_sglang.model_store.rules import FetchVerdict, preflight

WHERE = "host pve1"
REPO = "org/Model-405B"
COMMIT = "a" * 40
LATER = {"script": "/opt/x/model_fetch.py is uploaded by this run",
         "client": "huggingface_hub for /opt/x/bin/python is installed by this run"}


def plan(**changes) -> dict:
    base = {"repo": REPO, "commit": COMMIT, "revision": "main", "recorded": None,
            "hub_commit": COMMIT, "files": 83, "bytes": 405 * 10**9, "dir": f"/store/{COMMIT}",
            "missing_files": 83, "missing_bytes": 405 * 10**9, "partial_bytes": 0,
            "free_bytes": 190 * 10**9, "complete": False, "settled": False, "gated": False}
    return {**base, **changes}


def error(kind: str) -> dict:
    return {"error": {"kind": kind, "message": f"{REPO}: the hub says {kind}"}}


CASES = [
    # (plan, token_pending, verdict, words in the text)
    (plan(), False, FetchVerdict.REFUSE,
     ["host pve1: model org/Model-405B@aaaaaaaaaaaa (revision 'main') needs 405.0 GB more",
      "83 of 83 files", "the store /tank has 190.0 GB free: free 215.0 GB there"]),
    # A partial file resumes: its bytes are not needed again.
    (plan(missing_bytes=200 * 10**9, partial_bytes=15 * 10**9), False, FetchVerdict.FETCH,
     ["83 of 83 files to fetch, 200.0 GB of 405.0 GB (15.0 GB partly there), 190.0 GB free"]),
    (plan(free_bytes=500 * 10**9), False, FetchVerdict.FETCH,
     ["host pve1: model org/Model-405B at revision 'main': commit " + COMMIT]),
    (plan(complete=True, settled=True, missing_files=0, missing_bytes=0), False, FetchVerdict.READY,
     ["83 files, 405.0 GB, verified in /store/"]),
    # Complete but not yet recorded or linked: the fetch records it (and needs no space).
    (plan(complete=True, settled=False, missing_files=0, missing_bytes=0, free_bytes=0), False,
     FetchVerdict.FETCH, ["0 of 83 files to fetch"]),
    (error("gated"), False, FetchVerdict.REFUSE, ["host pve1: org/Model-405B: the hub says gated"]),
    (error("not-found"), False, FetchVerdict.REFUSE, ["the hub says not-found"]),
    (error("revision-not-found"), False, FetchVerdict.REFUSE, ["the hub says revision-not-found"]),
    (error("network"), False, FetchVerdict.REFUSE, ["the hub says network"]),
    (error("no-weights"), False, FetchVerdict.REFUSE, ["the hub says no-weights"]),
    (error("unverifiable"), False, FetchVerdict.REFUSE, ["the hub says unverifiable"]),
    (error("unconfined"), False, FetchVerdict.REFUSE, ["the hub says unconfined"]),
    # Files taken without a hash (model_accept_unhashed): said, in a fetch and when ready.
    (plan(free_bytes=500 * 10**9, unverified=2), False, FetchVerdict.FETCH,
     ["; 2 files not verified: the hub gave no hash or size of them (model_accept_unhashed; "
      "a size not given is not counted against the free space)"]),
    (plan(complete=True, settled=True, missing_files=0, missing_bytes=0, unverified=1), False,
     FetchVerdict.READY, ["verified in /store/", "; 1 files not verified"]),
    # A token this run writes may grant what the old one did not: checked at run time.
    (error("gated"), True, FetchVerdict.AT_RUN, ["the hub says gated", "checked again at run time"]),
    (error("unauthorized"), True, FetchVerdict.AT_RUN, ["checked again at run time"]),
    (error("not-found"), True, FetchVerdict.AT_RUN, ["checked again at run time"]),
    (error("revision-not-found"), True, FetchVerdict.REFUSE, ["revision-not-found"]),
    ({"unavailable": "script"}, False, FetchVerdict.AT_RUN,
     ["model org/Model-405B at revision 'main': its preflight (size against the free space, "
      "access, revision) runs at run time, before any byte moves: /opt/x/model_fetch.py is "
      "uploaded by this run"]),
    ({"unavailable": "client"}, False, FetchVerdict.AT_RUN, ["huggingface_hub for /opt/x/bin/python"]),
    (None, False, FetchVerdict.AT_RUN, ["the fetcher did not answer"]),
]


@pytest.mark.parametrize(("answer", "token_pending", "verdict", "words"), CASES)
def test_preflight(answer, token_pending, verdict, words):
    result = preflight(answer, WHERE, REPO, "main", "the store /tank", token_pending, LATER)
    assert result.verdict is verdict
    for word in words:
        assert word in result.text
    if not (answer or {}).get("unverified"):
        assert "not verified" not in result.text


# --- the served check, the plan's answer, the progress line (issue 33) ---------------------

from pve_sglang.model_store.facts import FILES_FOLLOW, ModelMarker, ModelPlan  # noqa: E402
from pve_sglang.model_store.rules import progress_text, served_problem  # noqa: E402

MARKER = {"repo": REPO, "commit": COMMIT, "files": 2, "bytes": 30,
          "sizes": {"config.json": 10, "model.safetensors": 20}}


@pytest.mark.parametrize(("marker", "sizes", "words"), [
    (MARKER, {"config.json": 10, "model.safetensors": 20}, None),
    (MARKER, {"config.json": 10, "model.safetensors": 20, "extra": 1}, None),
    (MARKER, {"config.json": 10}, "model.safetensors of org/Model-405B at commit " + COMMIT + " is missing"),
    (MARKER, {"config.json": 10, "model.safetensors": 7}, "model.safetensors of org/Model-405B at commit "
     + COMMIT + " has 7 bytes, the hub's 20"),
    (None, {}, "/m holds no verified org/Model-405B"),
    ({**MARKER, "repo": "org/Other"}, {}, "/m holds no verified org/Model-405B"),
    ({k: v for k, v in MARKER.items() if k != "sizes"}, {}, "its marker predates the list of files"),
])
def test_served_problem(marker, sizes, words):
    problem = served_problem(marker, sizes, REPO, "/m")
    assert (problem is None) if words is None else words in problem


def test_the_served_fact_reads_the_marker_and_each_file_size():
    output = ['{"repo": "org/Model-405B",', ' "commit": "x"}', "", FILES_FOLLOW, "10 config.json",
              "20 sub/model.safetensors"]
    assert ModelMarker().process(output) == {
        "marker": {"repo": REPO, "commit": "x"}, "sizes": {"config.json": 10, "sub/model.safetensors": 20}}
    assert ModelMarker().process(["", FILES_FOLLOW]) == {"marker": None, "sizes": {}}


def test_a_plan_that_fails_is_its_error_not_unavailable():
    # The plan exits 1 with its error; the command then prints "unavailable".
    error = '{"error": {"kind": "disk-full", "message": "the filesystem of /s is full"}}'
    assert ModelPlan().process([error, '{"unavailable": "script"}'])["error"]["kind"] == "disk-full"
    assert ModelPlan().process(["Traceback ...", '{"unavailable": "script"}']) == {"unavailable": "script"}


def test_progress_says_how_many_files_are_verified():
    line = progress_text({"done": 5, "total": 10, "rate": 1, "eta": 5, "files_done": 3, "files": 7,
                          "verified": 2})
    assert line.endswith("3 of 7 files, 2 verified")


# (model_store, model_revision, model_path): a store with and without its last "/", the default
# branch and a revision the link must quote, a container's own model_path
FETCHES = [("/tank/models", None, "/models/model"), ("/tank/", "v1/rc", "/srv/m"),
           (None, None, "/models/model"), (None, "main", "/srv/m")]


@pytest.mark.parametrize("store, revision, model_path", FETCHES)
def test_one_fetch_request_serves_the_host_and_the_container(store, revision, model_path):
    """The host (model store) and the container (own model_path) ask for the fetch through
    one builder; what the store's fetch links is what the container mounts at model_path."""
    from pve_sglang.config.settings import validate_container
    from pve_sglang.model_store.rules import entry, fetch_request
    from pve_sglang.project import load_defaults

    cs = validate_container("pve1", "101", {"model_download": REPO, "model_revision": revision,
                                            "model_store": store, "model_path": model_path},
                            load_defaults())
    request = fetch_request(cs, python="/opt/x/bin/python", script="/opt/x/model_fetch.py",
                            env_file="/etc/x.env")
    assert (request.repo, request.revision, request.env_file) == (REPO, revision, "/etc/x.env")
    assert request.accept_unhashed is cs.model_accept_unhashed is False
    mounted = {m.path: m.host_path for m in cs.all_mounts}
    if store is None:
        assert (request.root, request.flat, request.link) == (model_path, True, None)
        assert model_path not in mounted and request.space_of.endswith(model_path)
    else:
        assert request.root == entry(store, REPO) and not request.flat
        assert request.link == mounted[model_path]  # the container mounts what the fetch links
        assert request.link.startswith(f"{request.root}/serving/")
        assert request.space_of == f"the model store {cs.model_store}"
