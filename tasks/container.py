"""Phase 2, in each GPU container: driver, CUDA, venv, autotune patch, server unit."""

from __future__ import annotations

import glob
import json
from collections.abc import Callable
from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.context import state
from pyinfra.operations import files, server, systemd

from pve_sglang import remote
from pve_sglang.model_store import operations as model
from pve_sglang.model_store.rules import fetch_request
from pve_sglang.operations import (
    container_reads, debs, layer, nvidia_driver, paths, stack_switch, systemd_unit, venv,
)
from pve_sglang.operations.changes import any_changed
from tasks import stack_steps
from tasks.gateway import replica_turn, roll_words
from tasks.common import (
    container_gpus, expect_container_reads, run_when_container_exists, store_user_key,
    upload_script,
)
from pve_sglang.server.render import ServerFiles, server_files
from pve_sglang.stack.identity import settings_stack_id, settings_stack_path, stack_lock_of
from pve_sglang.server.unit_text import (
    LAUNCHER,
    env_file_path,
    fallback_unit_name,
    fallback_unit_path,
    restart_since,
    unit_name,
    unit_path,
)
from pve_sglang.config.settings import (
    ContainerSettings, ModelView, StackView, container_hostname, host_settings,
)
from pve_sglang.stack import switch_rules
from pve_sglang.stack import store_retention
from pve_sglang.stack.lock import Lock
from pve_sglang.stack.platform import platform_for
from pve_sglang.stack.releases import read_release, toolkit_version

TOOLS = remote.TOOLS
#: The lock of a venv made before stacks (one venv at ``venv_path``), as it was last made from
#: it: what names that venv when it becomes a stack.
LOCK_FILE = switch_rules.LEGACY_LOCK_FILE
#: In each stack: its lock, and the part the venv holds itself when the rest comes from the
#: host's shared layer.
STACK_LOCK = "pve-sglang.lock"
STACK_VENV_LOCK = "pve-sglang-venv.lock"
BASE_PACKAGES = ["ca-certificates", "curl", "python3", "python3-venv"]
# FlashInfer compiles kernels at run time: nvcc and a host compiler.
JIT_PACKAGES = ["g++", "make"]
#: NVIDIA's CUDA repository keyring, per Debian release (``debian12``, ``debian13``).
CUDA_KEYRING = (
    "https://developer.download.nvidia.com/compute/cuda/repos/{repo}/x86_64/"
    "cuda-keyring_1.1-1_all.deb"
)
#: Where the driver's runfile and the CUDA keyring are downloaded to (made by the deploy: the
#: wheel store's mount point is below it only when a store is used).
DOWNLOADS = "/var/cache/pve-sglang"
CUDA_KEYRING_DEB = f"{DOWNLOADS}/cuda-keyring.deb"
#: What update-ca-certificates writes from the store's certificates.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@deploy("GPU container")
def container_phase() -> None:
    """Install the pinned stack and the SGLang unit in a GPU container."""
    if "gpu_containers" not in host.groups:
        return
    run_when_container_exists(container_steps, "container setup", planned_container_steps)


#: A step of a phase: what it does in words (the plan shown before the container runs), and the
#: function that calls its operations. It is given the operations of earlier steps that need a
#: server restart when they change, and returns its own (None: none).
Step = tuple[str, Callable[[list], list | None]]


def planned_container_steps() -> list[str]:
    """What the container setup will do, in words, for a plan made before the container runs."""
    cs = host_settings(ContainerSettings)
    return [words for words, _ in container_plan(cs, container_gpus(cs.lxc))]


