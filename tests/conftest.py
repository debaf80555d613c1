"""
Shared pytest fixtures, and the test tiers they decide.

A test's tier follows from the fixtures it uses (directly or through other fixtures), never from
its name: ``lxc_host`` (and every fixture built on it: ``lxc_env``, ``lxc_container``) marks it
``lxc`` and ``root``, ``as_root`` marks it ``root``, ``package_index`` (and every fixture built
on it: ``sglang_wheel``, ``pypi_wheel``) marks it ``network``. The fast tier is every other test:
``make test-fast`` (``pytest -m "not lxc and not root and not network"``).

Downloads retry (tests/wheels.py): a slow answer of the package index fails no test. The
wheels come from ``.cache/wheels``, filled once with retries; from the first use of
``package_index`` on, every pip and uv this session starts (the deploy's own wheel fetch and lock
compile through the pyinfra CLI included) retries too (``RETRY_ENVIRONMENT``).

LXC test environment (see devtools/lxc_env.py), all needing root, lxc, debootstrap and zstd:

+ ``lxc_env`` (session): the ``LxcEnv``: a private LXC path with the extracted Debian 12 base.
+ ``lxc_container`` (session): a running container (systemd up). Its ``name``, ``lxc_path``,
  ``inventory_name`` (``@lxc/NAME``) and ``host_data()`` (``lxc_name``, ``lxc_path``,
  ``lxc_local``) are what the ``@lxc`` connector needs.
+ ``lxc_container_factory`` (function): ``make(count=1, extra_config=(), start=True,
  cgroup="host", unprivileged=False, network="loopback")`` returns a list of new containers,
  destroyed when the test ends. ``cgroup="v2"`` starts one under a pure cgroup2 mount
  (``lxc.cgroup2.*`` rules apply); ``unprivileged=True`` maps its ids to 100000+;
  ``network="bridge"`` puts it on LXC's NAT bridge at an address of its own (to download, or
  to be reached from this machine). Every container has a network namespace of its own.
+ ``deployed_copy`` (session): ``copy(name) -> Deploy``: a new container NAME in the
  state ``test_deploy_lxc``'s ``Deploy`` deploys, a copy of one container deployed once per
  run (tests/provisioned.py), for a module that needs a deployed container but does
  not test the first deploy; the module calls its ``destroy()``.
+ ``deploy_namesakes`` (module): running containers with the names and LXC path that
  ``make deploy`` without a hosts file gives its containers (``pve-sglang-demo`` under
  /var/lib/lxc), for tests that must hold beside them.
"""

from __future__ import annotations

import os as _os

if _os.environ.get("PYTEST_XDIST_WORKER"):
    # pyinfra's CLI (imported by pyinfra_testing and the tests that use it) patches the
    # standard library with gevent at import. A pytest-xdist worker waits for its next test on
    # an event that its I/O thread sets: patch before the worker makes it (this conftest is
    # loaded first), and keep gevent's loop running while the main greenlet waits, so that the
    # wait blocks instead of ending as "would block forever".
    import gevent
    from gevent import monkey

    monkey.patch_all()

    def _keep_the_loop_alive() -> None:
        while True:
            gevent.sleep(60)

    gevent.spawn(_keep_the_loop_alive)

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools import lxc_env as lxc_env_module
from pve_sglang.hosts_file import EMBEDDED_HOSTS_FILE, build_groups, read_hosts_file

import provisioned
import tiers
import wheels
from cache_dir import TEST_CACHE, building, bytecode

#: The tests' root: each test file sits in the folder of its tier (tests/tiers.py).
TESTS = Path(__file__).parent
# A test module imports another's helpers by its name, whatever folder either sits in.
sys.path[1:1] = [str(TESTS / folder) for folder in tiers.FOLDERS]

# The machine cache of the pyinfra runs the tests start (locks, whole wheel sets: GBs) is the test
# cache's, where the release proof keeps its own: a test never fills the user's
# ~/.cache/pve-sglang (the embedded default's deploy in test_lxc_parity put a 4.1 GB set there,
# a second copy of one the release proof holds). A test that needs an empty one sets its own.
os.environ.setdefault("PVE_SGLANG_CACHE", str(TEST_CACHE / "pyinfra-machine-cache"))

