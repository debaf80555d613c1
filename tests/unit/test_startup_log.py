"""The startup log parser and the hint table on real SGLang log lines (tests/fixtures/sglang_logs,
each file naming its public source). The phases' log calls found in each release's sources:
tests/network/test_startup_log_sources.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pve_sglang.server.startup_log import (
    HINTS,
    KV_CACHE,
    PHASES,
    SHARDS,
    READY_LINE,
    Progress,
    bad_logprobs,
    degenerate,
    diagnose,
    duration,
    strip,
)

LOGS = Path(__file__).parents[1] / "fixtures" / "sglang_logs"


def log_lines(name: str) -> list[str]:
    """The log lines of a fixture, without its source comments."""
    return [line for line in (LOGS / name).read_text().splitlines() if not line.startswith("#")]


@pytest.mark.parametrize("hint", HINTS, ids=lambda h: h.name)
def test_every_hint_row_names_its_cause_on_real_lines(hint):
    lines = log_lines(f"hint_{hint.name}.log")
    found = diagnose(lines)
    assert [h.name for h, _ in found] == [hint.name], found
    # Every report's own message line is recognised, not only one of them.
    messages = [line for line in lines if not line.startswith(" ")]
    for line in messages:
        assert hint.pattern.search(strip(line)), line


def alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of a regular expression: ``a|b(?:c|d)`` -> ``a``, ``b(?:c|d)``."""
    parts, current, depth, in_class, escaped = [], "", 0, False, False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    return [*parts, current]


def test_alternatives_split_only_at_the_top_level():
    assert alternatives(r"a|b(?:c|d)|[|]x|e\|f") == ["a", "b(?:c|d)", "[|]x", r"e\|f"]


#: Alternatives that real logs only show on lines another alternative of the row matches too.
SHARED_LINES = {
    "Failed to initialize cutlass TMA WS grouped gemm":
        "FlashInfer's autotuner prints it inside its 'Skipping tactic' warning (flashinfer "
        "issue 2077); no public log shows it alone",
}


def _matches(alternative: str, line: str) -> bool:
    return re.search(alternative, line, re.IGNORECASE) is not None


@pytest.mark.parametrize("hint", HINTS, ids=lambda h: h.name)
def test_every_alternative_of_a_hint_row_matches_a_real_line_of_its_own(hint):
    """Each alternative of a row's pattern matches a message line of the row's fixture, and one
    that no other alternative of the row matches: as every message line must match its row
    (above), deleting any alternative fails on a real line."""
    parts = alternatives(hint.pattern.pattern)
    assert "|".join(parts) == hint.pattern.pattern and len(parts) > 0
    lines = [strip(line) for line in log_lines(f"hint_{hint.name}.log") if not line.startswith(" ")]
    without_a_line = [part for part in parts if not any(_matches(part, line) for line in lines)]
    assert not without_a_line, f"no fixture line for {without_a_line}"
    own = {part: [line for line in lines if _matches(part, line)
                  and not any(_matches(other, line) for other in parts if other != part)]
           for part in parts}
    redundant = [part for part in parts if not own[part] and part not in SHARED_LINES]
    assert not redundant, f"every line of {redundant} is matched by another alternative too"
    # An exemption lasts only while it is true.
    assert not [part for part in parts if own[part] and part in SHARED_LINES]


def test_shared_line_exemptions_name_real_alternatives():
    every = {part for hint in HINTS for part in alternatives(hint.pattern.pattern)}
    assert set(SHARED_LINES) <= every


def test_every_hint_row_has_a_fixture_and_no_fixture_is_orphaned():
    names = {path.stem.removeprefix("hint_") for path in LOGS.glob("hint_*.log")}
    assert names == {hint.name for hint in HINTS}


def test_diagnose_names_the_first_line_of_each_hint_in_order():
    """The first line a cause shows is where it started (a later one is its echo): each hint
    comes once, with its first line, in the table's order."""
    first, later = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                    "RuntimeError: CUDA out of memory (retry)")
    found = diagnose(["[2025-10-16 09:06:22 TP0] " + first, "Errno 98 address already in use",
                      later])
    assert [(hint.name, line) for hint, line in found] == [
        ("cuda-oom", first), ("address-in-use", "Errno 98 address already in use")]


def test_a_normal_start_and_a_load_crash_match_no_hint():
    assert diagnose(log_lines("startup_tp8.log")) == []
    assert diagnose(log_lines("crash_load.log")) == []


