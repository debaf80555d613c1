"""The plan shown before a container runs (``planned_container_steps``, ``planned_checks``) is
made from the same step lists the phases run (``container_plan``, ``verify_plan``): every
operation of the phase, planned on the H200 machine's recorded outputs, comes from one step of
that list, and every step adds at least one operation, so no step runs without its words."""

from __future__ import annotations

import pytest
from pyinfra import host

from harness import plan_deploy
from pve_sglang.project import load_defaults
from tasks import container, verify
from test_host_phase_recorded import container_answers, gpu_host_responses


def counted(steps: list, counts: list) -> list:
    """STEPS with each function wrapped to count the operations it adds on this host."""
    def wrap(words, run):
        def counting(*args):
            before = len(host.op_hash_order)
            result = run(*args)
            counts.append((host.name, words, len(host.op_hash_order) - before))
            return result
        return counting
    return [(words, wrap(words, run)) for words, run in steps]


def plan(phase, **container_data) -> dict:
    defaults = load_defaults()
    ct = {**defaults, "pct_vmid": 105, "pve_host": "@fake/pve1", "platform": "pve",
          **container_data}
    return plan_deploy(
        phase,
        hosts=[("pve1", {**defaults}), ("ct105", ct)],
        responses={**container_answers(None, None), **gpu_host_responses()},
        groups={"pve_hosts": ["pve1"], "gpu_containers": ["ct105"]},
    )


@pytest.mark.parametrize("data", [{}, {"ca_certificates": ["/etc/hostname"]},
                                  {"stack_install": "sglang-no-deps"}])
def test_every_container_operation_comes_from_a_step_with_words(monkeypatch, data):
    counts: list = []
    real = container.container_plan
    monkeypatch.setattr(container, "container_plan",
                        lambda *args: counted(real(*args), counts))
    ops = plan(container.container_phase, **data)["ct105"]
    mine = [(words, n) for name, words, n in counts if name == "@fake/ct105"]
    words = [words for words, _ in mine]
    assert len(words) == 8 + bool(data.get("ca_certificates"))
    assert words[0] == ("finish a rollback cut short; stop if this set failed as an upgrade before "
                        "(retry_failed_stack)")
    assert words[-4].startswith("build the stack /opt/sglang/venv.stacks/")
    assert words[-2].endswith(", enable it and (re)start it once")
    assert words[-1].startswith(
        "keep the 2 newest stacks (the serving one and its rollback target always)")
    # The default set comes from the host's wheel store; without a lock there is none.
    assert ("then tell the wheel store" in words[-1]) == (
        data.get("stack_install") != "sglang-no-deps")
    assert all(n > 0 for _, n in mine), mine
    assert sum(n for _, n in mine) == len(ops)


def test_every_verify_operation_comes_from_a_check_with_words(monkeypatch):
    counts: list = []
    real = verify.verify_plan
    monkeypatch.setattr(verify, "verify_plan", lambda *args: counted(real(*args), counts))
    ops = plan(verify.verify_phase, bench=True, bench_concurrencies=[1, 4])["ct105"]
    mine = [(words, n) for name, words, n in counts if name == "@fake/ct105"]
    assert [words for words, _ in mine][0] == "GPUs visible in the container"
    assert mine[-1][0] == "benchmark at concurrency [1, 4]"
    assert all(n > 0 for _, n in mine), mine
    # The stack check is verify_steps' own, named in planned_checks before the plan's checks.
    stack = [name for name, _ in ops if "The stack is lock" in name]
    assert len(stack) == 1
    assert sum(n for _, n in mine) == len(ops) - len(stack)