#: Fixture -> the markers a test that uses it gets (pyproject.toml registers them).
TIER_OF_FIXTURE: dict[str, tuple[str, ...]] = {
    "lxc_host": ("lxc", "root"),
    "as_root": ("root",),
    "package_index": ("network",),
    "machine_alone": ("machine", "root"),
}
#: pip's and uv's own retries, for every one this session starts once a test downloads (what is
#: set already stays): connections and reads tried again, an interrupted download resumed.
RETRY_ENVIRONMENT = {
    "PIP_RETRIES": "10",
    "PIP_DEFAULT_TIMEOUT": "60",
    "PIP_RESUME_RETRIES": "5",
    "UV_HTTP_RETRIES": "10",
    "UV_HTTP_TIMEOUT": "60",
}


#: As root, each run's temporary folders are under a folder of its own here, not in pytest's
#: shared ``/tmp/pytest-of-root``: every pytest that starts sets that one back to 0700, which
#: takes the way down to their rootfs from the unprivileged containers of a run still going.
RUNS_TEMP = Path("/var/tmp/pve-sglang-pytest")
#: Finished runs' folders kept for a look after a failure (pytest keeps 3 of its own).
RUNS_KEPT = 3


#: The checkout's own Python, compiled once a run: the suite starts pyinfra's CLI and our
#: remote helpers hundreds of times, and where ``PYTHONDONTWRITEBYTECODE`` is set (as on the
#: CI machines) each compiled every module it imports again (about 0.1 s a process).
SOURCES = ("pve_sglang", "tasks", "devtools", "tests", "bench", "deploy.py", "inventory.py",
           "tune.py")


def compile_sources() -> None:
    import compileall

    root = Path(__file__).resolve().parents[1]
    for name in SOURCES:
        path = root / name
        if path.is_dir():
            compileall.compile_dir(path, quiet=2, workers=0)
        elif path.is_file():
            compileall.compile_file(path, quiet=2)


#: ``sys.dont_write_bytecode`` as the process started (PYTHONDONTWRITEBYTECODE).
_DONT_WRITE_BYTECODE = sys.dont_write_bytecode


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        compile_sources()
    # Where PYTHONDONTWRITEBYTECODE is set, every test process (each pytest-xdist worker, each
    # run) rewrote the asserts of every test module again (3 s of CPU each): while collecting,
    # pytest keeps its rewritten modules in __pycache__ (written whole, then renamed).
    sys.dont_write_bytecode = False
    if os.geteuid() != 0 or config.option.basetemp or hasattr(config, "workerinput"):
        return  # not root, told where, or a pytest-xdist worker (given a folder of the run's)
    RUNS_TEMP.mkdir(mode=0o711, exist_ok=True)
    RUNS_TEMP.chmod(0o711)
    finished = sorted((run for run in RUNS_TEMP.glob("run-*")
                       if not Path(f"/proc/{run.name.split('-')[1]}").exists()),
                      key=lambda run: run.stat().st_mtime)
    for run in finished[:-RUNS_KEPT] if RUNS_KEPT else finished:
        subprocess.run(["rm", "-rf", "--one-file-system", str(run)], check=False)
    config.option.basetemp = str(RUNS_TEMP / f"run-{os.getpid()}")


def pytest_collection_finish(session):
    sys.dont_write_bytecode = _DONT_WRITE_BYTECODE


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers set here
def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for name, markers in TIER_OF_FIXTURE.items():
            if name in used:
                for marker in markers:
                    item.add_marker(marker)
    check_folders(config, items)
    items[:] = longest_modules_first(items)


def check_folders(config, items) -> None:
    """Stop the run where a test file is not in the folder of its tests' tier (tests/tiers.py):
    before -m deselects, so that the fast tier stops on a fast-folder test that boots containers."""
    collected = []
    for item in items:
        path = Path(item.path)
        if not path.is_relative_to(TESTS):
            continue
        markers = frozenset(m.name for m in item.iter_markers()) & tiers.TIER_MARKERS
        fixtures = tuple(name for name in TIER_OF_FIXTURE if name in getattr(item, "fixturenames", ()))
        collected.append(tiers.Collected(path.relative_to(TESTS).as_posix(), item.name, markers, fixtures))
    # Chosen tests (FILE::TEST, --lf) say nothing of their files' other tests.
    whole = not config.getoption("lf", False) and not any("::" in arg for arg in config.args)
    for problem in tiers.misplaced(collected, whole):
        # A collection error (pytest-xdist's workers pass it on): the run stops before any test.
        config.hook.pytest_collectreport(report=pytest.CollectReport(
            problem.split(":")[0], "failed", problem, []))


