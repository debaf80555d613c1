"""
Shared core of the ``@pct`` and ``@lxc`` connectors.

A container connector runs nothing itself: it wraps an *outer* connector that reaches the machine
the container lives on (pyinfra's ``SSHConnector`` for a remote host, ``LocalConnector`` when the
container is on this machine) and turns every operation into a host-side command:

+ commands: the inner command is built with pyinfra's ``make_unix_command_for_host`` (so ``_sudo``,
  ``_su_user``, ``_env``, ``_chdir``, ``_shell_executable`` apply *inside* the container) and handed
  to a container exec tool (``pct exec``, ``lxc-attach``); the control arguments (``_timeout``,
  ``_stdin``, ``_get_pty``, ``_success_exit_codes``) go to the outer run;
+ uploads: the data goes to a private temporary directory on the host, then a host-side command
  copies it into the container (into a temporary file beside the destination, renamed over it
  once complete: ``PUSH_SCRIPT``), and the temporary directory is removed;
+ downloads: a host-side command copies the file out of the container into such a temporary
  directory, the outer connector fetches it, and the directory is removed.

Subclasses say how to wrap a command, how to push and pull a file, and how to ask whether the
container runs. Authentication arguments (``_sudo`` ...) do not apply to file transfers: files are
written and read as the container's root user, as ``pct pull`` does.

Connecting is lazy: ``connect()`` connects the outer connector only and never touches the
container, because a deploy may create and start the container earlier in the same run. Use
``container_ready()`` to ask whether it exists and runs.
"""

from __future__ import annotations

import abc
import shutil
import tempfile
from io import IOBase
from typing import TYPE_CHECKING, ClassVar

from typing_extensions import Unpack, override

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.util import get_file_io
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import (
    CommandOutput,
    extract_control_arguments,
    make_unix_command_for_host,
)

if TYPE_CHECKING:
    from pyinfra.api.arguments import ConnectorArguments
    from pyinfra.api.host import Host
    from pyinfra.api.state import State

#: Host names that mean "this machine": the outer connector is then ``LocalConnector``. The one
#: home of these names: the hosts file reads them too (``local`` is the embedded host's name).
LOCAL_HOSTNAMES = frozenset({"localhost", "@local", "local"})

#: The PATH given to commands run through an exec tool that clears the environment.
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Written beside a destination while its content arrives (``PUSH_SCRIPT``), then renamed.
PUSH_TEMP_INFIX = ".upload-"

#: Run in the container with the destination as $1, the content's size in bytes as $2 and the
#: content on stdin: the content goes to a temporary file beside it, made 0600 before a byte
#: arrives, that takes the destination's owner and mode (0644 for a new file) and, once all
#: $2 bytes are there, is renamed over it. A transfer cut short (killed, or a stream that ends
#: early) leaves the destination as it was, never part of the new content. A link is written
#: through, as ``cat > LINK`` does; a temporary file a killed push left goes at the next push.
PUSH_SCRIPT = (
    'umask 077; d=$1; [ -L "$d" ] && d=$(readlink -f -- "$d"); '
    'if [ -d "$d" ]; then echo "$d: is a directory" >&2; exit 1; fi; '
    f'p="$(dirname -- "$d")/.$(basename -- "$d"){PUSH_TEMP_INFIX}"; rm -f -- "$p"??????; '
    't=$(mktemp -- "${p}XXXXXX") || exit 1; '
    "trap 'rm -f -- \"$t\"' EXIT; trap 'exit 1' HUP INT PIPE TERM; "
    'cat > "$t" || exit 1; '
    'n=$(wc -c < "$t"); if [ "$n" -ne "$2" ]; then echo "$d: $n of $2 bytes came" >&2; exit 1; fi; '
    'if [ -e "$d" ]; then chown --reference="$d" -- "$t" && chmod --reference="$d" -- "$t"; '
    'else chmod 644 -- "$t"; fi || exit 1; '
    'mv -f -- "$t" "$d"'
)


def push_into_container(exec_prefix: list, host_source: str, container_dest: str) -> StringCommand:
    """The host-side command that runs ``PUSH_SCRIPT`` through EXEC_PREFIX (an exec tool's
    words, ending with ``--``) with HOST_SOURCE on its stdin and its size, measured on the
    host, as the size to expect: one command, as a copy tool's."""
    source = QuoteString(host_source)
    size = StringCommand('"$(wc -c <', source, ')"')
    return StringCommand(*exec_prefix, "sh", "-c", QuoteString(PUSH_SCRIPT), "sh",
                         QuoteString(container_dest), size, "<", source)


