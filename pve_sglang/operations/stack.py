"""The inference stack inside a GPU container: NVIDIA user-space driver, venv, autotune patch."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha1

from pve_sglang import remote

from pve_sglang.runtime import cache
from pve_sglang.facts.container import NvidiaUserspaceVersion, SglangServerFlags
from pve_sglang.facts.verify import JournalTail
from pve_sglang.remote.venv_state import INSTALL_MARKER
from pve_sglang.server import unit_action
from pve_sglang.server.command import check_flags
from pve_sglang.server.unit_action import Action
from pve_sglang.stack.lock import Lock, normalized
from pve_sglang.operations import container_state, paths
from pve_sglang.runtime.cache import Kind, forget, memo
from pve_sglang.runtime.pyinfra_private import joined

RUNFILE_URL = "https://us.download.nvidia.com/XFree86/Linux-x86_64/{v}/NVIDIA-Linux-x86_64-{v}.run"
PATCH_DONE = ("already-patched", "upstream-enabled")

# The sglang venv's state is read once per run stage and shared by the operations below (one
# Python start in a converged run instead of three); one that changes the venv forgets it.


def venv_of(python: str) -> str:
    """The venv a venv's ``bin/python`` belongs to."""
    return posixpath.dirname(posixpath.dirname(python))


def scratch_cache(target: str) -> str:
    """uv's cache for one install into TARGET: beside it, on its filesystem (uv hardlinks the
    unpacked wheels into TARGET, so the cache costs no space of its own while the install
    runs), removed once the install ends. uv's own cache (``~/.cache/uv``) would keep a
    second copy of every unpacked wheel in the container for good (10 GB for a 0.5.23 set
    once the shared layer's staging is gone); ``--no-cache`` unpacks into ``$TMPDIR``, a
    tmpfs on Debian 13, where nothing hardlinks."""
    return f"{target.rstrip('/')}.uv-cache"


def with_scratch_cache(cache: str, uv: str, verb: str, *words) -> StringCommand:
    """``uv pip VERB WORDS`` with uv's cache at CACHE (``scratch_cache``): emptied before,
    removed after, also when uv fails (the command still fails)."""
    folder = QuoteString(cache)
    return StringCommand("rm -rf", folder, "&&", QuoteString(uv), "pip", verb,
                         "--system-certs --cache-dir", folder, *words, "&& rm -rf", folder,
                         "|| { rm -rf", folder, "; false; }")


def venv_state(python: str, tools: str) -> dict:
    """The ``SglangVenv`` fact of this container, read once until the venv changes."""
    known = memo(Kind.VENV)
    if (python, tools) not in known:
        # With the container's other reads (kept in memo(Kind.VENV) too).
        known[(python, tools)] = container_state.read("venv", python, tools)
    return known[(python, tools)]


def venv_changed() -> None:
    """Forget this container's venv state, and remember that this run changed the venv."""
    forget(Kind.VENV)
    memo(Kind.VENV)["changed"] = True


def venv_changed_in_this_run() -> bool:
    """Whether an operation of this run changed this container's venv."""
    return bool(memo(Kind.VENV).get("changed"))


@operation()
def userspace_driver(version: str, runfile: str):
    """
    Install NVIDIA's user-space driver VERSION from RUNFILE without kernel modules: the
    container shares the host's module, and any other version fails with
    ``Driver/library version mismatch``. Done again whenever the host's version moves.

    + version: the host's NVIDIA driver version (``nvidia-smi``), e.g. ``580.95.05``
    + runfile: the path in the container of NVIDIA's ``.run`` installer of that version

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        stack.userspace_driver(
            name="NVIDIA user-space driver 580.95.05 (the host's version)",
            version="580.95.05",
            runfile="/var/cache/pve-sglang/NVIDIA-Linux-x86_64-580.95.05.run",
        )
    """
    installed = host.get_fact(NvidiaUserspaceVersion)
    if installed == version:
        host.noop(f"user-space NVIDIA driver {version} is installed")
        return
    yield StringCommand("sh", QuoteString(runfile), "--no-kernel-modules --silent")