def container_plan(cs: ContainerSettings, gpu_host: tuple[str | None, list[dict]]) -> list[Step]:
    """The container phase's steps, in order, each with its words: one list for both. GPU_HOST:
    the driver version of the container's host and the GPUs the container gets
    (``container_gpus(cs.lxc)``). The phase's plan: CS whole, as its steps span the stack, the
    server, the model and the stack's switch."""
    driver, gpus = gpu_host
    # The settings' stack, built beside the serving one; the server runs venv_path, the link
    # to the current one.
    wanted = stack_id(cs.stack)
    py = f"{stack_dir(cs.stack)}/bin/python"
    pins = f"sglang=={cs.sglang_version}" + (
        f", torch=={cs.torch_version}, flashinfer-python=={cs.flashinfer_version} and their "
        "dependencies as locked, hashes checked" + (
            f", from the host's wheel store {cs.wheel_store}" if cs.uses_wheel_store else "")
        if cs.stack_install == "pinned" else " (no dependencies)"
    )

    def server_step(restart_on: list) -> list:
        # Rendered as the host phase's preflight rendered it (one function for both).
        rendered = server_files(host.name, cs.server, gpus, state.inventory)
        for warning in rendered.argv.warnings:
            logger.warning(f"{host.name}: {warning}")
        server_unit(cs, py, rendered, restart_on, start=bool(driver))
        return []

    def base_packages(_: list) -> list:
        debs.deb_packages(name="Base packages", packages=BASE_PACKAGES)
        return []

    steps: list[Step] = [
        ("finish a rollback cut short; stop if this set failed as an upgrade before "
         "(retry_failed_stack)", lambda _: stack_steps.before_switch(
             cs.server, wanted, cs.retry_failed_stack, cs.startup_stall_s))]
    if host.data.get("platform") == "lxc":
        # Proxmox keeps /etc/hostname itself; on plain LXC systemd would set the old name from
        # it at every boot, whatever lxc.uts.name says.
        name = container_hostname(host.data)
        steps.append((f"set the hostname {name}", lambda _: set_hostname(name)))
    if cs.ca_certificates:
        steps.append(("trust the extra CA certificates", lambda _: trust_ca_certificates(cs.stack)))
    steps.append(("install the base packages", base_packages))
    if driver:
        steps += [
            (f"install the NVIDIA user-space driver {driver} (the host's version)",
             lambda _: [nvidia_userspace(cs.stack, driver)]),
            (f"install the CUDA toolkit {toolkit_of(cs.stack)}", lambda _: cuda_toolkit(cs.stack)),
        ]
    steps += [
        (f"build the stack {stack_dir(cs.stack)} beside the serving one with uv {cs.uv_version}: "
         f"{pins}", lambda _: python_stack(cs.stack, cs.server.stacks_at, py)),
        ("apply the FlashInfer CUTLASS MoE autotune patch where the release needs it",
         lambda _: patched_stack(cs.stack, py)),
        (f"write /etc/sglang/{cs.service_name}.env (mode 0600) and {unit_name(cs.server)}, switch "
         f"{cs.venv_path} to the new stack"
         + (f", fetch {cs.model_download} into {cs.model_path} after its preflight (its size "
            "against the free space, access, revision: checked then, before any byte moves)"
            if cs.model_download and not cs.uses_model_store else "")
         + (", enable it and (re)start it once" + roll_words(cs.server) if driver
            else " (not enabled at boot: no GPU)"),
         server_step),
        (stack_steps.kept_words(cs.stack, cs.stack_retention),
         lambda _: stack_steps.kept(cs, wanted)),
    ]
    return steps


def stack_id(stack: StackView) -> str:
    """The id of the settings' stack: the lock's id, or a digest of sglang's pin without one."""
    return settings_stack_id(host.name, stack)


def stack_dir(stack: StackView) -> str:
    """Where the settings' stack is built, beside the serving one."""
    return settings_stack_path(host.name, stack)


def beside(stack: StackView, stacks: switch_rules.StacksAt) -> bool:
    """The settings' STACK is not the one ``venv_path`` runs (of the container's STACKS): its
    build changes nothing the server runs; only its switch restarts it. Asked by the restart's
    check, with the container's one read (not when the deploy's code runs)."""
    _, found = stack_switch.found_stacks(stacks)
    return found.named != stack_id(stack)


def restart_check(stack: StackView, stacks: switch_rules.StacksAt, written: list,
                  stack_ops: list, switched, unit: str) -> Callable[[], bool]:
    """Whether the server restarts: its files changed (WRITTEN), the switch to a new stack changed the
    link, or the serving stack itself was changed in place (repaired, patched). The build of a
    stack beside the serving one (``beside``: the settings' STACK, the container's STACKS)
    restarts nothing by itself."""

    def check() -> bool:
        executing = state.is_executing
        moved = (switched.is_complete() and switched.did_change()) if executing \
            else switched.will_change
        in_place = [] if moved or beside(stack, stacks) else stack_ops
        return any_changed(*written, *in_place, switched, restarts=unit)()

    return check


