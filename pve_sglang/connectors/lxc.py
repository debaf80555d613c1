"""
The ``@lxc`` connector: run operations inside a plain LXC container with ``lxc-attach``.
"""

from __future__ import annotations

from collections.abc import Iterator

from typing_extensions import TypedDict, override

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import InventoryError
from pyinfra.connectors.base import DataMeta
from pyinfra.connectors.util import CommandOutput

from pve_sglang.connectors.container import CONTAINER_PATH, ContainerConnector, is_local_hostname, push_into_container


class LxcConnectorData(TypedDict, total=False):
    lxc_name: str
    lxc_path: str
    lxc_local: bool
    lxc_home: str
    ssh_hostname: str


lxc_data_meta: dict[str, DataMeta] = {
    "lxc_name": DataMeta("Name of the LXC container (``lxc-attach -n``)"),
    "lxc_path": DataMeta(
        "LXC path holding the container (``lxc-attach -P``); unset: the host's default "
        "(``/var/lib/lxc`` for root)",
    ),
    "lxc_local": DataMeta(
        "The container is on this machine: run ``lxc-*`` locally even if ``ssh_hostname`` is set",
        False,
    ),
    "lxc_home": DataMeta("HOME given to commands in the container", "/root"),
    "ssh_hostname": DataMeta(
        "Host the container lives on, reached over SSH (all ``ssh_*`` data apply); unset, "
        "``localhost`` or ``@local``: this machine",
    ),
}


class LxcConnector(ContainerConnector):
    """
    Run operations inside an LXC container, on this machine or on a host reached over SSH.

    .. code:: shell

        # A container on this machine (root's default LXC path, or lxc_path from host data)
        pyinfra @lxc/sglang deploy.py

        # A container on a remote host, through SSH as root
        pyinfra @lxc/gpu-host/sglang deploy.py

    Commands run as ``lxc-attach [-P LXC_PATH] -n NAME --clear-env -v PATH=... -v HOME=...
    -- sh -c '<command>'`` in ``/``. Files go in and out through ``lxc-attach`` with the host
    shell redirecting the attached ``cat``'s stdin or stdout from or to a host temporary file,
    so they are written by the container's own root (right owner in unprivileged containers
    too) and binary content is kept exactly.

    ``connect()`` does not touch the container; ``container_ready()`` asks ``lxc-info -s``.
    """

    container_kind = "LXC container"

    data_cls = LxcConnectorData
    data_meta = lxc_data_meta
    data: LxcConnectorData

    @override
    @staticmethod
    def make_names_data(name: str | None = None) -> Iterator[tuple[str, dict, list[str]]]:
        """``NAME`` (this machine) or ``HOST/NAME`` (over SSH)."""
        if not name:
            raise InventoryError("No LXC container name provided: use @lxc/NAME or @lxc/HOST/NAME")

        parts = name.split("/")
        if len(parts) == 1:
            (lxc_name,) = parts
            data: dict = {"lxc_name": lxc_name}
        elif len(parts) == 2:
            hostname, lxc_name = parts
            if not hostname:
                raise InventoryError(f"Empty host in @lxc/{name}")
            data = {"ssh_hostname": hostname, "lxc_name": lxc_name}
        else:
            raise InventoryError(f"Invalid @lxc target {name!r}: use @lxc/NAME or @lxc/HOST/NAME")

        if not lxc_name:
            raise InventoryError(f"Empty container name in @lxc/{name}")

        yield f"@lxc/{name}", data, ["@lxc"]

    def _name(self) -> str:
        name = self.data["lxc_name"]
        if not name:
            raise InventoryError(f"{self.host.name}: no lxc_name in host data")
        return name

    def _lxc_args(self) -> list[str | QuoteString]:
        args: list[str | QuoteString] = []
        if self.data["lxc_path"]:
            args.extend(["-P", QuoteString(self.data["lxc_path"])])
        args.extend(["-n", QuoteString(self._name())])
        return args

    @override
    def is_local(self) -> bool:
        return bool(self.data["lxc_local"]) or is_local_hostname(self.data["ssh_hostname"])

    @override
    def container_label(self) -> str:
        where = "this machine" if self.is_local() else self.data["ssh_hostname"]
        path = f", lxc path {self.data['lxc_path']}" if self.data["lxc_path"] else ""
        return f"{self.container_kind} {self._name()!r} ({where}{path})"

    def _attach(self) -> list[str | QuoteString]:
        return [
            "lxc-attach",
            *self._lxc_args(),
            "--clear-env",
            "-v",
            QuoteString(f"PATH={CONTAINER_PATH}"),
            "-v",
            QuoteString(f"HOME={self.data['lxc_home']}"),
            "--",
        ]

    @override
    def make_exec_command(self, inner: StringCommand) -> StringCommand:
        return StringCommand(*self._attach(), "sh", "-c", QuoteString(inner))

    @override
    def make_push_command(self, host_source: str, container_dest: str) -> StringCommand:
        return push_into_container(self._attach(), host_source, container_dest)

    @override
    def make_pull_command(self, container_source: str, host_dest: str) -> StringCommand:
        return StringCommand(
            *self._attach(),
            "sh",
            "-c",
            QuoteString('cat < "$1"'),
            "sh",
            QuoteString(container_source),
            ">",
            QuoteString(host_dest),
        )

    @override
    def make_rootfs_command(self) -> StringCommand | None:
        return StringCommand("lxc-info", *self._lxc_args(), "-c", "lxc.rootfs.path")

    @override
    def make_status_command(self) -> StringCommand:
        # 2>&1: "NAME doesn't exist" comes on stderr with exit status 1
        return StringCommand("lxc-info", *self._lxc_args(), "-s", "2>&1")

    @override
    def parse_state(self, status: bool, output: CommandOutput) -> str:
        for line in output.stdout_lines:
            if "doesn't exist" in line:
                return "missing"
            key, _, value = line.partition(":")
            if key.strip() == "State" and value.strip():
                return value.strip().lower()
        return "unknown" if status else f"unknown ({output.stdout.strip()})"