def install_args(
    packages: list[str],
    index_url: str | None,
    extra_index_url: str | None,
    wheelhouse: str | None,
    no_deps: bool,
) -> list[str]:
    """``uv pip install`` arguments for PACKAGES from an index, a wheelhouse, or both."""
    args = []
    if wheelhouse:
        args += ["--find-links", wheelhouse]
        if not index_url:
            args.append("--no-index")
    if index_url:
        args += ["--index-url", index_url]
    if extra_index_url:
        # torch's own index serves the CUDA builds; take the best match across indexes.
        args += ["--extra-index-url", extra_index_url, "--index-strategy", "unsafe-best-match"]
    if no_deps:
        args.append("--no-deps")
    return args + packages


@operation()
def venv_packages(uv: str, python: str, tools: str, pins: dict[str, str], args: list[str]):
    """
    Install the pinned packages into the venv at PYTHON with uv when any installed version
    differs from its pin, or when an earlier install was cut short (a marker in the venv, made
    before uv starts and removed once it succeeded). A converged venv costs one read.

    + uv: the uv binary (of the tools venv)
    + python: the venv's Python, e.g. ``/opt/sglang/venv/bin/python``
    + tools: the directory of the uploaded helper scripts that read the venv's state
    + pins: the versions wanted, ``{name: version}``
    + args: the ``uv pip install`` arguments that install them (see ``install_args``)

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        pins = {"sglang": "0.5.9", "torch": "2.9.1", "flashinfer-python": "0.6.3"}
        stack.venv_packages(
            name="sglang sglang==0.5.9, torch==2.9.1, flashinfer-python==0.6.3",
            uv="/opt/sglang/tools/bin/uv",
            python="/opt/sglang/venv/bin/python",
            tools="/opt/sglang",
            pins=pins,
            args=stack.install_args([f"{n}=={v}" for n, v in pins.items()], index_url=None,
                                    extra_index_url=None, wheelhouse=None, no_deps=False),
        )
    """
    state = venv_state(python, tools)
    installed = state["packages"]
    wrong = {name: installed.get(name) for name, version in pins.items()
             if installed.get(name) != version}
    # An install cut short (a killed deploy) leaves files, METADATA included, that report the
    # pinned versions: the marker, made before uv starts and removed once it succeeded, tells.
    incomplete = bool(state.get("incomplete"))
    if not wrong and not incomplete:
        host.noop("pinned packages are installed: " + ", ".join(f"{n}=={v}" for n, v in pins.items()))
        return
    marker = QuoteString(f"{venv_of(python)}/{INSTALL_MARKER}")
    yield StringCommand("touch", marker)
    # --system-certs: uv's own CA roots would ignore a proxy CA added to the system store.
    yield with_scratch_cache(scratch_cache(venv_of(python)), uv, "install", "--python",
                             QuoteString(python), *(["--reinstall"] if incomplete else []),
                             *(QuoteString(a) for a in args))
    yield StringCommand("rm -f", marker)
    venv_changed()


def lock_differences(installed: dict[str, str], locked: dict[str, str]) -> list[str]:
    """How a venv's INSTALLED set (``{name: version}``) differs from a lock's LOCKED set
    (normalized names), in words: ``torch 2.9.0 (lock: 2.9.1)``, ``missing: sglang``,
    ``not in the lock: rich``."""
    have = {normalized(name): version for name, version in installed.items()}
    words = [f"{name} {have[name]} (lock: {version})" if name in have else f"missing: {name}"
             for name, version in sorted(locked.items()) if have.get(name) != version]
    return words + [f"not in the lock: {name}" for name in sorted(set(have) - set(locked))]


def source_args(index_url: str | None, extra_index_url: str | None, wheelhouse: str | None,
                store: str | None) -> list[str]:
    """Where ``uv pip sync`` takes the locked files from: the host's wheel store (complete:
    the host phase filled it), offline; else a wheelhouse, an index, or both."""
    if store:
        return ["--offline", "--no-index", "--find-links", store]
    return install_args([], index_url, extra_index_url, wheelhouse, no_deps=False)


