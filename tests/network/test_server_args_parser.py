"""Our rendered server command, parsed by each tested release's real argument parser.

Each release runs in its own venv (``server_args_venv.parser_venv``: the real wheel, torch and
what ``sglang.srt.server_args`` imports, at the release's own pins). ``PROBE`` does what
``prepare_server_args`` does first (``ServerArgs.add_cli_args`` on an ``ArgumentParser``, then
``parse_args``) with every log record and everything written to stderr captured, and prints the
parsed values. A deprecated spelling logs while it is parsed (``DeprecatedStoreTrueAction``,
0.5.14 and later); ``--enable-flashinfer-allreduce-fusion``'s warning comes later, from the
post-processing (``_handle_deprecated_args``), when ``enable_flashinfer_allreduce_fusion`` is
true and no backend is named: the parsed values show that condition false (the full post-
processing needs sgl-kernel, flashinfer and a GPU).

The releases: every tested one (0.5.9, the seed's, to 0.5.23, the newest), and 0.5.14, the first
of the new spellings. The spellings' boundaries themselves are checked on the sources
(``test_spelling_boundaries_in_the_sources``). All cases of one release run in one process. The
spelling table alone, and the command spelled for each release: tests/unit/test_spelling.py.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.version import Version

from pve_sglang.remote.sglang_flags import flag_sources
from pve_sglang.server import spelling
from pve_sglang.server.command import EnvRef, check_flags, known_flags, server_argv
from pve_sglang.tuning.space import default_space
from server_args_venv import flag_site, parser_venv
from test_spelling import H100, NEW_SPELLINGS, PY, full_argv, settings

PARSED_RELEASES = ["0.5.9", "0.5.10", "0.5.11", "0.5.13", "0.5.14", "0.5.18", "0.5.22", "0.5.23"]
#: The releases the suite tests (issue 21), with both sides of the 0.5.14 boundary.
SOURCE_RELEASES = ["0.5.9", "0.5.10", "0.5.11", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.18",
                   "0.5.22", "0.5.23"]

PROBE = r'''
import argparse, contextlib, io, json, logging, sys

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(f"{record.levelname} {record.name}: {record.getMessage()}")


logging.getLogger().addHandler(Keep(logging.DEBUG))
logging.getLogger().setLevel(logging.DEBUG)
from sglang.srt.server_args import ServerArgs

results = {}
for name, argv in json.loads(sys.stdin.read()).items():
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    records.clear()  # what importing logged, or the case before, is not this case's doing
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            values, status = vars(parser.parse_args(argv)), 0
        except SystemExit as error:
            values, status = {}, error.code
    results[name] = {"values": values, "records": list(records), "stderr": stderr.getvalue(),
                     "status": status}
print(json.dumps(results, default=repr))
'''


def parse(venv, cases: dict[str, list[str]]) -> dict[str, dict]:
    """The release's parser on each case's argv (after ``-m sglang.launch_server``), in one
    process; the key reference becomes a plain value, as the launcher hands it over."""
    args = {name: ["sk-test" if isinstance(arg, EnvRef) else arg for arg in argv[3:]]
            for name, argv in cases.items()}
    done = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], input=json.dumps(args),
                          capture_output=True, text=True, timeout=600, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def cases(release: str) -> dict[str, list[str]]:
    launch = [PY, "-m", "sglang.launch_server", "--model-path", "/m"]
    return {
        "full": full_argv(release, attention_backend="dsa"),
        "default": server_argv(settings(release), 8, H100, None, 1, None, PY),
        "old cuda graph": [*launch, "--disable-cuda-graph"],
        "dsa": [*launch, "--attention-backend", "dsa"],
        "hrrn": [*launch, "--schedule-policy", "hrrn"],
        "old graph bs": [*launch, "--cuda-graph-max-bs", "8"],
        "metrics off": server_argv(settings(release, enable_metrics=False), 8, H100, None, 1,
                                   None, PY),
        **tune_cases(release),
    }


def tune_cases(release: str) -> dict[str, list[str]]:
    """Each value of the tuning search's default space (MoE included), the others the
    defaults, as the deploy renders it for RELEASE (a batch size with CUDA graphs on)."""
    out = {}
    for coordinate, values in default_space(release, moe=True).items():
        for value in values:
            graphs = {"disable_cuda_graph": False} if coordinate == "cuda_graph_max_bs" else {}
            s = settings(release, **graphs).model_copy(update={coordinate: value})
            out[f"tune {coordinate}={value!r}"] = server_argv(s, 8, H100, None, 1, None, PY)
    return out


def deprecations(parsed: dict) -> list[str]:
    lines = parsed["records"] + parsed["stderr"].splitlines()
    return [line for line in lines if "deprecat" in line.lower()]


@pytest.fixture(scope="module")
def parsed(sglang_wheel):
    """Per release, every case of ``cases`` as its real parser took it. The venvs are made
    one after another (cached), then the parsers run side by side: each mostly waits for its
    venv's GBs (torch) to be read from the disk."""
    venvs = {release: parser_venv(release, sglang_wheel(release)) for release in PARSED_RELEASES}
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = {release: pool.submit(parse, venv, cases(release)) for release, venv in venvs.items()}
        return {release: run.result() for release, run in runs.items()}