def patched_stack(stack: StackView, py: str) -> list:
    """The autotune patch in the new stack, then its release file (it is complete); the ops
    that restart the server when the stack is the serving one (``restart_check``)."""
    patch = venv.autotune_patch(name="FlashInfer CUTLASS MoE autotune (sglang patch)",
                                python=py, tools=TOOLS)
    release = {"lock": stack_id(stack), "sglang": stack.sglang_version}
    paths.put(name=f"Stack {stack_id(stack)} complete (sglang {stack.sglang_version})",
              src=StringIO(json.dumps(release, sort_keys=True) + "\n"),
              dest=f"{stack_dir(stack)}/{switch_rules.RELEASE_FILE}", mode="644")
    return [patch]


def set_hostname(name: str) -> list:
    """The container's hostname, now and in /etc/hostname. Not pyinfra's server.hostname:
    its hostnamectl needs D-Bus, which is not up yet right after a (re)start."""
    paths.put(name=f"Hostname {name} (/etc/hostname)", src=StringIO(f"{name}\n"),
              dest="/etc/hostname", mode="644")
    # An operation, not a fact read here: read with the container's other reads at execution.
    container_reads.hostname(name=f"Hostname {name} (now)", hostname=name)
    return []


def container_steps() -> None:
    """Every step of the container phase (``container_plan``), in order."""
    cs = host_settings(ContainerSettings)
    expect_container_reads(cs.stack, cs.server)
    driver, gpus = container_gpus(cs.lxc)
    env_file = env_file_path(cs.server)
    # Every path the steps below manage, so one read answers them all.
    paths.watch(
        *(ca_dest(path) for path in ca_files(cs.stack)),
        *([CA_BUNDLE] if ca_files(cs.stack) else []),
        *(remote.path(script) for script in (remote.AUTOTUNE_PATCH, remote.FLAG_LISTER,
                                             remote.STACK_FALLBACK, remote.STARTUP_WATCH,
                                             *remote.companions(remote.STACK_FALLBACK),
                                             *remote.companions(remote.STARTUP_WATCH))),
        *([DOWNLOADS] if driver else []), LAUNCHER, f"{stack_dir(cs.stack)}/pyvenv.cfg",
        cs.venv_path, f"{cs.venv_path}/", stack_dir(cs.stack),
        f"{stack_dir(cs.stack)}/{switch_rules.RELEASE_FILE}",
        *([f"{stack_dir(cs.stack)}/{STACK_LOCK}"] if cs.stack_install == "pinned" else []),
        *(shared_layer_paths(cs.stack) if cs.uses_shared_layer else []),
        *([store_retention.user_path(cs.wheel_store, store_user_key())]
          if cs.uses_wheel_store and cs.wheel_store is not None else []),
        cs.sglang_cache_dir, str(Path(env_file).parent), env_file,
        unit_path(cs.server), fallback_unit_path(cs.server),
        *(remote.path(script) for script in (remote.MODEL_FETCH,
                                             *remote.companions(remote.MODEL_FETCH))
          if cs.model_download),
        *(["/etc/hostname"] if host.data.get("platform") == "lxc" else []),
    )

    if not driver:
        logger.warning(
            f"{host.name}: skipped the NVIDIA user-space driver and the CUDA toolkit: the "
            "host has no NVIDIA driver (they must match the host's kernel module)"
        )
    restart_on: list = []
    for _, step in container_plan(cs, (driver, gpus)):
        restart_on += step(restart_on) or []  # None: nothing of the step restarts the server


def ca_files(stack: StackView) -> list[str]:
    """The CA certificate files on this machine that ``ca_certificates`` names (globs too)."""
    return sorted({match for pattern in stack.ca_certificates for match in glob.glob(pattern)})


def ca_dest(path: str) -> str:
    """Where a CA certificate goes in the container's store."""
    return f"/usr/local/share/ca-certificates/{Path(path).stem}.crt"


