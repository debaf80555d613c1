"""The LXC host's one read of its containers (``LxcHostState``): the same values as each fact
read alone, on real files (on a real container: tests/lxc/test_host_state_lxc.py); what an
operation changes is read again (``operations/host_reads.py``)."""

from __future__ import annotations


import pytest
from pyinfra.context import ctx_host, ctx_state

from harness import FoldingHost, sh
from pve_sglang.runtime import cache
from pve_sglang.facts.one_read import PARTS, ReadPart, part_values
from pve_sglang.facts.lxc_host import HOST_PARTS, HostPart, LxcHostState
from pve_sglang.operations import host_reads as host_state, lxc, owned


def alone(kind: str, args: tuple):
    """Part KIND read with its own fact's command, processed as pyinfra does."""
    fact = HOST_PARTS[kind][0]()
    lines = sh(fact.command(*args))
    return fact.process(lines) if lines else fact.default()


def folded(parts: tuple) -> dict:
    return part_values(parts, LxcHostState().process(sh(LxcHostState().command(parts))),
                       HOST_PARTS)


def test_files_and_limits_read_in_one_command_give_each_fact_its_own_value(tmp_path):
    (tmp_path / "config").write_text("lxc.arch = linux64\n\n")  # its own empty last line
    (tmp_path / "bare").write_text("no newline")
    (tmp_path / "empty").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "bare")
    parts = (("config", (str(tmp_path / "config"),)),
             ("config", (str(tmp_path / "bare"),)),
             ("config", (str(tmp_path / "empty"),)),
             ("config", (str(tmp_path / "missing"),)),
             ("files", ((str(tmp_path / "bare"), str(tmp_path / "link"), str(tmp_path / "no")),)),
             ("limits", ()),
             ("status", ("pve-sglang-missing", str(tmp_path))),
             ("cgroup", ("pve-sglang-missing", str(tmp_path), ("memory.max",))))
    values = folded(parts)
    assert list(values) == list(parts)
    for (kind, args), value in values.items():
        assert value == alone(kind, args), (kind, args)
    assert values[parts[0]] == ["lxc.arch = linux64", ""]
    assert values[parts[1]] == ["no newline"]
    assert values[parts[2]] is None and values[parts[3]] is None
    assert values[parts[4]] == [str(tmp_path / "bare")]
    assert values[parts[5]]["cpus"] >= 1
    assert values[parts[6]] is None and values[parts[7]] == {}


class HostFoldingHost(FoldingHost):
    """A host whose reads fold (a local or SSH host), answered from VALUES."""

    FOLD, PARTS = LxcHostState, HOST_PARTS

    def __init__(self, values: dict):
        super().__init__(values, "lxc1")
        self.state.is_executing = False

    def lookup(self, kind, args):
        return self.values[host_state._part(kind, args)]


LXC = "/var/lib/lxc"
CONFIGS = {f"c{i}": f"{LXC}/c{i}/config" for i in (1, 2)}
KEYS = ("memory.max",)


@pytest.fixture
def folding(monkeypatch):
    values = {("limits", ()): {"version": "v2", "cpus": 2, "swap_accounting": False}}
    for ct, config in CONFIGS.items():
        values[("config", (config,))] = [f"lxc.uts.name = {ct}"]
        values[("status", (ct, LXC))] = "RUNNING"
        values[("cgroup", (ct, LXC, KEYS))] = {"memory.max": "1073741824"}
    host = HostFoldingHost(values)
    monkeypatch.setattr(host_state, "_folds", lambda: True)
    monkeypatch.setattr(host_state, "part_values",
                        lambda parts, raw, table: {p: values[p] for p in parts})
    with ctx_state.use(host.state), ctx_host.use(host):
        host_state.expect([("config", (c,)) for c in CONFIGS.values()] + [("limits", ())],
                          executing=False)
        host_state.expect([p for ct, c in CONFIGS.items() for p in
                           (("status", (ct, LXC)), ("config", (c,)), ("cgroup", (ct, LXC, list(KEYS))))],
                          executing=True)
        yield host


def test_each_stage_reads_what_it_expects_at_its_first_ask(folding):
    assert owned.contents(CONFIGS["c2"]) == ["lxc.uts.name = c2"]
    assert folding.reads == [("config", "config", "limits")]
    host_state.read("limits")
    owned.contents(CONFIGS["c1"])
    assert len(folding.reads) == 1
    folding.state.is_executing = True
    assert lxc.status("c1", LXC) == "RUNNING"
    assert folding.reads[1:] == [("status", "config", "cgroup", "status", "config", "cgroup")]
    assert host_state.read("cgroup", "c2", LXC, list(KEYS)) == {"memory.max": "1073741824"}
    owned.contents(CONFIGS["c2"])
    assert len(folding.reads) == 2
    # Not expected: read alone, with its own fact.
    folding.values[("status", ("c3", LXC))] = None
    assert lxc.status("c3", LXC) is None
    assert folding.reads[2:] == [("status",)]


def test_what_an_operation_changed_is_read_again_alone(folding):
    folding.state.is_executing = True
    lxc.status("c1", LXC)
    files = ("files", (("/r/etc/x.conf",),))
    folding.values[files] = []
    host_state.read(*files[:1], list(files[1][0]))
    del folding.reads[:]
    # Started or restarted: its status and cgroup values (read again together), not the other
    # container's.
    host_state.forget_container("c1", LXC)
    lxc.status("c1", LXC)
    host_state.read("cgroup", "c1", LXC, list(KEYS))
    lxc.status("c2", LXC)
    host_state.read("cgroup", "c2", LXC, list(KEYS))
    assert folding.reads == [("status", "cgroup")]
    # A written config is read again; a created container's rootfs: every guard's files.
    cache.changed(CONFIGS["c2"])
    owned.contents(CONFIGS["c2"])
    host_state.forget_container("c2", LXC, created=True)
    host_state.read("files", ["/r/etc/x.conf"])
    assert folding.reads[1:] == [("config",), ("files", "status", "cgroup")]


@pytest.mark.parametrize("part", [*HOST_PARTS, *PARTS], ids=lambda part: f"{type(part).__name__}.{part}")
def test_a_part_of_either_one_read_is_its_name(part):
    """The host's parts and the container's are named by one rule (``one_read.ReadPart``): a
    part given by its name is the same part, and it shows as that name (str, repr, f-string)."""
    assert isinstance(part, ReadPart) and set(HOST_PARTS) == set(HostPart)
    assert type(part)(part.value) is part and part == part.value
    assert (str(part), repr(part), f"{part}") == (part.value, repr(part.value), part.value)
