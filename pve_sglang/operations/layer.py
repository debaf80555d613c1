"""The shared stack layer: the locked set but sglang, installed once per host into its wheel store.

Each container's venv reads it through the store's read-only mount (a ``.pth`` file), and keeps
only sglang itself, which the autotune patch writes to. A second container on the host, or a
container recreated, installs one package instead of the whole set, and one container cannot
change what another runs.
"""

from __future__ import annotations

from io import StringIO
from weakref import WeakKeyDictionary

import gevent.lock
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha1

from pve_sglang.connectors.container import ContainerConnector
from pve_sglang.stack.lock import Lock
from pve_sglang.operations import container_reads, paths, venv
from pve_sglang.runtime.cache import Kind
from pve_sglang.runtime.pyinfra_private import joined
from pve_sglang.stack.store_retention import LOCKS

#: What the container's venv holds itself: the autotune patch writes into sglang.
VENV_OWNED = ("sglang",)
#: Where the building container installs the layer before its host moves it into the store.
STAGING = "/var/tmp/pve-sglang-layer"
PTH = "pve-sglang-layer.pth"
#: What ``copy_command`` prints where it renamed the staging instead of copying it.
RENAMED = "renamed"

# One build per container host, store and lock in a run (per pyinfra State, across its
# hosts): the other containers wait, then find it there.
_BUILDS: WeakKeyDictionary = WeakKeyDictionary()
_BUILDING = gevent.lock.Semaphore()


def path(store: str, lock: Lock) -> str:
    """The layer of LOCK in STORE (the same path on the host and in the containers)."""
    return f"{store.rstrip('/')}/layers/{lock.id}"


def marker(store: str, lock: Lock) -> str:
    """The file that says the layer of LOCK in STORE is complete; written last."""
    return f"{store.rstrip('/')}/{LOCKS}/{lock.id}.layer"


def pth_path(venv_path: str, python_version: str) -> str:
    """The ``.pth`` file that puts the layer on the ``sys.path`` of the venv at VENV_PATH, after
    its own packages."""
    return f"{venv_path.rstrip('/')}/lib/python{python_version}/site-packages/{PTH}"


def venv_names(lock: Lock, own: tuple[str, ...] = VENV_OWNED) -> list[str]:
    """The packages of LOCK the venv holds itself (OWN)."""
    return [name for name in lock.packages if name in own]


def layer_names(lock: Lock, own: tuple[str, ...] = VENV_OWNED) -> list[str]:
    """The packages of LOCK in the shared layer: all but OWN."""
    return [name for name in lock.packages if name not in own]


def venv_on_layer(uv: str, python: str, tools: str, venv_path: str, python_version: str,
                  store: str, lock: Lock, lock_file: str, own: tuple[str, ...] = VENV_OWNED) -> list:
    """The host's shared layer of LOCK in STORE (built once per host), the venv's ``.pth`` to
    it, and LOCK_FILE: the lock of what the venv holds itself (OWN). Returns the operations
    after whose change the server restarts (a layer built again, a venv reading another)."""
    pth = pth_path(venv_path, python_version)
    built = shared(name=f"Shared stack layer of lock {lock.id} in {store}/layers "
                        f"({len(layer_names(lock, own))} packages, built once per host)",
                   uv=uv, python=python, tools=tools, pth=pth, store=store, lock=lock, own=own)
    reads = paths.put(name=f"The venv reads the shared layer ({PTH})",
                      src=StringIO(pth_text(store, lock)), dest=pth, mode="644")
    own_lock = paths.put(name=f"Stack lock {lock.id}, the venv's own part "
                              f"({', '.join(venv_names(lock, own))})",
                         src=StringIO(lock.requirement_lines(venv_names(lock, own))),
                         dest=lock_file, mode="644")
    return [built, reads, own_lock]


def damaged(python: str, tools: str, pth: str, store: str, lock: Lock,
            own: tuple[str, ...] = VENV_OWNED) -> list[str]:
    """The layer's packages a venv reading it does not find as locked (its files went from
    the store): the venv's one read of its state says. Nothing is judged while the venv does
    not read the layer yet (no ``.pth``, or another) or changes in this run."""
    reads = paths.state(pth)
    expected = get_file_sha1(StringIO(pth_text(store, lock)))
    if venv.venv_changed_in_this_run() or not reads or reads.get("sha1") != expected:
        return []
    state = venv.venv_state(python, tools)
    if not state["packages"]:
        return []
    # Names are normalized on both sides already (SglangVenv, the lock).
    own_copies = set(state.get("in_venv", []))
    return [name for name in layer_names(lock, own)
            if name not in own_copies and state["packages"].get(name) != lock.packages[name]]