def trust_ca_certificates(stack: StackView) -> None:
    """Add the given CA certificates to the container's store (a proxy's CA, for pip and uv).
    The store is updated when a certificate changed in this run, or is newer than the store's
    bundle: an update that failed, or a run killed after the upload, is made by the next run."""
    uploads = [
        paths.put(name=f"CA certificate {Path(path).name}", src=path, dest=ca_dest(path),
                  mode="644")
        for path in ca_files(stack)
    ]
    if uploads:
        changed = any_changed(*uploads)
        certs = [ca_dest(path) for path in ca_files(stack)]
        server.shell(name="Update the CA store", commands=["update-ca-certificates"],
                     _if=lambda: changed() or bundle_older(
                         paths.state(CA_BUNDLE), [paths.state(cert) for cert in certs]))


def bundle_older(bundle: dict | None, certs: list[dict | None]) -> bool:
    """Whether the CA bundle (``PathStates`` value) misses certificates (theirs): it is missing
    or older than one of them. update-ca-certificates writes it anew on every run. Unknown
    times (a ``stat`` without fractions) decide nothing."""
    if bundle is None:
        return any(cert is not None for cert in certs)
    times = [cert.get("mtime") for cert in certs if cert is not None]
    if bundle.get("mtime") is None or None in times:
        return False
    return any(mtime > bundle["mtime"] for mtime in times)


def nvidia_userspace(stack: StackView, version: str):
    """The runfile of the host's exact driver version, installed without kernel modules."""
    paths.directory(name=f"Download folder {DOWNLOADS}", path=DOWNLOADS, mode="755")
    runfile = f"{DOWNLOADS}/NVIDIA-Linux-x86_64-{version}.run"
    if stack.nvidia_runfile_path:
        files.put(name=f"Upload NVIDIA driver runfile {version}", src=stack.nvidia_runfile_path,
                  dest=runfile, mode="755")
    else:
        files.download(
            name=f"Download NVIDIA driver runfile {version}",
            src=stack.nvidia_runfile_url or nvidia_driver.RUNFILE_URL.format(v=version),
            dest=runfile,
            mode="755",
        )
    return nvidia_driver.userspace_driver(
        name=f"NVIDIA user-space driver {version} (the host's version)",
        version=version,
        runfile=runfile,
    )


def toolkit_of(stack: StackView) -> str:
    """The CUDA toolkit (``MAJOR.MINOR``) of the container: cuda_toolkit_version, else the CUDA
    of the torch its set locks (``stack.releases.toolkit_version``)."""
    if stack.cuda_toolkit_version is not None:
        return stack.cuda_toolkit_version
    release = read_release(stack.sglang_version, stack.pip_index_url)
    locked = stack_lock_of(host.name, stack)[0].packages if stack.stack_install == "pinned" else {}
    return toolkit_version(release, None, locked)


def cuda_toolkit(stack: StackView) -> None:
    """CUDA toolkit (nvcc) from NVIDIA's Debian repository, for FlashInfer's JIT.

    NVIDIA's repository, not the CUDA pip packages: FlashInfer 0.7.2's JIT
    (``flashinfer/jit/cpp_ext.py``) takes ``$CUDA_HOME``, else ``which nvcc``, else
    ``/usr/local/cuda``, and links with ``-L$cuda_home/lib64 -L$cuda_home/lib64/stubs``: a
    toolkit's layout. The pip packages have none (``nvidia/cu13/{bin,include,lib}``, no
    ``lib64``, no ``libcuda`` stub, no unversioned ``libcudart.so``), the CUDA 12 sets (0.5.9)
    lock no nvcc at all, and 0.5.23's lock brings nvcc 13.5 beside torch's 13.0 runtime. The
    repository's ``cuda-toolkit-X-Y`` is one toolkit at the set's CUDA for every release,
    installed as ``/usr/local/cuda-X.Y`` with the ``/usr/local/cuda`` link FlashInfer finds.
    """
    repo = platform_for(stack.stack_python).nvidia_repo
    cuda_keyring(CUDA_KEYRING.format(repo=repo))
    toolkit = toolkit_of(stack)
    debs.deb_packages(
        name=f"CUDA toolkit {toolkit} and a host compiler (FlashInfer JIT)",
        packages=[f"cuda-toolkit-{toolkit.replace('.', '-')}", *JIT_PACKAGES],
    )


