"""The stand-in server's /metrics against SGLang's real collector sources (the releases' wheels).

The stand-in queues requests past its cap or past its KV cache as SGLang's scheduler does, and
serves the load it holds under SGLang's own metric names and types. Starting it and a load
against it: tests/standin_process.py; the sampler's tests against it are the fast tier's
(tests/unit/test_server_metrics_sampler.py).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import pytest

from pve_sglang.remote import server_metrics

TESTS = Path(__file__).resolve().parents[1]

#: Where each tested release declares its scheduler metrics.
COLLECTOR = {"0.5.9": "sglang/srt/metrics/collector.py",
             "0.5.23": "sglang/srt/observability/metrics_collector.py"}


# --- the stand-in against SGLang's sources -------------------------------------------------


def declared(source_text: str) -> dict[str, str]:
    """``sglang:NAME`` -> its prometheus type as declared in a collector's source
    (``Gauge(name="sglang:...")``; a counter's samples carry ``_total`` in its name already)."""
    found = {}
    for kind, name in re.findall(r"(Gauge|Counter|Histogram|Summary)\(\s*name=\"(sglang:[a-z_]+)\"",
                                 source_text):
        found[name] = kind.lower()
    return found


@pytest.mark.parametrize("release", sorted(COLLECTOR))
def test_standin_metric_names_and_types_taken_from_sglang_sources(release, sglang_wheel):
    """Every metric the stand-in serves, and every one the sampler reads, is declared by the
    release's real collector with that type (0.5.9 and 0.5.23 wheels)."""
    sys.path.insert(0, str(TESTS))
    try:
        import standin_sglang
    finally:
        sys.path.remove(str(TESTS))
    with zipfile.ZipFile(sglang_wheel(release)) as archive:
        real = declared(archive.read(COLLECTOR[release]).decode())
    served = {name: kind for name, (kind, _) in standin_sglang.METRICS.items()}
    if release == "0.5.9":  # constants came later (0.5.23's emit_constants)
        served.pop("sglang:max_total_num_tokens")
    assert {name: real.get(name) for name in served} == served
    assert {name: real.get(name) for name in server_metrics.FIGURES} == dict.fromkeys(
        server_metrics.FIGURES, server_metrics.TYPE)
