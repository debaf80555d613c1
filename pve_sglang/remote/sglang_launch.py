"""Start a Python server module with secrets from the environment, never on a command line.

Usage (the ExecStart of the SGLang unit, run by the venv's Python)::

    python sglang_launch.py [--arg-from-env=FLAG=VAR]... [--mask-env=VAR]... -m MODULE [ARG]...

SGLang reads its API key only from ``--api-key`` and logs its whole ServerArgs (key included) at
start. So this launcher, with the standard library only:

+ reads each VAR (the unit's 0600 EnvironmentFile) and refuses to start, exit 78 (EX_CONFIG),
  when one is empty or unset: ``--api-key ""`` would serve without a key;
+ forks; the child points fds 1 and 2 at a pipe and runs MODULE in-process (``runpy``, as
  ``python -m`` does) with ``FLAG VALUE`` appended to ``sys.argv``. ``sys.argv`` is not
  ``/proc/PID/cmdline``, and multiprocessing's spawn children receive it through a pipe, so no
  process of the unit has a secret in its argv;
+ the parent (the unit's main process) copies the pipe to its own stdout (the journal),
  replacing every value of a VAR (and its ``repr``/JSON spellings) with ``<hidden VAR>``. Every
  process the child starts inherits the pipe: prints, log records and tracebacks of all ranks
  pass the mask. The parent ignores SIGTERM and SIGINT (systemd's ``KillMode=control-group``
  signals the child itself) and ends as the child did: its exit code, or the same signal, so
  ``Restart=on-failure`` and a clean ``systemctl stop`` keep their meaning.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import sys
import time

ARG_FROM_ENV = "--arg-from-env="
MASK_ENV = "--mask-env="
EX_USAGE = 64
EX_CONFIG = 78
# An unfinished line longer than this is passed on (less a secret's length) instead of waiting.
MAX_LINE = 64 * 1024
# Seconds to keep copying output once the child has exited (its children may still write).
DRAIN_S = 5.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class UsageError(Exception):
    """A bad launcher command line or environment; the message names no secret value."""

    def __init__(self, message: str, code: int = EX_USAGE):
        super().__init__(message)
        self.code = code


def parse(argv: list[str]) -> tuple[list[tuple[str, str]], list[str], str, list[str]]:
    """``(flag, VAR)`` pairs, mask VARs, the module and its arguments, from the launcher's argv."""
    from_env, masks = [], []
    args = list(argv)
    while args and args[0] != "-m":
        option = args.pop(0)
        if option.startswith(ARG_FROM_ENV):
            flag, sep, name = option[len(ARG_FROM_ENV):].rpartition("=")
            if not sep or not flag.startswith("-") or not name.isidentifier():
                raise UsageError(f"{option}: expected {ARG_FROM_ENV}FLAG=VAR")
            from_env.append((flag, name))
        elif option.startswith(MASK_ENV) and option[len(MASK_ENV):].isidentifier():
            masks.append(option[len(MASK_ENV):])
        else:
            raise UsageError(f"unknown launcher option {option!r} (expected {ARG_FROM_ENV}FLAG=VAR, "
                             f"{MASK_ENV}VAR or -m MODULE)")
    if len(args) < 2:
        raise UsageError("missing -m MODULE")
    return from_env, masks, args[1], args[2:]


def secret_values(from_env: list[tuple[str, str]], masks: list[str],
                  environ: dict[str, str]) -> dict[str, str]:
    """``{VAR: value}`` of every secret; an empty or unset VAR of a flag is an error."""
    values = {}
    for flag, name in from_env:
        if not environ.get(name):
            raise UsageError(f"{name} is empty or unset in the environment (the unit's "
                             f"EnvironmentFile): refusing to start without {flag}", EX_CONFIG)
        values[name] = environ[name]
    for name in masks:
        if environ.get(name):
            values[name] = environ[name]
    return values


