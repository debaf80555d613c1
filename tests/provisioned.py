"""One container deployed as ``test_deploy_lxc``'s ``Deploy`` deploys it, once per run, for every
module that needs such a container but does not test the first deploy itself.

The first worker that asks deploys it (8 s), stops it and keeps it as the template; each module
then takes a copy of it (``lxc-copy``: 3 s), and the copy's first deploy run converges it on
its own hosts entry (name, hostname, address: about 1 s). A copy is a container of its own: a
test may change it as it likes.

A copy, not an overlay snapshot (``lxc-copy -s -B overlay``, 0.2 s): in an unprivileged
container an overlay over the template's rootfs cannot remove a folder of the lower layer
(``Input/output error`` where ``test_container_state_lxc`` renames sglang's dist-info).

The template lives in the run's folder, which every pytest-xdist worker shares; the run's end
(``destroy_templates``, from the controller's ``pytest_sessionfinish``) destroys it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cache_dir import building

#: The template container's name, and its folder under the run's.
TEMPLATE = "pvs-template"
#: Written once the template is deployed and stopped: it may be copied.
READY = "ready"


def run_folder(tmp_path_factory) -> Path:
    """The run's temporary folder, one for all its workers (a pytest-xdist worker's own is
    a folder in it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def _lxc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["lxc-" + args[0], *args[1:]], capture_output=True, text=True,
                          timeout=120)


def _template(root: Path, sglang_wheel, pypi_wheel) -> None:
    """Deploy the template into ROOT and stop it (call it under the template's lock)."""
    from test_deploy_lxc import Deploy, failed

    if (root / READY).exists():
        return
    if root.exists():
        pytest.fail(f"the provisioned template's deploy failed earlier in this run: {root}")
    template = Deploy(root, sglang_wheel, pypi_wheel, name=TEMPLATE)
    try:
        results, _ = template.run()
        assert failed(results) == []
        stopped = _lxc("stop", "-P", str(template.lxc_path), "-n", TEMPLATE)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        # Stopped for good: its address is free for others (a copy takes one of its own).
        template.release_address()
    (root / READY).write_text("deployed and stopped\n")


def deployed_copy(tmp_path_factory, name: str, sglang_wheel, pypi_wheel):
    """A new container NAME deployed as ``Deploy`` deploys one: a copy of the run's template
    (deployed first if no worker has), converged by one deploy run."""
    from test_deploy_lxc import Deploy, failed

    root = run_folder(tmp_path_factory) / TEMPLATE
    deploy = Deploy(tmp_path_factory.mktemp(name), sglang_wheel, pypi_wheel, name=name,
                    files_of=root)
    with building(root):
        _template(root, sglang_wheel, pypi_wheel)
    copied = _lxc("copy", "-P", str(root / "lxc"), "-n", TEMPLATE, "-p", str(deploy.lxc_path),
                  "-N", name)
    assert copied.returncode == 0, copied.stderr
    results, _ = deploy.run()
    assert failed(results) == [], results
    return deploy


def destroy_templates(run: Path) -> None:
    """Destroy the run's template, if one was made."""
    root = run / TEMPLATE
    if not (root / "lxc" / TEMPLATE).exists():
        return
    _lxc("stop", "-P", str(root / "lxc"), "-n", TEMPLATE, "-k")
    _lxc("destroy", "-P", str(root / "lxc"), "-n", TEMPLATE)
