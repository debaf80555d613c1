"""Each server flag we render, in the spelling of the sglang release that runs it.

SGLang renames flags and keeps the old spelling as a deprecated alias for a while; the old one
then logs a warning at every start. Read from each release's ``sglang/srt/server_args.py`` and
``sglang/srt/arg_groups/`` (every release from 0.5.9 to 0.5.23):

- ``--disable-cuda-graph``: a plain ``store_true`` up to 0.5.13.post1. From 0.5.14 it is a
  ``DeprecatedStoreTrueAction`` (``new_flag="--cuda-graph-backend-{decode,prefill}=disabled"``)
  that logs ``'--disable-cuda-graph' is deprecated and will be removed in a future release. Use
  '--cuda-graph-backend-{decode,prefill}=disabled' instead.`` (``logger.warning``, while
  parsing); its value sets both phases' backend to ``disabled``, which the per-phase flags
  ``--cuda-graph-backend-decode`` / ``--cuda-graph-backend-prefill``, new in 0.5.14, do directly.
- ``--enable-flashinfer-allreduce-fusion``: a plain flag up to 0.5.13.post1. From 0.5.14 the
  arguments' post-processing (``_handle_deprecated_args``) logs ``--enable-flashinfer-allreduce-
  fusion is deprecated. Please use --flashinfer-allreduce-fusion-backend=auto instead.`` and
  sets that backend to ``auto``; ``--flashinfer-allreduce-fusion-backend`` is new in 0.5.14.
- attention backend ``dsa``: new in 0.5.13, where ``nsa`` became its alias (``"nsa",  #
  Deprecated alias for "dsa"``; no warning, but a later release may drop it). Up to 0.5.12.post1
  only ``nsa`` exists.

- ``--cuda-graph-max-bs``: a plain int flag up to 0.5.13.post1; from 0.5.14 a
  ``DeprecatedAliasStoreAction`` (``new_flag="--cuda-graph-max-bs-decode"``) up to 0.5.18 at
  least, and gone in 0.5.22 (there ``--cuda-graph-max-bs`` is an ambiguous prefix of
  ``--cuda-graph-max-bs-decode`` and ``-prefill``: the parser refuses it).
- ``--schedule-policy``: lpm, random, fcfs, dfs-weight, lof, priority, routing-key in every
  release from 0.5.9; hrrn and shortest-prefill-first in 0.5.22 and 0.5.23 (not in 0.5.18; the
  releases between were not read, so they count as without).

``FLAGS``, ``ATTENTION_BACKENDS`` and ``SCHEDULE_POLICY_SINCE`` are the one home of these facts: each entry lists, oldest
first, the first release of a spelling and the spelling.
"""

from __future__ import annotations

from packaging.version import Version

#: What we render -> ((first release, argv), ...), oldest first.
FLAGS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "disable_cuda_graph": (
        ("0", ("--disable-cuda-graph",)),
        ("0.5.14", ("--cuda-graph-backend-decode", "disabled",
                    "--cuda-graph-backend-prefill", "disabled")),
    ),
    "flashinfer_allreduce_fusion": (
        ("0", ("--enable-flashinfer-allreduce-fusion",)),
        ("0.5.14", ("--flashinfer-allreduce-fusion-backend", "auto")),
    ),
    "cuda_graph_max_bs": (
        ("0", ("--cuda-graph-max-bs",)),
        ("0.5.14", ("--cuda-graph-max-bs-decode",)),
    ),
}
#: A schedule policy newer than 0.5.9 -> the first release known to have it.
SCHEDULE_POLICY_SINCE = {"hrrn": "0.5.22", "shortest-prefill-first": "0.5.22"}
#: An attention backend's names: ((first release, name), ...), oldest first.
ATTENTION_BACKENDS: dict[str, tuple[tuple[str, str], ...]] = {
    "dsa": (("0", "nsa"), ("0.5.13", "dsa")),
}
#: Every name of one backend -> its key in ATTENTION_BACKENDS.
_BACKEND_KEY = {name: key for key, names in ATTENTION_BACKENDS.items() for _, name in names}


def _for_release(entries: tuple[tuple[str, object], ...], release: str | Version):
    version = Version(str(release))
    chosen = entries[0][1]
    for first, spelling in entries:
        if version >= Version(first):
            chosen = spelling
    return chosen


def flag(what: str, release: str | Version) -> list[str]:
    """The argv words of WHAT (a key of ``FLAGS``) as sglang RELEASE spells it."""
    if what not in FLAGS:
        raise KeyError(f"no spelling of {what!r}; known: {', '.join(FLAGS)}")
    return list(_for_release(FLAGS[what], release))


def attention_backend(name: str, release: str | Version) -> str:
    """NAME of an attention backend as sglang RELEASE spells it (``nsa``/``dsa``); others as is."""
    key = _BACKEND_KEY.get(name)
    return name if key is None else _for_release(ATTENTION_BACKENDS[key], release)



def schedule_policy_problem(policy: str | None, release: str | Version) -> str | None:
    """Why sglang RELEASE's parser would refuse schedule policy POLICY, or None."""
    since = SCHEDULE_POLICY_SINCE.get(policy or "")
    if since and Version(str(release)) < Version(since):
        return (f"schedule policy {policy!r} came in sglang {since}; this container runs "
                f"{release}: allowed there: lpm, random, fcfs, dfs-weight, lof, priority, "
                "routing-key")
    return None