class ContainerNotRunningError(OSError):
    """
    Raised when a command or file transfer targets a container that does not exist or is not
    running. It is an ``OSError`` so that pyinfra reports it as a failed command of that host
    (operations and facts catch ``OSError``) instead of crashing the run.
    """


def is_local_hostname(hostname: str | None) -> bool:
    """True when ``hostname`` names this machine (or is unset)."""
    return not hostname or hostname in LOCAL_HOSTNAMES


class ContainerConnector(BaseConnector, abc.ABC):
    """
    Base class for connectors that run operations inside a container through an outer
    connector on the container's host. Not a connector of its own (no entry point).
    """

    handles_execution = True

    #: Short word for messages, e.g. ``"LXC container"``.
    container_kind: ClassVar[str] = "container"

    outer: BaseConnector

    def __init__(self, state: State, host: Host):
        super().__init__(state, host)
        outer_cls = LocalConnector if self.is_local() else SSHConnector
        self.outer = outer_cls(state, host)
        self._ready = False

    # Hooks for subclasses
    #

    @abc.abstractmethod
    def is_local(self) -> bool:
        """Whether the container lives on this machine (outer connector: ``LocalConnector``)."""

    @abc.abstractmethod
    def container_label(self) -> str:
        """Human description of the container for messages, e.g. ``LXC container 'x' on h``."""

    @abc.abstractmethod
    def make_exec_command(self, inner: StringCommand) -> StringCommand:
        """The host-side command that runs the (already shell-wrapped) ``inner`` command."""

    @abc.abstractmethod
    def make_push_command(self, host_source: str, container_dest: str) -> StringCommand:
        """The host-side command that copies host file ``host_source`` to ``container_dest``."""

    @abc.abstractmethod
    def make_pull_command(self, container_source: str, host_dest: str) -> StringCommand:
        """The host-side command that copies ``container_source`` to host file ``host_dest``."""

    def make_rootfs_command(self) -> StringCommand | None:
        """The host-side command that prints ``lxc.rootfs.path = [dir:]<folder>``: where the
        container's root filesystem is a folder of the host (LXC's ``dir`` backend). None where
        the tool has no such answer (the layer is then copied out through the exec tool)."""
        return None

    @abc.abstractmethod
    def make_status_command(self) -> StringCommand:
        """The host-side command that prints the container's state."""

    @abc.abstractmethod
    def parse_state(self, status: bool, output: CommandOutput) -> str:
        """
        Turn the result of ``make_status_command`` into a lower-case state word: ``"running"``
        when the container runs, otherwise e.g. ``"stopped"`` or ``"missing"``.
        """

    # Connection
    #

    @override
    def connect(self) -> None:
        """Connect the outer connector only: the container may not exist yet."""
        self.outer.connect()

    @override
    def disconnect(self) -> None:
        self.outer.disconnect()

    # Container state
    #

    def container_state(self) -> str:
        """Ask the host for the container's current state (never cached)."""
        status, output = self.outer.run_shell_command(
            self.make_status_command(), print_output=False, print_input=False)
        state = self.parse_state(status, output)
        logger.debug("%s state: %s", self.container_label(), state)
        return state

    def container_ready(self) -> bool:
        """
        Whether the container exists and runs. A True answer is cached for the connector's
        life; False is asked again next time (the deploy may be about to start it).
        """
        if not self._ready:
            self._ready = self.container_state() == "running"
        return self._ready

    def _not_running_error(self, state: str) -> ContainerNotRunningError:
        return ContainerNotRunningError(
            f"{self.container_label()} is not running (state: {state}): "
            "create and start it before running commands in it",
        )

    def _require_running(self) -> None:
        if self._ready:
            return
        state = self.container_state()
        if state != "running":
            raise self._not_running_error(state)
        self._ready = True

    def _raise_if_stopped(self) -> None:
        """After a failure: tell a container that went away from a failing command."""
        state = self.container_state()
        if state != "running":
            self._ready = False
            raise self._not_running_error(state)

    # Commands
    #

    def _run_on_host(
        self,
        command: StringCommand,
        print_output: bool = False,
        print_input: bool = False,
        **control_arguments,
    ) -> tuple[bool, CommandOutput]:
        # Start container commands in a fixed directory: exec tools keep the caller's working
        # directory when it exists in the container, which would depend on where pyinfra runs.
        host_command = StringCommand("cd", "/", "&&", command)
        return self.outer.run_shell_command(
            host_command,
            print_output=print_output,
            print_input=print_input,
            **control_arguments,
        )

    def run_on_host(self, command: StringCommand) -> tuple[bool, CommandOutput]:
        """Run COMMAND on the container's host (not in the container), e.g. a pipe from
        ``make_exec_command`` into a host-side tool."""
        return self._run_on_host(command)

    @override
    def run_shell_command(
        self,
        command: StringCommand,
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Unpack[ConnectorArguments],
    ) -> tuple[bool, CommandOutput]:
        """
        Run ``command`` inside the container. Raises ``ContainerNotRunningError`` when the
        container does not exist or is not running.
        """
        self._require_running()

        control_arguments = extract_control_arguments(arguments)
        inner = make_unix_command_for_host(self.state, self.host, command, **arguments)
        wrapped = self.make_exec_command(inner)

        logger.debug("--> Running command in %s: %s", self.container_label(), inner)

        status, output = self._run_on_host(
            wrapped,
            print_output=print_output,
            print_input=print_input,
            **control_arguments,
        )
        if not status:
            self._raise_if_stopped()
        return status, output

    # Files
    #

    def _make_host_temp_dir(self) -> str:
        if self.is_local():
            return tempfile.mkdtemp(prefix="pyinfra-container-")

        status, output = self.outer.run_shell_command(
            StringCommand("mktemp", "-d", "-t", "pyinfra-container-XXXXXXXXXX"),
            print_output=False, print_input=False,
        )
        if not status or not output.stdout_lines:
            raise OSError(f"Could not make a temporary directory on the host: {output.stderr}")
        return output.stdout_lines[-1].strip()

    def _remove_host_temp_dir(self, path: str) -> None:
        if self.is_local():
            shutil.rmtree(path, ignore_errors=True)
            return

        status, output = self.outer.run_shell_command(
            StringCommand("rm", "-rf", QuoteString(path)),
            print_output=False, print_input=False,
        )
        if not status:
            logger.warning(f"Could not remove temporary directory {path} on the host: {output}")

    @override
    def put_file(
        self,
        filename_or_io: str | IOBase,
        remote_filename: str,
        remote_temp_filename: str | None = None,  # ignored: a private host temp dir is used
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Unpack[ConnectorArguments],  # ignored: files are written as container root
    ) -> bool:
        """
        Upload a local file or IO object to ``remote_filename`` in the container, byte for byte.
        A new file gets mode 0644, an existing file keeps its mode and owner. The file changes
        at once (renamed into place, ``PUSH_SCRIPT``): a cut transfer leaves it as it was.
        """
        self._require_running()

        temp_dir = self._make_host_temp_dir()
        host_temp = f"{temp_dir}/upload"
        try:
            if self.is_local():
                # ignored: pyinfra types the connector's argument IOBase, its get_file_io IO (the same objects).
                with get_file_io(filename_or_io) as file_io, open(host_temp, "wb") as temp_f:  # type: ignore[arg-type]
                    data = file_io.read()
                    if isinstance(data, str):
                        data = data.encode()
                    temp_f.write(data)
            elif not self.outer.put_file(filename_or_io, host_temp):
                raise OSError(f"Failed to upload {remote_filename} to the host")

            status, output = self._run_on_host(
                self.make_push_command(host_temp, remote_filename),
                print_output=print_output,
                print_input=print_input,
            )
        finally:
            self._remove_host_temp_dir(temp_dir)

        if not status:
            self._raise_if_stopped()
            raise OSError(f"Failed to copy {remote_filename} into the container: {output.stderr}")

        if print_output:
            logger.info(f"{self.host.print_prefix}file uploaded to container: {remote_filename}")
        return True

    @override
    def get_file(
        self,
        remote_filename: str,
        filename_or_io: str | IOBase,
        remote_temp_filename: str | None = None,  # ignored: a private host temp dir is used
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Unpack[ConnectorArguments],  # ignored: files are read as container root
    ) -> bool:
        """Download ``remote_filename`` from the container into a local file or IO object."""
        self._require_running()

        temp_dir = self._make_host_temp_dir()
        host_temp = f"{temp_dir}/download"
        try:
            status, output = self._run_on_host(
                self.make_pull_command(remote_filename, host_temp),
                print_output=print_output,
                print_input=print_input,
            )
            if status:
                if self.is_local():
                    with open(host_temp, "rb") as temp_f:
                        # ignored: pyinfra's IOBase against its get_file_io's IO, as in put_file.
                        with get_file_io(filename_or_io, "wb") as file_io:  # type: ignore[arg-type]
                            shutil.copyfileobj(temp_f, file_io)
                elif not self.outer.get_file(host_temp, filename_or_io):
                    raise OSError(f"Failed to download {remote_filename} from the host")
        finally:
            self._remove_host_temp_dir(temp_dir)

        if not status:
            self._raise_if_stopped()
            raise OSError(f"Failed to copy {remote_filename} out of the container: {output.stderr}")

        if print_output:
            logger.info(f"{self.host.print_prefix}file downloaded from container: {remote_filename}")
        return True