#: Each module's seconds in the last whole run (its tests' setup, call and teardown added),
#: written by that run's end: the next run starts the longest modules first.
MODULE_SECONDS = TEST_CACHE / "module-seconds.json"
#: A module not timed yet counts by the heaviest tier of its tests: the modules that boot
#: containers take minutes, those of the fast tier seconds.
SECONDS_OF_TIER = (("lxc", 60.0), ("root", 20.0), ("network", 10.0))
_timed: dict[str, float] = {}


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def longest_modules_first(items: list) -> list:
    """ITEMS with the longest modules first (by the last run's times; a module moved to
    another folder keeps its time by its file's name), each module's tests together and in
    their order: pytest-xdist's workers take whole modules in this order
    (``--no-loadscope-reorder``), so the long ones start early and the many short ones fill
    the end, instead of one worker finishing a long module alone at the end. By machine turn
    (``by_turns``): a test that runs alone holds every other root test back while it waits
    and runs."""
    try:
        recorded = json.loads(MODULE_SECONDS.read_text())
    except (OSError, ValueError):
        recorded = {}
    by_name = {Path(module).name: s for module, s in recorded.items()}
    seconds: dict[str, float] = {}
    rank: dict[str, int] = {}
    for item in items:
        guess = max((s for marker, s in SECONDS_OF_TIER if item.get_closest_marker(marker)),
                    default=1.0)
        module = module_of(item.nodeid)
        seconds[module] = recorded.get(module, by_name.get(
            Path(module).name, max(seconds.get(module, 0.0), guess)))
        rank[module] = min(rank.get(module, 2), turn_rank(item))
    modules = by_turns(sorted(seconds, key=lambda m: -seconds[m]), rank)
    order = {module: index for index, module in enumerate(modules)}
    return sorted(items, key=lambda item: order[module_of(item.nodeid)])


def turn_rank(item) -> int:
    """0: ITEM runs alone (machine); 1: it holds a shared machine turn (root); 2: it needs
    none. A module's rank is its lowest."""
    if item.get_closest_marker("machine"):
        return 0
    return 1 if item.get_closest_marker("root") else 2


def by_turns(modules: list[str], rank: dict[str, int], workers: int = 4) -> list[str]:
    """MODULES (longest first) in the order the workers should take them: each worker starts
    with one module, then one more (pytest-xdist's first two rounds). The longest module that
    runs alone goes first, the longest that need no turn fill the rest of both rounds (the
    other workers run them while it holds the machine), then those that hold a turn, then the
    rest, and the other modules that run alone last (short ones: by then no root test runs for
    them to wait on, nor any waits on them)."""
    alone = [m for m in modules if rank[m] == 0]
    free = [m for m in modules if rank[m] == 2]
    shared = [m for m in modules if rank[m] == 1]
    start = free[:2 * workers - 1] if alone else []
    return (alone[:1] + start + shared + [m for m in free if m not in start] + alone[1:])


#: The seconds a root test waited for its machine turn (``machine_turn``), by test id.
TURN_WAIT = "machine_turn_wait_s"
_turn_waits: dict[str, float] = {}
#: The CPU seconds a test's process and the children it waited for (pyinfra's runs, lxc-attach
#: and what it ran) used from its setup to its teardown: on 2 cores the suite is CPU-bound, so
#: a module's CPU, not its wall time, is what it costs the others. A container's own processes
#: (its systemd, a server) are no child of the test: not counted.
CPU_USED = "cpu_s"
_cpu_used: dict[str, float] = {}