@operation()
def locked_venv(uv: str, python: str, tools: str, lock_file: str, lock: Lock, args: list[str],
                python_version: str, own: list[str] | None = None):
    """
    Make the venv at PYTHON exactly the locked set (``uv pip sync --require-hashes``: every
    file checked against the lock's sha256, packages not in the lock removed) when what is
    installed differs from LOCK in any package, or an install was cut short. A converged venv
    costs the one read of its state, shared with the patch and flag checks.

    + uv: the uv binary (of the tools venv)
    + python: the venv's Python, e.g. ``/opt/sglang/venv/bin/python``
    + tools: the directory of the uploaded helper scripts that read the venv's state
    + lock_file: the lock's path in the container (uploaded before)
    + lock: the parsed lock (``stack_lock.lock_for``)
    + args: where the files come from (``source_args``)
    + python_version: the containers' Python the lock is made for (``stack_python``)
    + own: the packages the venv holds itself when the rest comes from the host's shared
      layer (``layer.venv_names``; LOCK_FILE then holds only them); any other package in the
      venv's own site-packages is a difference. None: the venv holds the whole set

    **Example:**

    .. code:: python

        from pve_sglang.stack import lock as stack_lock
        from pve_sglang.operations import stack

        stack.locked_venv(
            name="sglang stack as locked",
            uv="/opt/sglang/tools/bin/uv",
            python="/opt/sglang/venv/bin/python",
            tools="/opt/sglang",
            lock_file="/opt/sglang/stack.lock",
            lock=stack_lock.lock_for(stack_lock.default_key()),
            args=stack.source_args(None, None, None, "/var/cache/pve-sglang/wheels"),
            python_version="3.11",
        )
    """
    state = venv_state(python, tools)
    running = state.get("python")
    if running and running != python_version:
        raise OperationError(
            f"the venv's Python is {running}, the lock is made for {python_version}: set "
            f"stack_python: '{running}' (a lock for it is made once on this machine)"
        )
    differences = lock_differences(state["packages"], lock.packages) if state["packages"] else []
    if own is not None:
        differences += [f"in the venv, not the shared layer: {name}"
                        for name in state.get("in_venv", []) if name not in own]
    incomplete = bool(state.get("incomplete"))
    if state["packages"] and not differences and not incomplete:
        host.noop(f"the venv is the locked set: {lock.summary()}, lock {lock.id}")
        return
    if differences:
        shown = ", ".join(differences[:6]) + (f", {len(differences) - 6} more" if len(differences) > 6 else "")
        logger.info(f"{host.name}: the venv differs from lock {lock.id} in {len(differences)} "
                    f"packages ({shown}): reconciled")
    marker = QuoteString(f"{venv_of(python)}/{INSTALL_MARKER}")
    yield StringCommand("touch", marker)
    # --system-certs: uv's own CA roots would ignore a proxy CA added to the system store.
    yield with_scratch_cache(scratch_cache(venv_of(python)), uv, "sync", "--require-hashes "
                             "--python", QuoteString(python),
                             *(["--reinstall"] if incomplete else []),
                             *(QuoteString(a) for a in args), QuoteString(lock_file))
    yield StringCommand("rm -f", marker)
    venv_changed()


@operation()
def autotune_patch(python: str, tools: str):
    """
    Enable FlashInfer's CUTLASS MoE autotune in the installed sglang (see
    ``remote/autotune_patch.py``); checked on every run, since a reinstall drops it silently.
    Code the patch does not recognise stops the deploy, naming the version and file.

    + python: the sglang venv's Python
    + tools: the directory the patch script was uploaded to (``autotune_patch.py`` in it)

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        stack.autotune_patch(
            name="FlashInfer CUTLASS MoE autotune (sglang patch)",
            python="/opt/sglang/venv/bin/python",
            tools="/opt/sglang",
        )
    """
    state = venv_state(python, tools)["patch"]
    if state in PATCH_DONE:
        host.noop(f"sglang autotune for flashinfer_cutlass: {state}")
        return
    # Planned (--dry) after an install of this run: the code is read again once it ran.
    planned_install = venv_changed_in_this_run() and not host.state.is_executing
    if state and state.startswith("unrecognised") and not planned_install:
        raise OperationError(
            f"autotune patch: {state}: this sglang code is not one the patch knows, nothing "
            "was changed; pin a release from 0.5.7 on (0.5.13+ needs no patch)"
        )
    find = (
        "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])"
    )
    package = joined('"$(', StringCommand(QuoteString(python), "-c", QuoteString(find)), ')"')
    # The venv's mtime first: a run killed after the patch restarts the server (service_running).
    venv = QuoteString(venv_of(python))
    yield StringCommand("touch", venv, "&&", QuoteString(python),
                        QuoteString(remote.path(remote.AUTOTUNE_PATCH, tools)), "--apply", package)
    venv_changed()