@operation()
def shared(uv: str, python: str, tools: str, pth: str, store: str, lock: Lock,
           own: tuple[str, ...] = VENV_OWNED):
    """
    The host's wheel store holds the layer of LOCK: its packages but sglang, installed once per
    host. Built at execution by the first container that gets here (the others of the run wait,
    then find it): uv installs it offline from STORE, hashes checked and bytecode compiled, into
    ``STAGING`` in this container (uv's cache beside it, removed after); the host moves it
    into the store as its own (root-owned, not writable by a container; renamed where the
    container's root is a host folder on the store's mount, else copied with ``tar``, the
    staging's files going as they are copied: ``copy_command``), moves it into place whole,
    and writes the marker. A converged run reads the marker with the container's watched paths. A layer whose
    packages the venv reading it no longer finds as locked (``damaged``) is built again, once
    per run for all the host's containers.

    + uv: the uv binary (of the tools venv)
    + python: the container's venv Python (the layer is built for its interpreter)
    + tools: the directory of the helper scripts that read the venv's state
    + pth: the venv's ``.pth`` file to the layer (``pth_path``)
    + store: the host's wheel store, mounted read-only at the same path in the container
    + lock: the parsed lock (``stack_lock.lock_for``)
    + own: the packages the venvs hold themselves, left out of the layer

    **Example:**

    .. code:: python

        from pve_sglang.stack import lock as stack_lock
        from pve_sglang.operations import layer

        layer.shared(name="Shared stack layer", uv="/opt/sglang/tools/bin/uv",
                     python="/opt/sglang/venv/bin/python", tools="/opt/sglang",
                     pth="/opt/sglang/venv/lib/python3.11/site-packages/pve-sglang-layer.pth",
                     store="/var/cache/pve-sglang/wheels",
                     lock=stack_lock.lock_for(stack_lock.default_key()))
    """
    rebuild = False
    if paths.state(marker(store, lock)):
        missing = damaged(python, tools, pth, store, lock, own)
        if not missing:
            host.noop(f"the shared layer of lock {lock.id} is in {path(store, lock)}")
            return
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        logger.warning(f"{host.name}: the shared layer of lock {lock.id} in {path(store, lock)} "
                       f"lacks what the venv should find there ({', '.join(missing[:5])}{more}): "
                       "building it again")
        rebuild = True
    yield FunctionCommand(_build, (uv, python, store, lock, own, rebuild), {})
    # What the venv finds is read again (the packages of a layer built now).
    container_reads.forget(Kind.VENV)


def _building(store: str, lock: Lock) -> tuple[gevent.lock.Semaphore, set]:
    # Per container host where the inventory names it (hosts files); else one build at a time.
    # The set: the layer was built in this run (a damaged one is built again once).
    outer = host.data.get("pve_host")
    with _BUILDING:
        return _BUILDS.setdefault(host.state, {}).setdefault(
            (outer, store, lock.id), (gevent.lock.Semaphore(), set()))


def _build(state, host, uv: str, python: str, store: str, lock: Lock,
           own: tuple[str, ...], rebuild: bool = False) -> bool:
    """At execution: install into staging here, copy it into the store on the host (REBUILD:
    also when its marker is there, unless it was built in this run)."""
    # A container connector (ContainerConnector) runs commands on the container's host too;
    # the hosts files reach every container through one.
    if not hasattr(host.connector, "run_on_host"):
        logger.error(f"{host.name}: the shared layer is copied by the container's host: it "
                     "needs the @pct or @lxc connector; set shared_layer: false")
        return False
    done = QuoteString(marker(store, lock))
    building, built = _building(store, lock)
    with building:
        if built or not rebuild and host.run_shell_command(StringCommand("test -f", done))[0]:
            logger.info(f"{host.name}: the shared layer of lock {lock.id} was built by another "
                        "container of the host in this run")
            return True
        requirements = f"{STAGING}.txt"
        if not host.put_file(StringIO(lock.requirement_lines(layer_names(lock, own))), requirements):
            return False
        logger.info(f"{host.name}: building the shared layer of lock {lock.id} "
                    f"({len(layer_names(lock, own))} packages) for {store}")
        ok, output = host.run_shell_command(install_command(uv, python, store, requirements))
        if not ok:
            logger.error(f"{host.name}: shared layer: uv could not install lock {lock.id} from "
                         f"{store}: {output.stderr or output.stdout}")
            return False
        ok, output = host.connector.run_on_host(copy_command(host.connector, store, lock))
        if not ok:
            logger.error(f"{host.name}: shared layer: the copy into {store} failed: "
                         f"{output.stderr or output.stdout}")
            return False
        how = RENAMED if RENAMED in output.stdout_lines else "copied"
        logger.info(f"{host.name}: the shared layer of lock {lock.id} {how} into {store}")
        built.add(lock.id)
        return host.run_shell_command(
            StringCommand("rm -rf", QuoteString(STAGING), QuoteString(requirements)))[0]


