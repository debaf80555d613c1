"""One deployed container per test run, copied for each module that needs one.

The whole deploy into a new container takes minutes; test_deploy_lxc, test_container_state_lxc
and test_faults_lxc each needed one in the state a first run leaves. The first worker to ask
deploys the template once (its first run's results kept for test_deploy_lxc to assert on), stops
it, and every module gets its own ``lxc-copy`` of it at an address of its own: a module changes its
copy, never the template. The run's controller destroys the template at the end
(``destroy_template``).
"""

from __future__ import annotations

import fcntl
import json
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from test_deploy_lxc import Deploy, failed

TEMPLATE = "pvs-provisioned"
FOLDER = "provisioned"
FIRST_RUN = "first-run.json"


@dataclass
class Template:
    """The stopped, deployed container and what its first run said."""

    root: Path
    results: dict
    log: str

    @property
    def lxc_path(self) -> Path:
        return self.root / "lxc"

    @property
    def config(self) -> Path:
        return self.lxc_path / TEMPLATE / "config"


def run_folder(basetemp: Path) -> Path:
    """The folder of the whole run: a pytest-xdist worker's basetemp is ``popen-gwN`` in it."""
    return basetemp.parent if basetemp.name.startswith("popen-gw") else basetemp


@contextmanager
def _alone(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def template(run: Path, sglang_wheel, pypi_wheel) -> Template:
    """The run's template, deployed by the first caller of any worker."""
    folder = run / FOLDER
    with _alone(folder):
        record = folder / FIRST_RUN
        if record.exists():
            kept = json.loads(record.read_text())
            return Template(folder, kept["results"], kept["log"])
        deploy = Deploy(folder, sglang_wheel, pypi_wheel, name=TEMPLATE)
        try:
            results, log = deploy.run()
            assert failed(results) == [], log[-3000:]
            subprocess.run(["lxc-stop", "-P", str(deploy.lxc_path), "-n", TEMPLATE, "-t", "60"],
                           check=True, capture_output=True)
        except BaseException:
            deploy.destroy()
            raise
        finally:
            deploy._address_lock.close()  # stopped: its copies take addresses of their own
        record.write_text(json.dumps({"results": results, "log": log}))
        return Template(folder, results, log)


def copy_of(template: Template, root: Path, name: str, sglang_wheel, pypi_wheel) -> Deploy:
    """A running copy of TEMPLATE named NAME under ROOT, as a Deploy of its own whose next run
    finds nothing to change: the template's files mounted, its address replaced by the copy's."""
    deploy = Deploy(root, sglang_wheel, pypi_wheel, name=name, files_of=template.root)
    with _alone(template.root):
        subprocess.run(["lxc-copy", "-P", str(template.lxc_path), "-n", TEMPLATE,
                        "-p", str(deploy.lxc_path), "-N", name], check=True, capture_output=True)
    config = deploy.lxc_path / name / "config"
    lines = [f"lxc.net.0.ipv4.address = {deploy.address}" if _key(line) == "lxc.net.0.ipv4.address"
             else line for line in config.read_text().splitlines()]
    config.write_text("\n".join(lines) + "\n")
    subprocess.run(["lxc-start", "-P", str(deploy.lxc_path), "-n", name], check=True,
                   capture_output=True)
    # Up as the deploy finds a container it started: systemd done booting (degraded is fine).
    deploy.attach("systemctl is-system-running --wait >/dev/null || true")
    return deploy


def _key(line: str) -> str:
    return line.partition("=")[0].strip()


def destroy_template(run: Path) -> None:
    """Remove the run's template, if one was made (the run's controller, at its end)."""
    lxc_path = run / FOLDER / "lxc"
    if (lxc_path / TEMPLATE).exists():
        subprocess.run(["lxc-stop", "-P", str(lxc_path), "-n", TEMPLATE, "-k"],
                       capture_output=True)
        subprocess.run(["lxc-destroy", "-P", str(lxc_path), "-n", TEMPLATE], capture_output=True)
