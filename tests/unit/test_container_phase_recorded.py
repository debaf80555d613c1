"""The container phase planned on a GPU host's recorded outputs (the H200 machine): the driver
follows the host's version, and several nodes get their ranks. pyinfra's real API on ``@fake``
hosts; the container's own answers are empty (a fresh container)."""

import pytest

from harness import plan_deploy
from pve_sglang.project import load_defaults
from tasks.container import container_phase
from test_host_phase_recorded import container_answers, gpu_host_responses

NODES = ["@fake/ct105", "@fake/ct106"]


def plan(**container):
    defaults = load_defaults()
    cts = [
        (f"ct{vmid}", {**defaults, "pct_vmid": vmid, "pve_host": "@fake/pve1", "platform": "pve",
                       **container})
        for vmid in (105, 106)
    ]
    return plan_deploy(
        container_phase,
        hosts=[("pve1", {**defaults}), *cts],
        responses={**container_answers(None, None), **gpu_host_responses()},
        groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105", "ct106"]},
    )


def unit(ops):
    # The server's unit, not its OnFailure= unit (``-stack-fallback.service``).
    [upload] = [c for _, cmds in ops for c in cmds if c.startswith("upload /etc/systemd/system/")
                and "-stack-fallback.service" not in c.split("\n", 1)[0]]
    return upload


def test_userspace_driver_is_the_recorded_host_version():
    ops = plan()["ct105"]
    downloads = [name for name, cmds in ops if "Download NVIDIA driver runfile" in name and cmds]
    assert downloads == ["GPU container | Download NVIDIA driver runfile 580.159.04"]
    assert any("sh /var/cache/pve-sglang/NVIDIA-Linux-x86_64-580.159.04.run "
               "--no-kernel-modules --silent" in c for _, cmds in ops for c in cmds)
    assert any("cuda-toolkit-13-0" in c for _, cmds in ops for c in cmds)  # 0.5.23's torch: 13.0


def commands(ops) -> str:
    return "\n".join(c for _, cmds in ops for c in cmds)


@pytest.mark.parametrize("container, toolkit, repo", [
    ({}, "cuda-toolkit-13-0", "debian12"),  # the default set: torch 2.14.1, CUDA 13.0 runtime
    ({"sglang_version": "0.5.9"}, "cuda-toolkit-12-8", "debian12"),  # the tuned set: cu128
    # A Debian 13 container (0.5.23 has no wheels-only lock for its Python 3.13: sglang alone).
    ({"stack_python": "3.13", "stack_install": "sglang-no-deps"}, "cuda-toolkit-13-0", "debian13"),
    ({"cuda_toolkit_version": "13.1"}, "cuda-toolkit-13-1", "debian12"),  # a pin of its major
])
def test_the_cuda_toolkit_follows_the_set_and_its_repository_the_debian_release(container, toolkit, repo):
    text = commands(plan(**container)["ct105"])
    assert f"apt-get install -y {toolkit} " in text or f" {toolkit} " in text, text[-2000:]
    assert f"/compute/cuda/repos/{repo}/x86_64/cuda-keyring_1.1-1_all.deb" in text


def test_download_folder_is_made_before_the_first_download():
    """A fresh container without a wheel store (whose mount point would make it) has no
    /var/cache/pve-sglang: the deploy makes it before the runfile's download."""
    ops = plan(wheel_store=None)["ct105"]
    names = [name for name, cmds in ops if cmds]
    made = names.index("GPU container | Download folder /var/cache/pve-sglang")
    assert made < names.index("GPU container | Download NVIDIA driver runfile 580.159.04")
    assert any(c == "mkdir -p /var/cache/pve-sglang && chmod 755 /var/cache/pve-sglang"
               for _, cmds in ops for c in cmds)


def test_single_node_unit_has_the_tuned_flags_for_the_recorded_gpu():
    text = unit(plan()["ct105"])
    assert "--tp-size 1" in text and "--moe-runner-backend flashinfer_cutlass" in text
    assert "--max-running-requests" not in text and "--nnodes" not in text


def test_two_nodes_get_ranks_and_rank0_address():
    result = plan(nodes=NODES, tp_size=2)
    for name, rank in (("ct105", 0), ("ct106", 1)):
        text = unit(result[name])
        assert "--nnodes 2" in text and f"--node-rank {rank}" in text, text
        assert "--dist-init-addr sglang-105:50000" in text
        assert "--tp-size 2" in text


def test_ca_bundle_older_than_a_certificate_is_updated():
    """The CA store is updated when its bundle is missing or older than a certificate (an
    update that failed, a run killed after the upload), not only when an upload changed."""
    from tasks.container import bundle_older

    def at(mtime):
        return {"type": "file", "mode": "644", "sha1": "0" * 40, "mtime": mtime}

    for bundle, certs, stale in [
        (at(200), [at(100), at(150)], False),  # updated after the certificates
        (at(200), [at(100), at(250)], True),  # a certificate written after the last update
        (None, [at(100)], True),  # no bundle at all
        (None, [None], False),  # nothing to add yet (the upload comes first)
        (at(200), [None, at(100)], False),
        (at(None), [at(300)], False),  # times unknown: only a change in this run decides
        (at(200), [at(None)], False),
    ]:
        assert bundle_older(bundle, certs) is stale, (bundle, certs)