def cuda_keyring(url: str) -> None:
    """NVIDIA's repository keyring package from URL, installed until dpkg lists it: not only
    when the download changed, so a ``dpkg -i`` that failed once is made again
    (``debs.deb_file``)."""
    files.download(name="NVIDIA CUDA repository keyring", src=url, dest=CUDA_KEYRING_DEB)
    package, version = debs.deb_file_name(url)
    debs.deb_file(name=f"Install the CUDA repository keyring ({package} {version})",
                 path=CUDA_KEYRING_DEB, package=package, version=version)


def python_stack(stack: StackView, stacks: switch_rules.StacksAt, py: str) -> list:
    """A venv of the time before stacks made the current stack (of the container's STACKS); uv,
    the new STACK beside the serving one, the remote scripts, the pinned packages; the ops that
    need a restart when the stack is the serving one (``restart_check``)."""
    stack_switch.migrate(
        name=f"{stack.venv_path}: a venv made before stacks becomes one (not reinstalled)",
        stacks=stacks,
        copies={LOCK_FILE: STACK_LOCK, f"{TOOLS}/stack-venv.lock": STACK_VENV_LOCK})
    tools = f"{TOOLS}/tools"
    venv.tools_venv(name=f"Tools venv with uv {stack.uv_version}", path=tools,
                    uv_version=stack.uv_version)
    uv = f"{tools}/bin/uv"
    folder = stack_dir(stack)
    venv.venv(name=f"sglang venv {folder} (stack {stack_id(stack)})", uv=uv, path=folder,
              python="/usr/bin/python3")
    # The venv's state is read by one Python start that runs these two scripts too.
    upload_script(remote.AUTOTUNE_PATCH, "Upload the autotune patch")
    upload_script(remote.FLAG_LISTER, "Upload the server flag lister")
    if stack.stack_install == "pinned":
        lock, _ = stack_lock_of(host.name, stack)
        paths.put(name=f"Stack lock {lock.id} ({lock.path.name})", src=StringIO(lock.text),
                  dest=f"{folder}/{STACK_LOCK}", mode="644")
        source = "the host's wheel store, offline" if stack.uses_wheel_store else "the index"
        restart_on = []
        lock_file, own = f"{folder}/{STACK_LOCK}", None
        if stack.uses_shared_layer:
            restart_on += shared_layer(stack, uv, py, lock)
            lock_file, own = f"{folder}/{STACK_VENV_LOCK}", layer.venv_names(lock)
            source += ", the rest in the host's shared layer"
        packages = venv.locked_venv(
            name=f"sglang stack as locked: {lock.summary()}, from {source}",
            uv=uv, python=py, tools=TOOLS, lock_file=lock_file, lock=lock,
            args=venv.source_args(stack.pip_index_url, stack.torch_index_url, stack.wheelhouse,
                                   stack.wheel_store if stack.uses_wheel_store else None),
            python_version=stack.stack_python, own=own,
        )
        return [*restart_on, packages]
    pins = {"sglang": stack.sglang_version}
    packages = venv.venv_packages(
        name=f"sglang sglang=={stack.sglang_version} (no dependencies)",
        uv=uv,
        python=py,
        tools=TOOLS,
        pins=pins,
        args=venv.install_args(
            [f"{name}=={version}" for name, version in pins.items()],
            index_url=stack.pip_index_url,
            extra_index_url=stack.torch_index_url,
            wheelhouse=stack.wheelhouse,
            no_deps=True,
        ),
    )
    return [packages]


def shared_layer_paths(stack: StackView) -> list[str]:
    """The paths the shared layer's steps ask about: its marker (through the store's mount),
    the venv's ``.pth`` and its own lock."""
    assert stack.wheel_store is not None
    lock, _ = stack_lock_of(host.name, stack)
    return [layer.marker(stack.wheel_store, lock),
            layer.pth_path(stack_dir(stack), stack.stack_python),
            f"{stack_dir(stack)}/{STACK_VENV_LOCK}"]


def shared_layer(stack: StackView, uv: str, py: str, lock: Lock) -> list:
    """The host's shared layer of LOCK (built once per host), the venv's ``.pth`` to it, and
    the lock of what the venv holds itself; the ops that need a restart."""
    assert stack.wheel_store is not None
    # Each stack reads its own lock's layer.
    return layer.venv_on_layer(uv=uv, python=py, tools=TOOLS, venv_path=stack_dir(stack),
                               python_version=stack.stack_python, store=stack.wheel_store,
                               lock=lock, lock_file=f"{stack_dir(stack)}/{STACK_VENV_LOCK}")