def test_phases_of_a_real_8_rank_start_in_order_with_progress():
    progress = Progress(start=1000.0)
    messages = []
    for index, line in enumerate(log_lines("startup_tp8.log")):
        messages += progress.feed(line, 1000.0 + index)
    phases = [m.split(" (at ")[0] for m in messages if " (at " in m and not m.startswith("autotune finished")]
    assert phases == ["init", "weights", "kv cache", "autotune", "cuda graph", "warmup"], messages
    shards = [m for m in messages if m.startswith("weights: ")]
    assert shards[0] == "weights: 0/145 shards (0%), ?it/s"
    assert shards[1] == "weights: 81/145 shards (56%), 2.70it/s, ETA 23s"
    assert shards[-1] == "weights: 145/145 shards (100%), 2.84it/s"
    # One KV cache line for 8 ranks: K + V per GPU.
    assert [m for m in messages if m.startswith("KV cache")] == [
        "KV cache: 2,795,207 tokens, 106.62 GB per GPU"]
    assert any(m.startswith("autotune finished") for m in messages)
    assert progress.ready and messages[-1].startswith("ready after ")
    summary = progress.summary(1000.0 + len(log_lines("startup_tp8.log")))
    assert summary.startswith("starting ") or summary.startswith("init ")
    for phase in ("init", "weights", "kv cache", "cuda graph", "warmup"):
        assert f"{phase} " in summary, summary


def phases_of(name: str) -> tuple[list[str], Progress, list[str]]:
    progress = Progress(start=1000.0)
    messages = []
    for index, line in enumerate(log_lines(name)):
        messages += progress.feed(line, 1000.0 + index)
    phases = [m.split(" (at ")[0] for m in messages if " (at " in m and not m.startswith("autotune finished")]
    return phases, progress, messages


def test_phases_of_a_0_5_23_start_built_from_its_sources():
    phases, progress, messages = phases_of("startup_tp8_0.5.23_from_source.log")
    assert phases == ["init", "weights", "kv cache", "autotune", "cuda graph", "warmup"], messages
    assert [m for m in messages if m.startswith("weights: ")] == [
        "weights: 0/145 shards (0%), ?it/s", "weights: 73/145 shards (50%), 2.81it/s, ETA 25s",
        "weights: 145/145 shards (100%), 2.79it/s"]
    assert [m for m in messages if m.startswith("KV cache")] == [
        "KV cache: 2,795,207 tokens, 34.62 GB per GPU"]
    assert any(m.startswith("autotune finished") for m in messages)
    assert progress.ready and messages[-1].startswith("ready after ")
    assert diagnose(log_lines("startup_tp8_0.5.23_from_source.log")) == []


def test_rank_prefixes_of_newer_releases_are_stripped():
    assert strip("[2026-12-04 06:00:01.123 DP0 ATTN_CP1 MOE_DP0 TP3 EP3] Init parallel begin.") == \
        "Init parallel begin."


#: Per phase: a log call of some release (as its source spells it) and a line it logs. Every
#: tested release must have one call of each phase, and every call's line must start its phase.
SOURCE_LINES = [
    ("init", 'logger.info("Init torch distributed begin.")', "Init torch distributed begin."),
    ("init", 'logger.info("Init parallel begin.")', "Init parallel begin."),
    ("weights", 'f"Load weight begin. avail mem=', "Load weight begin. avail mem=137.34 GB"),
    ("kv cache", '"Memory pool end. ', "Memory pool end. avail mem=11.87 GB"),
    ("autotune", 'logger.info("Running FlashInfer autotune...")', "Running FlashInfer autotune..."),
    ("autotune", 'logger.info("Running FlashInfer autotune with cache: %s"',
     "Running FlashInfer autotune with cache: /var/cache/sglang/flashinfer_autotune/tp8.json"),
    ("cuda graph", 'f"Capture {graph_backend[self.device]} begin. This can take up to several',
     "Capture cuda graph begin. This can take up to several minutes. avail mem=11.82 GB"),
    ("cuda graph", 'f"Capture {capture_name} {graph_backend[model_runner.device]} begin. "',
     "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=11.49 GB"),
    ("cuda graph", 'f"Capture {capture_name} CUDA graph begin. "',
     "Capture target prefill CUDA graph begin. backend=tc_piecewise, num_tokens=[4, 8], avail mem=11.80 GB"),
    ("warmup", 'f"max_total_num_tokens={self.max_total_num_tokens}, "',
     "max_total_num_tokens=2795207, chunked_prefill_size=8192, max_prefill_tokens=16384"),
    ("ready", f'logger.info("{READY_LINE}")', READY_LINE),
]


