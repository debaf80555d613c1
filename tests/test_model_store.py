"""model_store.preflight: the verdict on a model's plan, read before any change (a plan, ``--dry``,
and a run alike), on a table of the answers ``model_store/model_fetch.py plan`` gives."""

from __future__ import annotations

import pytest

from pve_sglang.model_store.rules import Verdict, preflight

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
    (plan(), False, Verdict.REFUSE,
     ["host pve1: model org/Model-405B@aaaaaaaaaaaa (revision 'main') needs 405.0 GB more",
      "83 of 83 files", "the store /tank has 190.0 GB free: free 215.0 GB there"]),
    # A partial file resumes: its bytes are not needed again.
    (plan(missing_bytes=200 * 10**9, partial_bytes=15 * 10**9), False, Verdict.FETCH,
     ["83 of 83 files to fetch, 200.0 GB of 405.0 GB (15.0 GB partly there), 190.0 GB free"]),
    (plan(free_bytes=500 * 10**9), False, Verdict.FETCH,
     ["host pve1: model org/Model-405B at revision 'main': commit " + COMMIT]),
    (plan(complete=True, settled=True, missing_files=0, missing_bytes=0), False, Verdict.READY,
     ["83 files, 405.0 GB, verified in /store/"]),
    # Complete but not yet recorded or linked: the fetch records it (and needs no space).
    (plan(complete=True, settled=False, missing_files=0, missing_bytes=0, free_bytes=0), False,
     Verdict.FETCH, ["0 of 83 files to fetch"]),
    (error("gated"), False, Verdict.REFUSE, ["host pve1: org/Model-405B: the hub says gated"]),
    (error("not-found"), False, Verdict.REFUSE, ["the hub says not-found"]),
    (error("revision-not-found"), False, Verdict.REFUSE, ["the hub says revision-not-found"]),
    (error("network"), False, Verdict.REFUSE, ["the hub says network"]),
    # A token this run writes may grant what the old one did not: checked at run time.
    (error("gated"), True, Verdict.AT_RUN, ["the hub says gated", "checked again at run time"]),
    (error("unauthorized"), True, Verdict.AT_RUN, ["checked again at run time"]),
    (error("not-found"), True, Verdict.AT_RUN, ["checked again at run time"]),
    (error("revision-not-found"), True, Verdict.REFUSE, ["revision-not-found"]),
    ({"unavailable": "script"}, False, Verdict.AT_RUN,
     ["model org/Model-405B at revision 'main': its preflight (size against the free space, "
      "access, revision) runs at run time, before any byte moves: /opt/x/model_fetch.py is "
      "uploaded by this run"]),
    ({"unavailable": "client"}, False, Verdict.AT_RUN, ["huggingface_hub for /opt/x/bin/python"]),
    (None, False, Verdict.AT_RUN, ["the fetcher did not answer"]),
]


@pytest.mark.parametrize(("answer", "token_pending", "verdict", "words"), CASES)
def test_preflight(answer, token_pending, verdict, words):
    result = preflight(answer, WHERE, REPO, "main", "the store /tank", token_pending, LATER)
    assert result.verdict is verdict
    for word in words:
        assert word in result.text