def restart_pending(started: int | None, since: dict[str, str]) -> list[str]:
    """The names in SINCE (``{name: path}``) whose path changed after STARTED (the running
    server's start, microseconds since the epoch): a run that changed them was killed before
    it restarted the server. Both times are read in the container, on its clock; a file's
    mtime is never later than the write (the kernel stamps it with a coarse clock), so a
    server started after the change is never found pending. Unknown times decide nothing."""
    if started is None:
        return []
    changed = []
    for name, path in since.items():
        current = paths.state(path)
        mtime = current.get("mtime") if current else None
        if mtime is not None and mtime > started:
            changed.append(name)
    return changed


def _state_words(unit_state: dict) -> str:
    words = f"{unit_state['active']}/{unit_state.get('sub')} (Result={unit_state.get('result')}"
    if unit_state.get("restarts") not in (None, "", "0"):
        words += f", {unit_state['restarts']} automatic restarts"
    return words + ")"


@operation()
def service_running(unit: str, start: bool, restart: Callable[[], bool],
                    since: dict[str, str] | None = None, restart_on_change: bool = True):
    """
    Keep UNIT running and enabled at boot where it can run (START: the server needs a GPU;
    without one it is disabled, so that it does not fail and restart at every boot). Start it
    when it is down, and restart it once when RESTART says its unit, environment, stack or
    patch changed. A converged run restarts nothing: a restart reloads the model, minutes of
    downtime. A restart a killed run never made is made: when a path of SINCE changed after the
    running server started, the server runs the old one; the log says which (``restart pending:
    the unit file changed after the server started``). A unit found failed or between two
    automatic restarts is reported (state, restart count, last journal lines) and started again,
    so that the verify phase follows that start and diagnoses it. Each start or restart resets
    the unit's start limit first (``reset-failed``): the limit is for automatic restarts.

    + unit: the systemd unit, e.g. ``sglang.service``
    + start: start the unit when it is down, and enable it at boot; false leaves it stopped
      and disabled (no GPU to serve on)
    + restart: asked only when the unit runs; true restarts it. Usually ``any_changed`` of the
      operations that write its unit, env file, launcher and stack
    + since: ``{what: path}`` of what the server reads when it starts, whose mtimes (from the
      run's one read of the managed paths) are compared with the server's start
    + restart_on_change: false never restarts a running server: a needed restart is reported
      as pending on every run until the server runs what its files say

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack
        from pve_sglang.operations.changes import any_changed

        # unit_file, env, packages: the operations writing the unit, its env file, the stack
        stack.service_running(
            name="sglang.service enabled and running",
            unit="sglang.service",
            start=True,
            restart=any_changed(unit_file, env, packages, restarts="sglang.service"),
            since={"the unit file": "/etc/systemd/system/sglang.service",
                   "the environment file": "/etc/sglang/sglang.env"},
        )
    """
    unit_state = container_state.read("unit", unit)
    # What this operation does moves it: a later ask reads it again.
    container_state.forget(Kind.UNIT)
    active, sub = unit_state["active"], unit_state.get("sub")
    # Written but never loaded (a deploy killed between the write and the reload): the server
    # runs the old unit. Load it and restart, as the killed run would have.
    stale = unit_state.get("stale", False)
    serving = active in unit_action.RUNNING_STATES and not unit_action.looping(active, sub)
    # Asked before the first command: a plan (--dry) reads an operation only up to its first
    # command, and the restart's reason is logged when it is asked.
    changed = serving and (stale or restart())
    pending = restart_pending(unit_state.get("started"), since or {}) if serving and not changed else []
    plan = unit_action.decide(active=active, sub=sub, enabled=unit_state["enabled"], stale=stale,
                              start=start, changed=changed, pending=pending,
                              restart_on_change=restart_on_change)
    quoted = QuoteString(unit)
    if plan.daemon_reload:
        yield StringCommand("systemctl daemon-reload")
    if plan.boot:
        yield StringCommand(f"systemctl {plan.boot}", quoted)
    action = plan.action
    if action is Action.RECOVER:
        if cache.once(Kind.UNIT_LOOPING, unit):
            tail = host.get_fact(JournalTail, unit=unit, lines=15)
            logger.warning(f"{host.name}: {unit} is not serving: {_state_words(unit_state)}; "
                           "last journal lines:\n" + "\n".join(f"    {line}" for line in tail))
        yield StringCommand("systemctl reset-failed", quoted)
        yield StringCommand("systemctl restart" if start else "systemctl stop", quoted)
    elif action is Action.NOTHING:
        host.noop(f"{unit} is running and unchanged")
    elif action is Action.PENDING:
        if cache.once(Kind.RESTART_PENDING, unit):
            logger.warning(f"{host.name}: {unit} restart pending: {plan.why}; restart_on_change "
                           f"is false: `systemctl restart {unit}` when the model may go down")
        host.noop(f"{unit} restart pending (restart_on_change is false)")
    elif action is Action.RESTART:
        if pending and cache.once(Kind.RESTART_PENDING, unit):
            # Once per run: in the plan, or at execution when the plan was skipped (-y).
            logger.warning(f"{host.name}: {unit} restart pending: {plan.why}")
        yield StringCommand("systemctl reset-failed", quoted)
        yield StringCommand("systemctl restart", quoted)
    elif action is Action.START:
        yield StringCommand("systemctl reset-failed", quoted)
        yield StringCommand("systemctl start", quoted)
    else:
        host.noop(f"{unit} not started: the server needs a GPU")


