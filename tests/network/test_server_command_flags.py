"""The flag check against the real sglang 0.5.9 and 0.5.23 wheels: the flags each release knows,
every flag we render among them, an unknown one named with the release, and the tuning space's
values checked before any restart.

``known_flags`` reads the release's sources statically; its result for 0.5.6, 0.5.9, 0.5.12,
0.5.14, 0.5.16 and 0.5.23 was compared once with the option strings of the real argparse parser
(``ServerArgs.add_cli_args`` run with torch and friends stubbed out): identical sets.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pyinfra.api import Inventory

from pve_sglang import remote
from pve_sglang.server.command import (
    KnownFlags,
    check_flags,
    known_flags,
    parse_flags_output,
)
from pve_sglang.tuning.deployed import refused_flags
from pve_sglang.tuning.space import default_space, start_of
from server_args_venv import flag_site
from test_server_command import H100, RELEASES, argv_for, settings


@pytest.fixture(scope="session")
def site(tmp_path_factory, sglang_wheel):
    """Per release, a site-packages folder holding only the files known_flags reads."""
    return {version: flag_site(sglang_wheel(version), tmp_path_factory.mktemp(f"sglang-{version}"))
            for version in RELEASES}


# --- flags of the real releases -----------------------------------------------------------


@pytest.mark.parametrize("version", RELEASES)
def test_known_flags_reads_the_release(site, version):
    known = known_flags(site[version])
    assert known.version == version
    assert known_flags(site[version] / "sglang") == known
    common = {
        "--tp-size", "--moe-runner-backend", "--attention-backend", "--disable-cuda-graph",
        "--max-running-requests", "--mem-fraction-static", "--enable-flashinfer-allreduce-fusion",
        "--disable-flashinfer-autotune", "--nnodes", "--node-rank", "--dist-init-addr", "--api-key",
        "--model-path", "--host", "--port", "--served-model-name", "--config",
    }
    assert common <= known, common - known
    assert "--tp" not in known  # only argparse's prefix matching accepts it
    new_in_0_5_23 = {"--cuda-graph-backend-decode", "--flashinfer-allreduce-fusion-backend"}
    assert (new_in_0_5_23 <= known) == (version == "0.5.23")
    assert len(known) == {"0.5.9": 342, "0.5.23": 560}[version]


#: A one-node container's inventory: server_files reads it only for a model served by several.
NO_NODES = Inventory(([], {}))


@pytest.mark.parametrize("version", RELEASES)
def test_every_value_of_the_default_space_renders_flags_the_release_knows(site, version):
    """make tune's check before any restart (``tuning.deployed.refused_flags``), against the
    release's real flags: the whole default space passes; a release without a flag refuses
    each value that renders it, naming the coordinate, the value and the flag."""
    s = settings(sglang_version=version)
    space = default_space(version, moe=True)
    start = start_of(s.tuning, space)
    known = known_flags(site[version])
    assert refused_flags("pve1-105", s, [], NO_NODES, start, space, known) == []
    less = KnownFlags(known - {"--schedule-policy"}, version)
    refused = refused_flags("pve1-105", s, [], NO_NODES, start, space, less)
    policies = [v for v in space["schedule_policy"] if v is not None]
    assert refused == [f"schedule_policy={v!r}: sglang {version} does not know --schedule-policy "
                       f"({len(less)} flags read from its server_args.py and arg_groups)"
                       for v in policies]


def test_0_5_23_flags_come_from_arg_groups(site):
    known = known_flags(site["0.5.23"])
    assert "--tensor-parallel-size" in known  # an Arg(aliases=...) of a fields namespace
    assert "--no-enable-tf32-matmul" in known  # BooleanOptionalAction
    assert "--fp8-gemm-backend" in known  # Arg(cli_name=...)


@pytest.mark.parametrize("version", RELEASES)
def test_every_flag_we_render_exists(site, version):
    """Each release's own spelling (server.spelling) of every flag we render."""
    known = known_flags(site[version])
    check_flags(argv_for(settings().model_copy(update={"sglang_version": version})), known)
    full = settings(
        max_running_requests=64, enable_flashinfer_allreduce_fusion=True, served_model_name="m",
        api_key="k", nodes=["a", "b"], disable_cuda_graph=True, cuda_graph_max_bs=160,
        chunked_prefill_size=-1, schedule_policy="lpm",
    ).model_copy(update={"sglang_version": version})
    check_flags(argv_for(full, caps=H100, rank=1, nnodes=2, addr="10.0.0.1:50000"), known)


@pytest.mark.parametrize("version", RELEASES)
def test_unknown_flag_fails_naming_it_and_the_release(site, version):
    known = known_flags(site[version])
    argv = argv_for(settings(extra_server_args=["--enable-warp-drive", "--tp=8", "--disable-cuda-graph"]))
    with pytest.raises(ValueError) as error:
        check_flags(argv, known)
    message = str(error.value)
    assert f"sglang {version}" in message
    assert "--enable-warp-drive" in message and "--tp" in message
    assert "--disable-cuda-graph" not in message


def test_flag_lister_matches_known_flags(site, tmp_path):
    """The stand-alone script finds the installed release by itself, without importing it."""
    script = tmp_path / "flags.py"
    script.write_text(remote.source(remote.FLAG_LISTER).read_text())
    for version in RELEASES:
        env = {**os.environ, "PYTHONPATH": str(site[version])}
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        printed = parse_flags_output(done.stdout)
        assert printed.version == version
        assert printed == known_flags(site[version])
