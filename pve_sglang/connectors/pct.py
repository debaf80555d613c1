"""
The ``@pct`` connector: run operations inside a Proxmox VE container with ``pct``.
"""

from __future__ import annotations

from collections.abc import Iterator

from typing_extensions import TypedDict, override

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import ConnectorDataTypeError, InventoryError
from pyinfra.connectors.base import DataMeta
from pyinfra.connectors.util import CommandOutput

from pve_sglang.connectors.container import (
    CONTAINER_PATH,
    ContainerConnector,
    is_local_hostname,
    push_into_container,
)
from pve_sglang.pve_releases import (
    VERSION_COMMAND,
    answer_problem,
    parse_dpkg_version,
    pct_exec_words,
    version_problem,
)

#: Proxmox VE's VMID range, the one home of it (settings import it): ``pve-vmid`` in pve-common's
#: src/PVE/JSONSchema.pm accepts ``^[1-9][0-9]{2,8}$``, i.e. 100..999999999.
VMID_MIN = 100
VMID_MAX = 999_999_999


class PctConnectorData(TypedDict, total=False):
    pct_vmid: int
    pct_local: bool
    pct_pve_container: str
    ssh_hostname: str


pct_data_meta: dict[str, DataMeta] = {
    "pct_vmid": DataMeta("VMID of the container (100 - 999999999)"),
    "pct_local": DataMeta(
        "The Proxmox host is this machine: run ``pct`` locally even if ``ssh_hostname`` is set",
        False,
    ),
    "pct_pve_container": DataMeta(
        "pve-container version of the Proxmox host (``5.0.8``), which decides how ``pct exec`` "
        "gets a clean environment; unset: read once from the host with dpkg-query",
    ),
    "ssh_hostname": DataMeta(
        "Proxmox host, reached over SSH as root (all ``ssh_*`` data apply); unset, "
        "``localhost`` or ``@local``: this machine",
    ),
}


def parse_vmid(value: str) -> int:
    """Parse and range-check a VMID, raising ``InventoryError``."""
    try:
        vmid = int(value)
    except ValueError:
        raise InventoryError(f"Invalid Proxmox VMID {value!r}: not a number") from None
    if not VMID_MIN <= vmid <= VMID_MAX or str(vmid) != value.strip():
        raise InventoryError(f"Invalid Proxmox VMID {value!r}: use {VMID_MIN}-{VMID_MAX}")
    return vmid


