"""The wheel store on a Proxmox (or plain LXC) host: the locked set's wheels, kept once per host."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.connectors.local import LocalConnector

from pve_sglang.facts.lxc_host import ExistingFiles
from pve_sglang.stack.lock import Lock, LockError, LockKey
from pve_sglang.stack.store_retention import LOCKS
from pve_sglang.stack.wheel_fetch import fetch, total_bytes

INCOMING = ".incoming"


def marker(store: str, lock: Lock) -> str:
    """The file that says STORE holds every wheel of LOCK (its manifest)."""
    return f"{store.rstrip('/')}/{LOCKS}/{lock.id}"


@operation()
def store(path: str, lock: Lock, key: LockKey):
    """
    Folder PATH on this host holds every wheel of LOCK. The wheels are fetched once on the
    machine running pyinfra (``wheel_fetch.fetch``); only those PATH lacks are uploaded, into
    ``PATH/.incoming``, checked there with ``sha256sum`` against the lock's hashes and only
    then moved in, so PATH never holds a partial or foreign file. ``PATH/.locks/<lock id>``,
    written last, says the set is complete: a converged run reads that one file. Sets share
    PATH: a wheel of two sets is kept once.

    + path: the store folder on this host, e.g. ``/var/cache/pve-sglang/wheels``
    + lock: the parsed lock (``stack_lock.lock_for``)
    + key: what the lock is made for (its indexes: where the wheels come from)

    **Example:**

    .. code:: python

        from pve_sglang.stack import lock as stack_lock
        from pve_sglang.operations import wheels

        key = stack_lock.default_key()
        wheels.store(name="Wheel store", path="/var/cache/pve-sglang/wheels",
                     lock=stack_lock.lock_for(key), key=key)
    """
    done = marker(path, lock)
    if done in (host.get_fact(ExistingFiles, paths=[done]) or []):
        host.noop(f"{path} holds the {len(lock.packages)} wheels of lock {lock.id}")
        return
    folders = [QuoteString(f"{path.rstrip('/')}/{sub}") for sub in (INCOMING, LOCKS)]
    # 755: each container's root (unprivileged: an unmapped uid) reads it through a read-only mount.
    yield StringCommand("mkdir -p", *folders, "&& chmod 755", QuoteString(path), *folders)
    yield FunctionCommand(_fill, (path, lock, key), {})


def upload(host, source: Path, dest: str) -> bool:
    """The file SOURCE of this machine to DEST on HOST. Where HOST is this machine (a plain
    LXC host run locally), ``local_copy``'s command. Never pyinfra's
    ``LocalConnector.put_file``: it copies through a temp file whose descriptor it never
    closes, so every upload's copy stays on disk, deleted, until the run ends."""
    if isinstance(host.connector, LocalConnector):
        return host.run_shell_command(local_copy(source, dest))[0]
    return bool(host.put_file(str(source), dest))


def upload_all(host, pairs: list[tuple[Path, str]], batch: int = 50) -> bool:
    """Each (source, dest) of PAIRS uploaded to HOST; on this machine BATCH files a command
    (a command per wheel cost 10 s for 207 of them)."""
    if not isinstance(host.connector, LocalConnector):
        return all(upload(host, source, dest) for source, dest in pairs)
    for start in range(0, len(pairs), batch):
        commands = [local_copy(source, dest) for source, dest in pairs[start:start + batch]]
        chained = [bit for command in commands for bit in ("&&", command)][1:]
        if not host.run_shell_command(StringCommand(*chained))[0]:
            return False
    return True


def local_copy(source: Path, dest: str) -> StringCommand:
    """SOURCE to DEST on this machine: a hard link where ``linkable`` (the store then takes
    no second copy of the set: 4.3 GB for 0.5.23's), else ``cp``. A file left at DEST by a
    killed run may be a link: removed first, never written through."""
    src, to = QuoteString(str(source)), QuoteString(dest)
    copy = StringCommand("cp --", src, to)
    put = StringCommand("{ ln --", src, to, "2>/dev/null ||", copy, "; }") \
        if linkable(source) else copy
    return StringCommand("rm -f --", to, "&&", put)


def linkable(source: Path) -> bool:
    """Whether the store may share SOURCE's file (a hard link): only a file that root owns and
    only root can write, so no user can change what the containers install through it. The
    cache's wheels are never rewritten in place (``wheel_fetch`` writes each once); a link
    across filesystems fails, and ``upload`` copies then."""
    try:
        info = source.stat()
    except OSError:
        return False
    return info.st_uid == 0 and not info.st_mode & 0o022


def _fill(state, host, path: str, lock: Lock, key: LockKey) -> bool:
    """At execution: fetch here, upload what the store lacks, check and move it in."""
    try:
        folder, entries = fetch(lock, key)
    except LockError as error:
        logger.error(f"{host.name}: wheel store: {error}")
        return False
    ok, listing = host.run_shell_command(StringCommand("ls -1", QuoteString(path)))
    if not ok:
        return False
    present = set(listing.stdout_lines)
    missing = sorted(name for name in entries if name not in present)
    incoming = f"{path.rstrip('/')}/{INCOMING}"
    if missing:
        size = sum((folder / name).stat().st_size for name in missing)
        logger.info(f"{host.name}: wheel store: {len(missing)} of {len(entries)} wheels to "
                    f"{path} ({size / 1e9:.1f} of {total_bytes(folder, entries) / 1e9:.1f} GB)")
        if not upload_all(host, [(folder / name, f"{incoming}/{name}") for name in missing]):
            return False
        sums = "".join(f"{entries[name]}  {name}\n" for name in missing)
        if not host.put_file(StringIO(sums), f"{incoming}/MANIFEST"):
            return False
        # Checked where it landed, then moved in; a bad file stops here and is removed.
        ok, output = host.run_shell_command(StringCommand(
            "cd", QuoteString(incoming), "&& { sha256sum -c --quiet MANIFEST || "
            "{ find . -maxdepth 1 -type f -delete; exit 1; }; } && "
            "cut -d' ' -f3- MANIFEST | while IFS= read -r f; do chmod 644 -- \"$f\" && "
            "mv -f -- \"$f\" ..; done && rm -f MANIFEST"))
        if not ok:
            logger.error(f"{host.name}: wheel store: a wheel uploaded to {incoming} does not have "
                         f"the lock's sha256: {output.stderr or output.stdout}")
            return False
    manifest = "".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items()))
    return bool(host.put_file(StringIO(manifest), marker(path, lock)))