# --- the sources --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source_sites(tmp_path_factory, sglang_wheel):
    """Per release: (site folder for known_flags, the argument sources it reads as one text)."""
    out = {}
    for release in SOURCE_RELEASES:
        root = flag_site(sglang_wheel(release), tmp_path_factory.mktemp(f"sglang-{release}"))
        text = "\n".join(path.read_text() for path in flag_sources(root / "sglang"))
        out[release] = (root, text)
    return out


@pytest.mark.parametrize("release", SOURCE_RELEASES)
def test_spelling_boundaries_in_the_sources(release, source_sites):
    """Each release defines the spellings the table gives it, and deprecates the old ones
    exactly where the table stops using them."""
    site, source = source_sites[release]
    known = known_flags(site)
    new = Version(release) >= NEW_SPELLINGS
    check_flags(full_argv(release), known, release)  # every flag we render exists there
    assert ({"--cuda-graph-backend-decode", "--cuda-graph-backend-prefill",
             "--flashinfer-allreduce-fusion-backend"} <= known) is new
    deprecated_cuda_graph = ('"--disable-cuda-graph",\n            action=DeprecatedStoreTrueAction'
                             in source)
    deprecated_fusion = "--enable-flashinfer-allreduce-fusion is deprecated" in source
    assert deprecated_cuda_graph is deprecated_fusion is new
    # The table leaves each old spelling exactly where the release deprecates it.
    assert (spelling.flag("disable_cuda_graph", release) != ["--disable-cuda-graph"]) is new
    assert (spelling.flag("flashinfer_allreduce_fusion", release)
            != ["--enable-flashinfer-allreduce-fusion"]) is new
    has_dsa = '"dsa",' in source
    assert has_dsa is (Version(release) >= Version("0.5.13"))
    assert spelling.attention_backend("nsa", release) == ("dsa" if has_dsa else "nsa")


# --- the real parsers ---------------------------------------------------------------------


@pytest.mark.parametrize("release", PARSED_RELEASES)
def test_rendered_command_parses_without_deprecation(release, parsed):
    parsed = parsed[release]["full"]
    assert parsed["status"] == 0, parsed["stderr"]
    assert deprecations(parsed) == []
    values = parsed["values"]
    assert values["model_path"] == "/models/model"
    # 0.5.13 and older name the dest after --tensor-parallel-size, its first spelling.
    assert values.get("tp_size", values.get("tensor_parallel_size")) == 16
    assert values["nnodes"] == 2 and values["node_rank"] == 1
    assert values["dist_init_addr"] == "10.0.0.1:50000"
    assert values["max_running_requests"] == 64 and values["served_model_name"] == "glm-5"
    assert values["api_key"] == "sk-test"
    assert values["moe_runner_backend"] == "flashinfer_cutlass"
    assert values["mem_fraction_static"] == 0.92
    assert values["enable_metrics"] is True  # enable_metrics: on by default
    assert values["chunked_prefill_size"] == 4096 and values["schedule_policy"] == "lpm"
    graph_bs = "cuda_graph_max_bs_decode" if Version(release) >= NEW_SPELLINGS else "cuda_graph_max_bs"
    assert values[graph_bs] == 160
    if Version(release) >= NEW_SPELLINGS:
        assert values["cuda_graph_backend_decode"] == "disabled"
        assert values["cuda_graph_backend_prefill"] == "disabled"
        assert values["flashinfer_allreduce_fusion_backend"] == "auto"
        # The post-processing warns when this is true and no backend is named: it is false.
        assert values["enable_flashinfer_allreduce_fusion"] is False
        assert values["disable_cuda_graph"] is False
    else:
        assert values["disable_cuda_graph"] is True
        assert values["enable_flashinfer_allreduce_fusion"] is True
    expected_backend = "dsa" if Version(release) >= Version("0.5.13") else "nsa"
    assert values["attention_backend"] == expected_backend