def cpu_seconds() -> float:
    """This process's CPU seconds and its waited-for children's."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


#: When a test's setup began, in ``cpu_seconds``.
_CPU_AT = pytest.StashKey[float]()


def pytest_runtest_setup(item):
    item.stash[_CPU_AT] = cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _CPU_AT in item.stash:
        outcome.get_result().user_properties.append((CPU_USED, cpu_seconds() - item.stash[_CPU_AT]))


def pytest_runtest_logreport(report):
    _timed[module_of(report.nodeid)] = _timed.get(module_of(report.nodeid), 0.0) + report.duration
    if report.when == "setup":
        for name, value in report.user_properties:
            if name == TURN_WAIT:
                _turn_waits[report.nodeid] = value
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == CPU_USED:
                module = module_of(report.nodeid)
                _cpu_used[module] = _cpu_used.get(module, 0.0) + value


def pytest_sessionfinish(session, exitstatus):
    """The provisioned template destroyed once every worker is done with its copies; the
    whole run's module times, for the next run's order (not a worker's part, nor a run of a
    few files or of one tier, ``-m``, or a selection, ``-k``: those would forget the other
    modules, or time a module by part of its tests)."""
    if not hasattr(session.config, "workerinput"):
        provisioned.destroy_templates(provisioned.run_folder(session.config._tmp_path_factory))
    if hasattr(session.config, "workerinput") or session.config.args != ["tests"] \
            and session.config.args or session.config.option.markexpr \
            or session.config.option.keyword:
        return
    try:
        recorded = json.loads(MODULE_SECONDS.read_text())
    except (OSError, ValueError):
        recorded = {}
    recorded.update({module: round(seconds, 1) for module, seconds in _timed.items()})
    try:
        MODULE_SECONDS.parent.mkdir(parents=True, exist_ok=True)
        MODULE_SECONDS.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass  # a read-only cache: the order is only an optimisation


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A root test holds its turn of the machine (devtools/lxc_env.py ``machine_turn``) from
    its setup to its teardown: shared with the tests other pytest workers run
    (``make test``: pytest-xdist), alone where it is marked ``machine``."""
    if item.get_closest_marker("root") is None:
        yield
        return
    began = time.monotonic()
    with lxc_env_module.machine_turn(exclusive=item.get_closest_marker("machine") is not None):
        # What the wait cost is in no test's duration: kept for the run's summary.
        item.user_properties.append((TURN_WAIT, time.monotonic() - began))
        yield


@pytest.fixture(scope="session")
def pyinfra_cli(tmp_path_factory):
    """``pyinfra_cli(*args, env=...)``: the real ``pyinfra`` CLI in the repository, each run
    forked from one interpreter that imported it once (tests/cli_runs.py)."""
    from cli_runs import PyinfraCli

    cli = PyinfraCli(tmp_path_factory.mktemp("pyinfra-cli"))
    yield cli
    cli.close()


@pytest.fixture(scope="session")
def machine_alone(as_root) -> None:
    """The test changes what every test on this machine shares (it restarts lxc-net, or makes
    the deploy's own containers in /var/lib/lxc): it runs while no other root test runs."""


@pytest.fixture(scope="session")
def as_root() -> None:
    """Skip unless running as root (chroots, lxc-net, LXC containers)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")


@pytest.fixture(scope="session")
def package_index():
    """The test downloads from the package index: pip and uv started from now on retry
    (``RETRY_ENVIRONMENT``). Returns tests/wheels.py's ``retried(action, what)``, for a
    download of the test's own."""
    for name, value in RETRY_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    return wheels.retried


@pytest.fixture(scope="session")
def sglang_wheel(package_index):
    """``wheel(version) -> Path``: a real sglang wheel from the package index, downloaded once
    (with retries) into ``.cache/wheels`` and reused by every later run."""
    return wheels.wheel


@pytest.fixture(scope="session")
def pypi_wheel(package_index):
    """``project_wheel(project, version) -> Path``: another real wheel from the package index
    (uv's), for the containers' Python and platform, cached as ``sglang_wheel``'s."""
    return wheels.project_wheel


@pytest.fixture(scope="session")
def lxc_host(as_root) -> None:
    """Skip unless this machine can boot the LXC test containers (lxc, debootstrap, zstd)."""
    missing = lxc_env_module.missing_requirements()
    if missing:
        pytest.skip(f"LXC test environment needs: {', '.join(missing)}")


@pytest.fixture(scope="session")
def lxc_env(lxc_host):
    """The session's LXC environment; every container in it is destroyed at the end."""
    env = lxc_env_module.LxcEnv()
    try:
        yield env
    finally:
        env.close()


@pytest.fixture(scope="session")
def lxc_container(lxc_env):
    """A running Debian 12 container shared by the session (systemd as PID 1)."""
    container = lxc_env.create(lxc_env.new_name("main"))
    yield container
    container.destroy()


@pytest.fixture
def lxc_container_factory(lxc_env):
    """Make extra containers for one test: ``make(count=1, **create_kwargs) -> list``."""
    made: list[lxc_env_module.LxcContainer] = []

    def make(count: int = 1, **kwargs) -> list[lxc_env_module.LxcContainer]:
        new = [lxc_env.create(**kwargs) for _ in range(count)]
        made.extend(new)
        return new

    yield make
    for container in made:
        container.destroy()