def _phase_entered(line: str) -> str | None:
    return next((name for name, pattern in PHASES if pattern.search(line)), None)


@pytest.mark.parametrize("phase, call, line", SOURCE_LINES, ids=lambda v: v if len(v) < 20 else None)
def test_each_source_line_starts_its_phase(phase, call, line):
    assert _phase_entered(line) == phase


@pytest.mark.parametrize("bar", ["Loading safetensors checkpoint shards", "Multi-thread loading shards",
                                 "Loading pt checkpoint shards",
                                 "Multi-thread loading pt checkpoint shards",
                                 "Loading np_cache checkpoint shards"])
def test_every_weights_bar_of_the_loader_is_read(bar):
    found = SHARDS.search(f"{bar}:  50% Completed | 73/145 [00:26<00:25,  2.81it/s]")
    assert found and (found["n"], found["total"]) == ("73", "145")


def test_a_bar_updated_by_carriage_returns_counts_its_last_state():
    # As 0.5.17 logged it on an H100 (the journal keeps a tqdm bar's \r updates on one line).
    line = ("Multi-thread loading shards:   0% Completed | 0/2 [00:00<?, ?it/s]\r"
            "Multi-thread loading shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]\r"
            "Multi-thread loading shards: 100% Completed | 2/2 [00:02<00:00,  1.00it/s]")
    progress = Progress(start=0.0)
    assert "weights: 2/2 shards (100%), 1.00it/s" in progress.feed(line, 2.0)


def test_progress_lines_as_the_sources_spell_them():
    assert SHARDS.search("Loading safetensors checkpoint shards:  50% Completed | 73/145 "
                         "[00:26<00:25,  2.81it/s]")
    assert KV_CACHE.search("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 2795207, "
                           "K size: 17.31 GB, V size: 17.31 GB")
    assert KV_CACHE.search("KV Cache is allocated. #tokens: 2795207, K size: 53.31 GB, V size: 53.31 GB")


def test_silence_is_measured_from_the_last_line():
    progress = Progress(start=100.0)
    assert progress.silent_for(130.0) == 30.0
    progress.feed("[2025-10-16 09:06:22 TP0] Running FlashInfer autotune...", 110.0)
    assert progress.phase == "autotune" and progress.silent_for(130.0) == 20.0


def test_ready_line_is_the_release_line():
    assert READY_LINE in log_lines("startup_tp8.log")[-1]


@pytest.mark.parametrize("text, bad", [
    # flashinfer issue 4841 (SM120): generations "collapse into a run of `!` (token id 0)".
    ("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", True),
    ("Red, blue!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", True),
    ("the the the the the the the the the the", True),
    ("Red, blue and yellow are the three primary colours.", False),
    ("1, 2, 3, 4, 5, 6, 7, 8, 9, 10", False),
    ("OK", False),  # too short to judge
    # One token repeated without spaces (issue 21): any script, any unit of up to 16 characters.
    ("的的的的的的", True),
    ("的的的的的的的的的的的的的的的的的的的的的的的的", True),
    ("abcabcabcabc", True),
    ("Red, blue and 蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝蓝", True),
    ("<|im_end|><|im_end|><|im_end|><|im_end|><|im_end|>", True),
    ("ha ha ha ha ha ha ha ha", True),
    ("Red, green, blue. Red, green, blue. Red, green, blue. Red, green, blue.", True),
    # Legitimate answers: three repeats, a repeat that is not most of the text, no spaces.
    ("abcabcabc", False),
    ("hahaha", False),
    ("blablabla", False),
    ("红色、蓝色和黄色是三原色。", False),
    ("赤、青、黄の三色です。", False),
    ("Red, blue, yellow.", False),
    ("The answer is 1000000000.", False),
    ("Mississippi has four s and four i.", False),
    ("Hahaha, red, blue and yellow are the primary colours of paint.", False),
    ("3.14159265358979323846", False),
    ("Red, blue and yellow!!!", False),
])
def test_degenerate_output(text, bad):
    assert (degenerate(text) is not None) == bad


