"""Tuning hints from what the server reported during a benchmark level (its ``/metrics``, read by
``remote/server_metrics.py``) beside the GPU figures: which limit held the level back.

Each rule reads one row of a run (``bench.metric_columns`` and ``bench.gpu_columns`` values) and
the run's meta (``bench_history.run_meta``); all are pure. The signals are those of SGLang's own
tuning guide (the decode log line's ``#running-req``, ``token usage`` and ``#queue-req``, the same
figures as the gauges) and of the seed's tuned run (a flat 64 running requests at the
``--max-running-requests`` cap, GPUs at about 250 of 600 W with requests waiting):

- ``capped``: running requests flat below the concurrency asked, requests queued, the KV cache
  not full: a cap holds the batch (``max_running_requests``, or SGLang's own default cap);
- ``kv_bound``: token usage near 1 with requests queued: the KV cache is full
  (``mem_fraction_static``, more GPUs);
- ``idle_with_queue``: GPUs under their power limit while requests wait: the GPUs wait on the
  host (CUDA graphs) or a slow kernel (the MoE backend and its autotune).
"""

from __future__ import annotations

from typing import Any

#: Running requests "flat": their mean at least this share of their max over the level.
FLAT_SHARE = 0.9
#: "Below the concurrency": the most running requests under this share of the level.
BELOW_SHARE = 0.9
#: Token usage "near 1" (SGLang's guide: above 0.9 is good use of the KV cache).
FULL_USAGE = 0.9
#: "Requests queued": at least this many waiting on average over the level.
QUEUED = 1.0


def _number(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def queued(row: dict[str, Any]) -> bool:
    """Requests waited in the server's queue during the level."""
    queue = _number(row, "queue_reqs_mean")
    return queue is not None and queue >= QUEUED


def kv_bound(row: dict[str, Any]) -> bool:
    """Token usage reached ``FULL_USAGE`` while requests waited."""
    usage = _number(row, "token_usage_max")
    return usage is not None and usage >= FULL_USAGE and queued(row)


def capped(row: dict[str, Any]) -> bool:
    """Running requests sat flat below the concurrency asked, with requests waiting and the KV
    cache not full: a cap on the batch, not the memory, held them."""
    level, most, mean = (_number(row, "concurrency"), _number(row, "running_reqs_max"),
                         _number(row, "running_reqs_mean"))
    if level is None or most is None or mean is None or most <= 0:
        return False
    return (most < BELOW_SHARE * level and mean >= FLAT_SHARE * most and queued(row)
            and not kv_bound(row))


def idle_with_queue(row: dict[str, Any], low_power_pct: float) -> bool:
    """The GPUs drew under LOW_POWER_PCT of their power limit while requests waited."""
    power = _number(row, "gpu_power_pct")
    return power is not None and power < low_power_pct and queued(row)


def _shown(row: dict[str, Any], key: str, spec: str) -> str:
    value = _number(row, key)
    return "?" if value is None else format(value, spec)


def row_hints(row: dict[str, Any], meta: dict[str, Any], low_power_pct: float) -> list[str]:
    """The hints one level earns, each naming its figures and the setting to look at."""
    level = row.get("concurrency")
    running = (f"{_shown(row, 'running_reqs_mean', '.0f')} running (at most "
               f"{_shown(row, 'running_reqs_max', '.0f')})")
    waiting = f"{_shown(row, 'queue_reqs_mean', '.0f')} queued"
    usage = _shown(row, "token_usage_max", ".2f")
    hints = []
    if capped(row):
        cap = meta.get("max_running_requests")
        hints.append(
            f"concurrency {level}: {running} with {waiting}, KV cache use "
            f"{usage}: a cap holds the batch (max_running_requests: "
            f"{cap if cap is not None else 'none set, so SGLang sizes its own'}); a cap of 64 "
            "held the tuned run to a quarter: raise it or remove it (null)")
    if kv_bound(row):
        hints.append(
            f"concurrency {level}: KV cache use reached {usage} with "
            f"{waiting} ({running}): the KV cache is full; give it more memory "
            f"(mem_fraction_static: {meta.get('mem_fraction_static')}) or more GPUs "
            f"(tp_size: {meta.get('tp_size') or 'one rank per GPU'})")
    if idle_with_queue(row, low_power_pct):
        hints.append(
            f"concurrency {level}: GPUs at {_shown(row, 'gpu_power_pct', '.0f')}% of their power "
            f"limit with {waiting}: the GPUs wait; check CUDA graphs (disable_cuda_graph: "
            f"{meta.get('disable_cuda_graph')}) and the MoE backend (moe_runner_backend: "
            f"{meta.get('moe_runner_backend')}, its autotune)")
    return hints


def run_hints(run: dict[str, Any], low_power_pct: float | None) -> list[str]:
    """The hints of every level of RUN (``bench_history`` run file), lowest level first; the
    power rule only with LOW_POWER_PCT."""
    meta = run.get("meta", {})
    pct = low_power_pct if low_power_pct is not None else -1.0
    rows = sorted((r for r in run.get("rows", []) if isinstance(r, dict)),
                  key=lambda r: r.get("concurrency") or 0)
    return [hint for row in rows for hint in row_hints(row, meta, pct)]