def mask_table(secrets: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """``(spelling, replacement)`` pairs, longest first: each value as written, in a Python
    ``repr`` (a ``'`` or ``\\`` in it is escaped there) and in JSON."""
    table: dict[bytes, bytes] = {}
    for name, value in secrets.items():
        for spelling in (value, repr(value)[1:-1], json.dumps(value)[1:-1]):
            if spelling:
                table.setdefault(spelling.encode("utf-8", "surrogateescape"), f"<hidden {name}>".encode())
    return sorted(table.items(), key=lambda item: -len(item[0]))


def mask(data: bytes, table: list[tuple[bytes, bytes]]) -> bytes:
    """DATA with every spelling in TABLE replaced."""
    for spelling, replacement in table:
        data = data.replace(spelling, replacement)
    return data


def mask_text(text: str, secrets: dict[str, str]) -> str:
    """TEXT with every secret value replaced by ``<hidden NAME>`` (for output read elsewhere)."""
    return mask(text.encode("utf-8", "surrogateescape"), mask_table(secrets)).decode("utf-8", "surrogateescape")


def _split(buffer: bytes, longest: int, final: bool) -> tuple[bytes, bytes]:
    """(what can be written now, what to keep): whole lines; a very long unfinished line less
    the last ``longest - 1`` bytes, where a secret may continue in the next read."""
    if final:
        return buffer, b""
    cut = max(buffer.rfind(b"\n"), buffer.rfind(b"\r")) + 1
    if cut == 0 and len(buffer) > MAX_LINE:
        cut = len(buffer) - max(longest - 1, 0)
    return buffer[:cut], buffer[cut:]


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except BrokenPipeError:
            return


def relay(read_fd: int, out_fd: int, table: list[tuple[bytes, bytes]], child: int) -> int:
    """Copy READ_FD to OUT_FD through the mask until the child has exited and its output is
    drained (EOF, or DRAIN_S seconds later); return the child's wait status."""
    longest = max((len(spelling) for spelling, _ in table), default=1)
    buffer = b""
    status = None
    deadline = None
    while True:
        if status is None:
            pid, wait_status = os.waitpid(child, os.WNOHANG)
            if pid == child:
                status = wait_status
                deadline = time.monotonic() + DRAIN_S
        timeout = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            ready, _, _ = select.select([read_fd], [], [], timeout)
        except InterruptedError:
            continue
        data = os.read(read_fd, 65536) if ready else b""
        eof = bool(ready) and not data
        buffer += data
        # Masked before splitting, so no cut falls inside a secret that is all in the buffer.
        buffer = mask(buffer, table)
        done = eof or (deadline is not None and time.monotonic() >= deadline)
        out, buffer = _split(buffer, longest, final=done)
        _write_all(out_fd, out)
        if done:
            if status is None:
                _, status = os.waitpid(child, 0)
            return status


def _run_child(write_fd: int, module: str, args: list[str],
               from_env: list[tuple[str, str]], secrets: dict[str, str]) -> None:
    """In the forked child: output into the pipe, the secret flags appended, MODULE as __main__."""
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    for flag, name in from_env:
        args += [flag, secrets[name]]
        # The value now lives in sys.argv; the server's own children need not inherit it.
        os.environ.pop(name, None)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _end_like(status: int) -> int:
    """The parent's exit code for the child's wait STATUS; a signal is re-raised on itself."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # those have no handler to reset
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str] | None = None) -> int:
    """Run the launcher; return the exit code (the child's)."""
    try:
        from_env, masks, module, args = parse(sys.argv[1:] if argv is None else argv)
        secrets = secret_values(from_env, masks, dict(os.environ))
    except UsageError as error:
        print(f"sglang_launch: {error}", file=sys.stderr, flush=True)
        return error.code
    table = mask_table(secrets)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    # Blocked across the fork: the parent ignores them, the child keeps Python's handlers.
    handlers = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        _run_child(write_fd, module, args, from_env, secrets)
        return 0
    os.close(write_fd)
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return _end_like(relay(read_fd, sys.stdout.fileno(), table, child))


if __name__ == "__main__":
    sys.exit(main())