def container_model(source: ModelView, py: str, serving_py: str, env_file: str, env) -> list:
    """Without a model store: model_download fetched into the container's own model_path
    with the sglang venv's huggingface_hub, verified and resumable (``model_store/operations.py``),
    after its preflight (read now, before any change: with the serving stack's Python,
    SERVING_PY, while this run builds PY's). With one, the host fetched it and the container
    mounts it read-only: nothing here."""
    if not source.model_download or source.uses_model_store:
        return []
    fetch = fetch_request(source, python=py, script=remote.path(remote.MODEL_FETCH),
                          env_file=env_file)._asdict()
    planned = model.checked(**fetch, fallback=serving_py, token_pending=env.will_change)
    script = upload_script(remote.MODEL_FETCH, "Upload the model fetcher")
    fetched = model.fetched(
        name=f"Model {source.model_download} in {source.model_path} (verified against the hub)",
        **fetch, planned=planned)
    return [script, fetched]


def server_unit(cs: ContainerSettings, py: str, rendered: ServerFiles, stack_ops: list,
                start: bool) -> None:
    """The server's env file (0600), unit and state; restarted only when something changed.
    CS whole: it spans the server, the model's fetch, the stack's switch (restart_on_change)
    and a replica's turn (the verify phase's bounds), which no one view holds."""
    unit, stacks = unit_name(cs.server), cs.server.stacks_at
    argv, unit_text = rendered.argv, rendered.unit
    venv.server_flags(name=f"Server flags exist in sglang {cs.sglang_version}",
                      python=py, tools=TOOLS, argv=list(argv),
                      unit_path=unit_path(cs.server), unit_text=unit_text)
    paths.directory(name="sglang cache directory", path=cs.sglang_cache_dir, mode="755")
    env_file = env_file_path(cs.server)
    paths.directory(name="Secrets directory", path=str(Path(env_file).parent), mode="700")
    env = paths.put(name=f"Server environment {env_file} (secrets, mode 0600)",
                     src=StringIO(rendered.env), dest=env_file, mode="600", secret=True)
    model_ops = container_model(cs.model, py, f"{cs.venv_path}/bin/python", env_file, env)
    # ExecStart runs it: the key reaches the server without a command line, masked in the log.
    launcher = upload_script(remote.LAUNCHER, "Upload the server launcher")
    unit_file = paths.put(name=f"systemd unit {unit}", src=StringIO(unit_text),
                           dest=unit_path(cs.server), mode="644")
    # The unit's OnFailure=: a stack on trial that fails for good is switched back by systemd.
    upload_script(remote.STACK_FALLBACK, "Upload the stack fallback (the unit's OnFailure=)")
    fallback = paths.put(name=f"systemd unit {fallback_unit_name(cs.server)} (switches a stack on "
                         "trial back when the server fails for good)",
                         src=StringIO(rendered.fallback), dest=fallback_unit_path(cs.server),
                         mode="644")
    systemd.daemon_reload(name="Reload systemd units",
                          _if=lambda: unit_file.did_change() or fallback.did_change())
    switched = stack_switch.switch(
        name=f"{cs.venv_path} -> stack {stack_id(cs.stack)} (sglang {cs.sglang_version}), in one "
        "rename, when it is not the serving one", stacks=stacks, unit=unit,
        wanted=stack_id(cs.stack), restart_on_change=cs.restart_on_change, nodes=cs.nodes)
    systemd_unit.service_running(
        name=f"{unit} enabled and running (restarted only when its unit, env, stack or patch "
        "changed)",
        unit=unit,
        start=start,
        restart=restart_check(cs.stack, stacks, [unit_file, env, launcher, *model_ops],
                              stack_ops, switched, unit),
        # A run killed after one of these changed, before the restart: restarted by the next.
        since=restart_since(cs.server),
        restart_on_change=cs.restart_on_change,
        turn=(replica_turn(cs.server, cs.generation_timeout_s, cs.startup_stall_s)
              if start else None),
    )
    if not start:
        logger.warning(f"{host.name}: {unit} not started: the SGLang server needs a GPU (nor "
                       "enabled at boot, where it would fail and restart)")