# Each threshold of the generation check just below, at and just above its edge (characters
# counted spaces aside).
@pytest.mark.parametrize("text, bad", [
    # JUDGED_CHARS (6): five characters are not judged, six are
    ("的的的的的", False),
    ("的的的的的的", True),
    # COUNTED_CHARS (8): two letters only, never four in a row: judged from eight on
    ("aabbaab", False),
    ("aabbaabb", True),
    # FEW_DISTINCT (2): three distinct characters are not "few"
    ("aabbccaa", False),
    # MOST (0.6), one character: 5 of 9, 6 of 10 (not more than 0.6), 7 of 11
    ("!a!b!c!d!", False),
    ("!a!b!c!d!!", False),
    ("!a!b!c!d!!!", True),
    # ... but a letter or digit for most of the text is a word or a number
    ("x1x2xx3xx4x", False),
    # COUNTED_WORDS (6): one word 4 of 5 times is not judged, 4 of 6 is
    ("yes no yes yes yes", False),
    ("yes no yes yes no yes", True),
    # MOST, one word: 5 of 9, 6 of 10, 7 of 11
    ("yes no yes ok yes why yes so yes", False),
    ("yes no yes ok yes why yes so yes yes", False),
    ("yes no yes ok yes why yes so yes yes yes", True),
    # UNIT_CHARS (16): a unit of 16 characters repeated counts, one of 17 does not
    ("abcdefghijklmnop" * 4, True),
    ("abcdefghijklmnopq" * 4, False),
    # REPEATS (4): three repeats do not count, four do
    ("xyzxyzxyz0123", False),
    ("xyzxyzxyzxyz0123", True),
    # MOST, a repeated unit: 6 of 11, 6 of 10 (not more than 0.6), 7 of 10
    ("aaaaaabcdef", False),
    ("aaaaaabcde", False),
    ("aaaaaaabcd", True),
])
def test_degenerate_output_at_its_edges(text, bad):
    assert (degenerate(text) is not None) == bad


@pytest.mark.parametrize("seconds, shown", [
    (-1, "0s"), (0.49, "0s"), (0.5, "1s"), (59.4, "59s"), (59.5, "1m00s"), (60, "1m00s"),
    (61, "1m01s"), (3599.4, "59m59s"), (3599.5, "1h00m"), (3600, "1h00m"), (3661, "1h01m"),
])
def test_duration_at_its_edges(seconds, shown):
    """Seconds under a minute, minutes and seconds under an hour, then hours and minutes; half
    a second rounds up."""
    assert duration(seconds) == shown


def shards_line(n: int, total: int) -> str:
    return (f"[2025-10-16 09:06:22 TP0] Loading safetensors checkpoint shards: "
            f"{100 * n // total:3d}% Completed | {n}/{total} [00:10<00:20,  2.00it/s]")


# (shards done, seconds since the start) fed after 0/100 at 0 s -> whether a progress line comes
@pytest.mark.parametrize("fed, logged", [
    # SHARDS_STEPS (10): 9 of 100 shards since the last line are not worth one, 10 are
    ([(9, 1.0)], [False]),
    ([(10, 1.0)], [True]),
    ([(11, 1.0)], [True]),
    # SHARDS_QUIET_S (60): one more shard after 59.9 s is not, after 60 s it is
    ([(1, 59.9)], [False]),
    ([(1, 60.0)], [True]),
    # the same shard again, a minute later: nothing new
    ([(10, 1.0), (10, 70.0)], [True, False]),
    # the last shard always
    ([(95, 1.0), (99, 2.0), (100, 3.0)], [True, False, True]),
])
def test_shard_progress_at_its_edges(fed, logged):
    progress = Progress(start=0.0)
    # the first shards line at once, whatever the clock
    assert progress.feed(shards_line(0, 100), 0.0) == [
        "weights (at 0s)", "weights: 0/100 shards (0%), 2.00it/s, ETA 20s"]
    said = [progress.feed(shards_line(n, 100), when) for n, when in fed]
    assert [any(m.startswith("weights: ") for m in messages) for messages in said] == logged


def test_no_eta_at_the_last_shard():
    progress = Progress(start=0.0)
    assert progress.feed(shards_line(99, 100), 1.0)[-1].endswith(", ETA 20s")
    last = progress.feed(shards_line(100, 100), 2.0)[-1]
    assert last == "weights: 100/100 shards (100%), 2.00it/s"


def test_summary_leaves_out_the_phases_under_half_a_second():
    """SUMMARY_MIN_S (0.5): a phase that would read 0s is left out."""
    progress = Progress(start=0.0, times={"init": 0.49, "weights": 0.5, "kv cache": 0.51},
                        phase="ready", ready=True)
    assert progress.summary(10.0) == "weights 1s, kv cache 1s"
    assert Progress(start=0.0).summary(0.49) == "no phase seen"
    assert Progress(start=0.0).summary(0.5) == "starting 1s"


def test_bad_logprobs_counts_nan_inf_and_missing():
    assert bad_logprobs(["-0.01", "-2.5"]) == 0
    assert bad_logprobs(["nan", "-inf", "None", "-0.1"]) == 3