@pytest.fixture(scope="session")
def deployed_copy(tmp_path_factory, lxc_host, sglang_wheel, pypi_wheel):
    """``copy(name) -> Deploy``: a container NAME deployed as ``Deploy`` deploys one, taken
    from the run's template (tests/provisioned.py); the caller destroys it."""
    return lambda name: provisioned.deployed_copy(tmp_path_factory, name, sglang_wheel, pypi_wheel)


def embedded_default_containers() -> list[tuple[Path, str]]:
    """(LXC path, name) of each container ``make deploy`` without a hosts file creates."""
    _, containers = build_groups(read_hosts_file(EMBEDDED_HOSTS_FILE))
    return [(Path(data["lxc_path"]), data["lxc_name"]) for _, data in containers]


@pytest.fixture(scope="module")
def deploy_namesakes(lxc_env, machine_alone):
    """``[(lxc_path, name)]`` of running containers named and placed as ``make deploy`` without
    a hosts file places its own, for a test that must hold whatever runs on this machine. A
    real one that runs is used as it is and left so; where there is none, a stand-in of the
    test rootfs takes its name until the module ends; a real one that does not run is left
    alone (never started, never touched) and is not listed."""
    made, running = [], []
    for lxc_path, name in embedded_default_containers():
        state = lxc_env_module.state_of(lxc_path, name)
        if state == "MISSING" and not (lxc_path / name).exists():
            made.append(lxc_env.create(name, lxc_path=lxc_path))
            state = "RUNNING"
        else:
            lxc_env_module.log(f"{lxc_path}/{name} exists ({state}), not made here: "
                               "left as it is")
        if state == "RUNNING":
            running.append((lxc_path, name))
    yield running
    for container in made:
        container.destroy()


def pytest_terminal_summary(terminalreporter):
    """Print the LXC environment's timings (rootfs build, base extract, boots, resets), and
    how long root tests waited for their machine turn (the exclusive ones block the others)."""
    if lxc_env_module.TIMINGS:
        terminalreporter.section("lxc test environment timings")
        for line in lxc_env_module.timing_lines():
            terminalreporter.write_line(line)
    if _cpu_used:
        most = sorted(_cpu_used.items(), key=lambda kv: -kv[1])[:12]
        terminalreporter.write_line(
            f"CPU seconds of the tests and their children: {sum(_cpu_used.values()):.0f} in all; "
            "the most: " + ", ".join(f"{module} {s:.0f}" for module, s in most))
    if _turn_waits:
        longest = sorted(_turn_waits.items(), key=lambda kv: -kv[1])[:3]
        terminalreporter.write_line(
            f"machine turns: {len(_turn_waits)} root tests waited {sum(_turn_waits.values()):.1f} s "
            "in all; the longest: " + ", ".join(f"{nodeid} {s:.1f} s" for nodeid, s in longest))


def hub_client_versions() -> list[str]:
    """The huggingface_hub release of each of the repository's locks, in the locks' order."""
    import re

    locks = sorted((Path(__file__).resolve().parents[1] / "group_data" / "locks").glob("sglang-*.txt"))
    return [re.search(r"^huggingface-hub==(\S+)", lock.read_text(), re.M).group(1) for lock in locks]


def hub_client_python(version: str, package_index) -> str:
    """A Python with huggingface_hub VERSION, in a venv made once and kept in the test cache."""
    venv = TEST_CACHE / f"hf-client-{version}"
    python = venv / "bin" / "python"
    with building(venv):
        if not (venv / "ok").exists():
            uv = Path(sys.executable).parent / "uv"
            subprocess.run([str(uv), "venv", "-q", "--python", "3.11", str(venv)], check=True)
            package_index(lambda: subprocess.run(
                [str(uv), "pip", "install", "-q", "--python", str(python),
                 f"huggingface_hub=={version}"], check=True), f"huggingface_hub {version}")
            (venv / "ok").write_text(version)
        bytecode(venv)
    return str(python)


@pytest.fixture(scope="session")
def hf_python(package_index) -> str:
    """A Python with the huggingface_hub the container's locked venv has (the repository's
    first lock), in a venv made once and kept in the test cache."""
    return hub_client_python(hub_client_versions()[0], package_index)


@pytest.fixture(scope="session")
def hf_clients(package_index) -> dict[str, str]:
    """``{version: python}``: a Python with each huggingface_hub release the repository's locks
    have (one that resumes a cut file, 0.36.2, and one that starts it again, 1.33)."""
    return {version: hub_client_python(version, package_index)
            for version in dict.fromkeys(hub_client_versions())}
