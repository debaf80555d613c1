"""The sglang venv inside a GPU container: the tools venv (uv), the venv, its packages (as
locked, or sglang alone), the autotune patch, and the check of the server's flags against the
release it holds. The venv's state is read once per run stage (``venv_state``)."""

from __future__ import annotations

import posixpath
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha1

from pve_sglang import remote

from pve_sglang.facts.container import SglangServerFlags
from pve_sglang.facts.one_read import Part
from pve_sglang.remote.venv_state import INSTALL_MARKER
from pve_sglang.server.command import check_flags
from pve_sglang.stack.lock import Lock, normalized
from pve_sglang.operations import container_reads, paths
from pve_sglang.runtime.cache import Kind, forget, memo
from pve_sglang.runtime.pyinfra_private import joined

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
        known[(python, tools)] = container_reads.read(Part.VENV, python, tools)
    return known[(python, tools)]


def venv_changed() -> None:
    """Forget this container's venv state, and remember that this run changed the venv."""
    forget(Kind.VENV)
    memo(Kind.VENV)["changed"] = True


def venv_changed_in_this_run() -> bool:
    """Whether an operation of this run changed this container's venv."""
    return bool(memo(Kind.VENV).get("changed"))




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

        from pve_sglang.operations import venv

        pins = {"sglang": "0.5.9", "torch": "2.9.1", "flashinfer-python": "0.6.3"}
        venv.venv_packages(
            name="sglang sglang==0.5.9, torch==2.9.1, flashinfer-python==0.6.3",
            uv="/opt/sglang/tools/bin/uv",
            python="/opt/sglang/venv/bin/python",
            tools="/opt/sglang",
            pins=pins,
            args=venv.install_args([f"{n}=={v}" for n, v in pins.items()], index_url=None,
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
    have: dict[str, str] = {normalized(name): version for name, version in installed.items()}
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
        from pve_sglang.operations import venv

        venv.locked_venv(
            name="sglang stack as locked",
            uv="/opt/sglang/tools/bin/uv",
            python="/opt/sglang/venv/bin/python",
            tools="/opt/sglang",
            lock_file="/opt/sglang/stack.lock",
            lock=stack_lock.lock_for(stack_lock.default_key()),
            args=venv.source_args(None, None, None, "/var/cache/pve-sglang/wheels"),
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

        from pve_sglang.operations import venv

        venv.autotune_patch(
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

        from pve_sglang.operations import venv

        venv.server_flags(
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

        from pve_sglang.operations import venv

        venv.tools_venv(name="Tools venv with uv 0.13.8", path="/opt/sglang/tools",
                        uv_version="0.13.8")
    """
    uv = f"{path.rstrip('/')}/bin/uv"
    if container_reads.read(Part.UV, uv) == uv_version:
        host.noop(f"uv {uv_version} is installed in {path}")
        return
    pip = QuoteString(f"{path}/bin/pip")
    # Tried twice: its ensurepip step exited 1 now and then on a loaded 2-core test machine
    # (twice in three suite runs, output not kept); a venv made over a half-made one is whole.
    made = StringCommand("python3 -m venv", QuoteString(path))
    yield StringCommand("[ -x", pip, "] ||", made, "||", made)
    yield StringCommand(pip, "install", QuoteString(f"uv=={uv_version}"))
    container_reads.forget(Kind.UV)


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

        from pve_sglang.operations import venv

        venv.venv(
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







