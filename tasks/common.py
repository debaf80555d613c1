"""What the deploy's phases (``tasks/``) share: run in a container once it exists, what its
phases will read there, the GPU host's driver and GPUs, the container's key in its host's wheel
store, and the upload of the scripts that run in the container (``remote/``).

Called from deploy code (a ``@deploy`` function), with pyinfra's ``host`` the container.
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host, logger
from pyinfra.api import OperationError
from pyinfra.context import state
from pyinfra.operations import python

from pve_sglang import remote
from pve_sglang.config.settings import LxcView, ServerView, StackView
from pve_sglang.facts.one_read import Part
from pve_sglang.gpu.passthrough import select_gpus
from pve_sglang.operations import container_reads, paths
from pve_sglang.preflight import driver_and_gpus
from pve_sglang.server.unit_text import unit_name
from pve_sglang.stack import store_retention
from pve_sglang.stack.identity import settings_stack_path


def run_when_container_exists(steps: Callable[[], None], what: str,
                              planned: Callable[[], list[str]] | None = None) -> None:
    """Run STEPS now, or, when the container is created later in this run, once it runs.

    PLANNED says in words what STEPS will do, for the plan shown before the container exists.
    """
    ready = getattr(host.connector, "container_ready", None)
    # A container reached some other way (e.g. plain SSH into it) is there already.
    if ready is None or ready():
        steps()
        return
    plan = "".join(f"\n      - {step}" for step in planned()) if planned else ""
    logger.info(
        f"{host.name}: the container does not run yet (it is created or started earlier in "
        f"this run): the {what} steps run once it does{':' if plan else ''}{plan}"
    )

    def when_running() -> None:
        if not ready():
            raise OperationError(
                f"{host.name} is not running after the host phase (see its errors above): "
                f"the {what} steps did not run"
            )
        steps()

    python.call(name=f"{what.capitalize()} (after the container starts)", function=when_running)


def expect_container_reads(stack: StackView, server: ServerView) -> None:
    """Tell the container's reads what the container and verify phases' operations will ask for
    the settings' STACK and SERVER (paths aside: ``paths.watch``), so that the first ask of a
    run stage reads them all in one command (``container_reads.expect``)."""
    # The settings' stack, built beside the serving one (``venv_path`` links to it).
    stack_python = f"{settings_stack_path(host.name, stack)}/bin/python"
    parts = [(Part.DEBS, ()), (Part.UV, (container_reads.TOOLS_UV,)),
             (Part.VENV, (stack_python, remote.TOOLS)), (Part.UNIT, (unit_name(server),)),
             (Part.STACKS, server.stacks_at.read_args())]
    if host.data.get("platform") == "lxc":
        parts.append((Part.HOSTNAME, ()))
    container_reads.expect(parts)


def host_gpus() -> tuple[str | None, list[dict]]:
    """The container host's driver version and GPUs (facts of the Proxmox host), read once per
    run (``preflight.driver_and_gpus``): the host phase and every container of the host ask."""
    return driver_and_gpus(state.inventory.get_host(host.data.get("pve_host")))


def store_user_key(data=None) -> str:
    """The container's key in its host's wheel store: its vmid or its LXC name. DATA: a host's
    data (this host's when left out)."""
    data = data if data is not None else host.data
    platform = data.get("platform") or "pve"
    return store_retention.user_key(
        platform, data.get("pct_vmid") if platform == "pve" else data.get("lxc_name"))


def container_gpus(lxc: LxcView) -> tuple[str | None, list[dict]]:
    """The container host's driver version and the host's GPUs this container gets (its LXC
    keys' ``gpus``, ``gpu.passthrough.select_gpus``): none where the host has no NVIDIA
    driver."""
    driver, gpus = host_gpus()
    return driver, select_gpus(lxc.gpus, gpus, host.name) if driver else []


def upload_script(script: str, name: str, tools: str = remote.TOOLS):
    """Upload remote SCRIPT (``remote.GPU_CHECKS``, ...) to ``remote.path(SCRIPT, TOOLS)``, its
    companions (``remote.companions``, the modules it imports and theirs) first, beside it; the script's
    ``paths.put`` operation, so that the watched paths' one read answers it."""
    for companion in remote.companions(script):
        paths.put(name=f"{name}: {companion} beside it", src=str(remote.source(companion)),
                  dest=remote.path(companion, tools), mode="644")
    return paths.put(name=name, src=str(remote.source(script)), dest=remote.path(script, tools),
                     mode="644")