def install_command(uv: str, python: str, store: str, requirements: str) -> StringCommand:
    """The container-side command that installs the REQUIREMENTS file (the layer's part of the
    lock) from STORE into ``STAGING``: offline, hashes required, bytecode compiled once here
    (the layer is read-only where it is used). uv's cache is STAGING's own, removed with it
    (``venv.scratch_cache``): the container keeps no 10 GB copy of the layer."""
    staging = QuoteString(STAGING)
    return StringCommand(
        "rm -rf", staging, "&&", venv.with_scratch_cache(
            venv.scratch_cache(STAGING), uv, "install", "--python", QuoteString(python),
            "--target", staging, "--compile-bytecode --require-hashes --no-deps --offline "
            "--no-index --find-links", QuoteString(store), "-r", QuoteString(requirements)))


def copy_command(connector: ContainerConnector, store: str, lock: Lock,
                 staging: str = STAGING) -> StringCommand:
    """The host-side command that moves STAGING out of the container into the store as
    the layer of LOCK: into a folder of its own, owned by the host's root, moved into place
    whole, then the marker. A cut copy leaves no marker: the next run builds it again.

    Renamed into the store where ``rename_command`` can (no 10 GB copy); else ``tar`` copies
    it out through the exec tool, the container giving back each file once it is in the
    pipe, so the copy needs the layer's size once, not twice (staging and store: 10 GB each
    for a 0.5.23 set)."""
    base = store.rstrip("/")
    incoming = QuoteString(f"{base}/.incoming-layer-{lock.id}")
    status = QuoteString(f"{base}/.incoming-layer-{lock.id}.status")
    layers = QuoteString(f"{base}/layers")
    final = QuoteString(path(store, lock))
    done = QuoteString(marker(store, lock))
    archive = connector.make_exec_command(
        StringCommand("tar -C", QuoteString(staging), "--remove-files -cf - ."))
    # sh has no pipefail: the archive's status goes through a file.
    moved = StringCommand(
        "mkdir", incoming, "&& {", archive, "; echo $? >", status, "; } | tar -C", incoming,
        "-xf - --no-same-owner && [ \"$(cat", status, ")\" = 0 ] && rm -f", status)
    renamed = rename_command(connector, staging, incoming, layers)
    if renamed is not None:
        moved = StringCommand("{", renamed, "; else", moved, "; fi; }")
    return StringCommand(
        "rm -rf", incoming, "&& mkdir -p", layers, "&& chmod 755", layers, "&&", moved,
        # 755/644: an unprivileged container's root (an unmapped uid) reads it, nobody writes.
        "&& chmod -R u+rwX,go+rX,go-w", incoming, "&& rm -rf", final, "&& mv", incoming, final,
        "&& touch", done, "&& chmod 644", done,
    )


def rename_command(connector: ContainerConnector, staging: str, incoming: QuoteString,
                   layers: QuoteString) -> StringCommand | None:
    """The host-side ``...; if <it can>; then <rename STAGING to INCOMING, root's>`` (the
    caller adds ``else``), or None where the connector cannot tell the container's root on
    the host. It can where that root is a folder of the host on the mount of LAYERS (LXC's
    ``dir`` backend, ``make_rootfs_command``), STAGING is reached there without a symlink (the
    container's root could point one anywhere on the host), and it is the very folder the
    container sees (not one a mount inside the container hides)."""
    rootfs = connector.make_rootfs_command()
    if rootfs is None:
        return None
    inner = QuoteString(staging)
    found = StringCommand(
        "root=$(", rootfs, "2>/dev/null | sed -n",
        QuoteString("s/^lxc\\.rootfs\\.path = \\(dir:\\)\\{0,1\\}\\(\\/.*\\)$/\\2/p"), ")")
    inside = connector.make_exec_command(StringCommand("stat -c %d:%i --", inner))
    # "$root"STAGING: the staging as the host sees it (one word, no space between).
    source = joined('"$root"', inner)
    real = joined('"$(realpath -e -- "$root" 2>/dev/null)"', inner)
    return StringCommand(
        found, "; if [ -n \"$root\" ] && [ \"$(realpath -e --", source, "2>/dev/null)\" =", real,
        "] && [ \"$(stat -c %m --", source, ")\" = \"$(stat -c %m --", layers, ")\" ]",
        "&& [ \"$(stat -c %d:%i --", source, ")\" = \"$(", inside, ")\" ]; then mv -T --",
        source, incoming, "&& chown -R -h 0:0", incoming, "&& echo", RENAMED)


def pth_text(store: str, lock: Lock) -> str:
    """The ``.pth`` file's text: the layer's path."""
    return path(store, lock) + "\n"