@pytest.mark.parametrize("release", PARSED_RELEASES)
def test_default_command_parses_without_deprecation(release, parsed):
    parsed = parsed[release]["default"]
    assert parsed["status"] == 0, parsed["stderr"]
    assert deprecations(parsed) == []
    assert parsed["values"]["enable_metrics"] is True


@pytest.mark.parametrize("release", PARSED_RELEASES)
def test_metrics_off_by_the_setting(release, parsed):
    parsed = parsed[release]["metrics off"]
    assert parsed["status"] == 0, parsed["stderr"]
    assert parsed["values"]["enable_metrics"] is False


@pytest.mark.parametrize("release", [r for r in PARSED_RELEASES if Version(r) >= NEW_SPELLINGS])
def test_the_old_spelling_is_caught_where_it_is_deprecated(release, parsed):
    """The probe does see a deprecation: the old spelling, given to a newer release."""
    parsed = parsed[release]["old cuda graph"]
    assert parsed["status"] == 0
    [warning] = deprecations(parsed)
    assert "'--disable-cuda-graph' is deprecated" in warning
    assert "--cuda-graph-backend-{decode,prefill}=disabled" in warning


@pytest.mark.parametrize("release", PARSED_RELEASES)
def test_dsa_is_refused_before_0_5_13(release, parsed):
    """Why the table keeps 'nsa' for the older releases: their parser has no 'dsa'."""
    parsed = parsed[release]["dsa"]
    if Version(release) < Version("0.5.13"):
        assert parsed["status"] == 2
        assert "invalid choice: 'dsa'" in parsed["stderr"]
    else:
        assert parsed["status"] == 0 and parsed["values"]["attention_backend"] == "dsa"


@pytest.mark.parametrize("release", PARSED_RELEASES)
def test_schedule_policy_table_matches_the_parser(release, parsed):
    """hrrn parses exactly where the table lets it through."""
    allowed = spelling.schedule_policy_problem("hrrn", release) is None
    assert (parsed[release]["hrrn"]["status"] == 0) is allowed, parsed[release]["hrrn"]["stderr"]


@pytest.mark.parametrize("release", PARSED_RELEASES)
def test_old_cuda_graph_max_bs_deprecated_or_refused_where_the_table_leaves_it(release, parsed):
    old = parsed[release]["old graph bs"]
    if spelling.flag("cuda_graph_max_bs", release) == ["--cuda-graph-max-bs"]:
        assert old["status"] == 0 and deprecations(old) == []
    else:  # deprecated (0.5.14 to 0.5.18) or ambiguous and refused (0.5.22 on)
        assert old["status"] != 0 or deprecations(old), old


@pytest.mark.parametrize("release", PARSED_RELEASES)
def test_every_value_of_the_tuning_space_parses_as_rendered(release, parsed):
    """The search's candidates are settings the deploy renders: each value of the default
    space, in the release's spelling, parses without a deprecation and means what it says."""
    new = Version(release) >= NEW_SPELLINGS
    graph_bs = "cuda_graph_max_bs_decode" if new else "cuda_graph_max_bs"
    dests = {"cuda_graph_max_bs": graph_bs}
    cases = {name: got for name, got in parsed[release].items() if name.startswith("tune ")}
    assert len(cases) == sum(len(v) for v in default_space(release, moe=True).values())
    for name, got in cases.items():
        assert got["status"] == 0 and deprecations(got) == [], (name, got["stderr"][-500:])
        coordinate, value = name.removeprefix("tune ").split("=", 1)
        seen = got["values"][dests.get(coordinate, coordinate)]
        if coordinate == "disable_cuda_graph" and new:
            seen = got["values"]["cuda_graph_backend_decode"] == "disabled"
        if coordinate == "schedule_policy" and value == "None":
            assert seen == "fcfs", name  # SGLang's own
            continue
        assert repr(seen) == value, name
