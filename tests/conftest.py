"""
Shared pytest fixtures, and the test tiers they decide.

A test's tier follows from the fixtures it uses (directly or through other fixtures), never from
its name: ``lxc_host`` (and every fixture built on it: ``lxc_env``, ``lxc_container``) marks it
``lxc`` and ``root``, ``as_root`` marks it ``root``, ``sglang_wheel`` and ``package_index`` mark it
``network``. The fast tier is every other test:
``make test-fast`` (``pytest -m "not lxc and not root and not network"``).

LXC test environment (see devtools/lxc_env.py), all needing root, lxc, debootstrap and zstd:

+ ``lxc_env`` (session): the ``LxcEnv``: a private LXC path with the extracted Debian 12 base.
+ ``lxc_container`` (session): a running container (systemd up). Its ``name``, ``lxc_path``,
  ``inventory_name`` (``@lxc/NAME``) and ``host_data()`` (``lxc_name``, ``lxc_path``,
  ``lxc_local``) are what the ``@lxc`` connector needs.
+ ``lxc_container_factory`` (function): ``make(count=1, extra_config=(), start=True,
  cgroup="host", unprivileged=False)`` returns a list of new containers, destroyed when the
  test ends. ``cgroup="v2"`` starts one under a pure cgroup2 mount (``lxc.cgroup2.*`` rules
  apply); ``unprivileged=True`` maps its ids to 100000+ and gives it its own loopback-only
  network namespace.
"""

from __future__ import annotations

import pytest

import os

from devtools import lxc_env as lxc_env_module

import wheels

#: Fixture -> the markers a test that uses it gets (pyproject.toml registers them).
TIER_OF_FIXTURE: dict[str, tuple[str, ...]] = {
    "lxc_host": ("lxc", "root"),
    "as_root": ("root",),
    "sglang_wheel": ("network",),
    "package_index": ("network",),
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers set here
def pytest_collection_modifyitems(items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for name, markers in TIER_OF_FIXTURE.items():
            if name in used:
                for marker in markers:
                    item.add_marker(marker)


@pytest.fixture(scope="session")
def as_root() -> None:
    """Skip unless running as root (chroots, lxc-net, LXC containers)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")


@pytest.fixture(scope="session")
def sglang_wheel():
    """``wheel(version) -> Path``: a real sglang wheel from the package index, downloaded once
    into ``.cache/wheels`` and reused by every later run."""
    return wheels.wheel


@pytest.fixture(scope="session")
def package_index() -> None:
    """Taken by a test that asks the real package index itself (uv pip compile, pip download):
    it marks the test ``network``; uv and pip retry a slow answer themselves."""


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


def pytest_terminal_summary(terminalreporter):
    """Print the LXC environment's timings (rootfs build, base extract, boots, resets)."""
    if lxc_env_module.TIMINGS:
        terminalreporter.section("lxc test environment timings")
        for line in lxc_env_module.timing_lines():
            terminalreporter.write_line(line)