class PctConnector(ContainerConnector):
    """
    Run operations inside a Proxmox VE LXC container with ``pct``, over SSH to the Proxmox host
    (as root: only root may run ``pct exec``) or locally on it.

    .. code:: shell

        # Container 105 on Proxmox host pve1
        pyinfra @pct/pve1/105 deploy.py

        # On the Proxmox host itself
        pyinfra @pct/localhost/105 deploy.py

    Commands run as ``pct exec VMID --keep-env 0 -- sh -c '<command>'`` in ``/``; files go in
    with ``pct exec VMID --keep-env 0 -- sh -c PUSH_SCRIPT sh DST SIZE < TMP`` (a complete
    file renamed into place, see ``container.PUSH_SCRIPT``) and out with ``pct pull VMID SRC
    TMP`` through a private temporary directory on the host, which is removed afterwards.
    ``pct exec`` before pve-container 5.0.9 has no ``--keep-env`` (and passes the host's
    environment in): there, and when the version cannot be read, commands run as ``pct exec
    VMID -- env -i PATH=... sh -c '<command>'`` (``pve_releases.pct_exec_words``). The version
    is read once per connector from the host (``pct_pve_container`` overrides it).

    ``connect()`` does not touch the container; ``container_ready()`` asks ``pct status``.
    """

    container_kind = "Proxmox container"

    data_cls = PctConnectorData
    data_meta = pct_data_meta
    data: PctConnectorData

    @override
    @staticmethod
    def make_names_data(name: str | None = None) -> Iterator[tuple[str, dict, list[str]]]:
        """``HOST/VMID`` (``HOST`` ``localhost`` or ``@local``: this machine) or ``VMID``."""
        if not name:
            raise InventoryError("No Proxmox container provided: use @pct/HOST/VMID")

        parts = name.split("/")
        if len(parts) == 1:
            data: dict = {"pct_vmid": parse_vmid(parts[0])}
        elif len(parts) == 2:
            hostname, vmid = parts
            if not hostname:
                raise InventoryError(f"Empty host in @pct/{name}")
            data = {"ssh_hostname": hostname, "pct_vmid": parse_vmid(vmid)}
        else:
            raise InventoryError(f"Invalid @pct target {name!r}: use @pct/HOST/VMID")

        yield f"@pct/{name}", data, ["@pct"]

    def __init__(self, state, host):
        super().__init__(state, host)
        self._version: str | None = None
        self._version_known = False
        # As the hosts file refuses it, for a target given on the command line (``pyinfra
        # @pct/HOST/VMID --data pct_pve_container=...``): before connecting, not as a bare
        # ValueError from the rules at the first command.
        given = self.data.get("pct_pve_container")
        problem = version_problem(given) if given else None
        if problem:
            raise ConnectorDataTypeError(f"{host.name}: field 'pct_pve_container' = {given!r}: "
                                         f"{problem}")

    def _vmid(self) -> str:
        vmid = self.data["pct_vmid"]
        if vmid is None:
            raise InventoryError(f"{self.host.name}: no pct_vmid in host data")
        return str(vmid)

    @override
    def is_local(self) -> bool:
        return bool(self.data["pct_local"]) or is_local_hostname(self.data["ssh_hostname"])

    @override
    def container_label(self) -> str:
        where = "this machine" if self.is_local() else self.data["ssh_hostname"]
        return f"{self.container_kind} {self._vmid()} ({where})"

    def pve_container(self) -> str | None:
        """The host's pve-container version (None: not installed or not readable), read once."""
        if not self._version_known:
            version = self.data.get("pct_pve_container")
            if not version:
                status, output = self.outer.run_shell_command(
                    StringCommand(VERSION_COMMAND), print_output=False, print_input=False)
                version = parse_dpkg_version(output.stdout_lines) if status else None
                problem = answer_problem(version) if version else None
                if problem:
                    # The form without --keep-env runs on every release: taken, and said.
                    logger.warning(f"{self.host.name}: `{VERSION_COMMAND}` answered pve-container "
                                   f"version {version!r}: {problem}; running commands as on a "
                                   "pct without --keep-env (env -i inside)")
                    version = None
            self._version, self._version_known = version, True
        return self._version

    def _exec_words(self) -> list[str]:
        return pct_exec_words(self._vmid(), self.pve_container(), CONTAINER_PATH)

    @override
    def make_exec_command(self, inner: StringCommand) -> StringCommand:
        return StringCommand(*self._exec_words(), "sh", "-c", QuoteString(inner))

    @override
    def make_push_command(self, host_source: str, container_dest: str) -> StringCommand:
        # Not `pct push`: it writes the destination in place (a cut transfer leaves part of
        # the file) and gives a new file its mode once the content is there.
        return push_into_container(self._exec_words(), host_source, container_dest)

    @override
    def make_pull_command(self, container_source: str, host_dest: str) -> StringCommand:
        return StringCommand(
            "pct", "pull", self._vmid(), QuoteString(container_source), QuoteString(host_dest)
        )

    @override
    def make_status_command(self) -> StringCommand:
        # 2>&1: a missing container is reported on stderr ("Configuration file ... does not exist")
        return StringCommand("pct", "status", self._vmid(), "2>&1")

    @override
    def parse_state(self, status: bool, output: CommandOutput) -> str:
        for line in output.stdout_lines:
            key, _, value = line.partition(":")
            if key.strip() == "status" and value.strip():
                return value.strip().lower()
        text = output.stdout.strip()
        if "does not exist" in text:
            return "missing"
        return f"unknown ({text})" if text else "unknown"