@operation()
def server_flags(python: str, tools: str, argv: list[str], unit_path: str, unit_text: str):
    """
    Stop the deploy before the unit is written when the server command uses a flag the
    installed sglang release does not know (spellings change between releases). Checked when
    the unit at UNIT_PATH is to change or the venv changed in this run: an unchanged unit's
    flags were checked against this release when it was written.

    + python: the sglang venv's Python, which runs the flag lister
    + tools: the directory the flag lister was uploaded to (``sglang_flags.py`` in it)
    + argv: the server command, whose ``--flags`` are checked
    + unit_path: where the unit file goes in the container
    + unit_text: the unit file's text as it will be written

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        stack.server_flags(
            name="Server flags exist in sglang 0.5.9",
            python="/opt/sglang/venv/bin/python",
            tools="/opt/sglang",
            argv=["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server",
                  "--model-path", "/models/model", "--tp-size", "8"],
            unit_path="/etc/systemd/system/sglang.service",
            unit_text=unit_text,  # the rendered unit
        )
    """
    unit = paths.state(unit_path)
    if unit and unit["sha1"] == get_file_sha1(StringIO(unit_text)) and not venv_changed_in_this_run():
        host.noop("server flags were checked against this release when the unit was written")
        return
    known = host.get_fact(SglangServerFlags, python=python, script=remote.path(remote.FLAG_LISTER, tools))
    if known is None:
        host.noop("server flags are checked once sglang is installed")
        return
    try:
        check_flags(argv, known)
    except ValueError as error:
        raise OperationError(
            f"{error}: fix extra_server_args, or the setting that renders it, for this release"
        ) from None
    host.noop(f"every server flag exists in sglang {known.version}")
    yield from ()


@operation()
def tools_venv(path: str, uv_version: str):
    """
    The tools venv at PATH (from the system ``python3``) with uv UV_VERSION; a converged venv
    costs one read.

    + path: where the tools venv goes, e.g. ``/opt/sglang/tools``
    + uv_version: the uv release installed in it with pip

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        stack.tools_venv(name="Tools venv with uv 0.13.8", path="/opt/sglang/tools",
                         uv_version="0.13.8")
    """
    uv = f"{path.rstrip('/')}/bin/uv"
    if container_state.read("uv", uv) == uv_version:
        host.noop(f"uv {uv_version} is installed in {path}")
        return
    pip = QuoteString(f"{path}/bin/pip")
    yield StringCommand("[ -x", pip, "] || python3 -m venv", QuoteString(path))
    yield StringCommand(pip, "install", QuoteString(f"uv=={uv_version}"))
    container_state.forget(Kind.UV)


@operation()
def venv(uv: str, path: str, python: str):
    """
    Create the venv at PATH with uv from the system PYTHON (uv downloads no Python), when PATH
    holds no venv (``pyvenv.cfg``).

    + uv: the uv binary that creates it
    + path: where the venv goes
    + python: the interpreter it is made from

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        stack.venv(
            name="sglang venv /opt/sglang/venv",
            uv="/opt/sglang/tools/bin/uv",
            path="/opt/sglang/venv",
            python="/usr/bin/python3",
        )
    """
    # pyvenv.cfg, not bin/python: that is a symlink.
    if paths.state(f"{path.rstrip('/')}/pyvenv.cfg"):
        host.noop(f"venv {path} exists")
        return
    yield StringCommand("UV_PYTHON_DOWNLOADS=never", QuoteString(uv), "venv --python",
                        QuoteString(python), QuoteString(path))


@operation()
def deb_file(path: str, package: str, version: str):
    """
    Install the Debian package file at PATH (e.g. a downloaded repository keyring) unless
    PACKAGE is installed at VERSION. Decided from what dpkg lists, not from whether the file
    changed in this run: a ``dpkg -i`` that failed (the dpkg lock held at a container's first
    boot, a full disk) or never ran (a run killed after the download) is made by the next run.

    + path: the ``.deb`` in the container
    + package: its package name, as ``dpkg -l`` lists it
    + version: its version, as ``dpkg -l`` lists it

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        stack.deb_file(name="Install the CUDA repository keyring",
                       path="/var/cache/pve-sglang/cuda-keyring.deb",
                       package="cuda-keyring", version="1.1-1")
    """
    installed = container_state.read("debs").get(package) or ()
    if version in installed:
        host.noop(f"{package} {version} installed")
        return
    yield StringCommand("dpkg -i", QuoteString(path))
    container_state.forget(Kind.DEBS)


@operation()
def deb_packages(packages: list[str]):
    """
    Install the Debian PACKAGES that are missing, refreshing the package lists first; one read
    when all are there (``apt.packages`` with ``cache_time`` reads three facts to decide).

    + packages: Debian package names, installed without recommends

    **Example:**

    .. code:: python

        from pve_sglang.operations import stack

        stack.deb_packages(name="Base packages",
                           packages=["ca-certificates", "curl", "python3", "python3-venv"])
    """
    installed = container_state.read("debs")
    missing = [name for name in packages if name not in installed]
    if not missing:
        host.noop("Debian packages installed: " + ", ".join(packages))
        return
    yield StringCommand(
        "DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -q --no-install-recommends", *(QuoteString(m) for m in missing)
    )
    container_state.forget(Kind.DEBS)


def deb_file_name(path: str) -> tuple[str, str]:
    """The package and version of a Debian package file, from its name as Debian names them
    (``NAME_VERSION_ARCH.deb``): ``.../cuda-keyring_1.1-1_all.deb`` -> ``("cuda-keyring",
    "1.1-1")``. The version's epoch, if any, is not in a file name."""
    name = posixpath.basename(path)
    parts = name[:-len(".deb")].split("_") if name.endswith(".deb") else []
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{name!r} is not a Debian package file name (NAME_VERSION_ARCH.deb)")
    return parts[0], parts[1]

