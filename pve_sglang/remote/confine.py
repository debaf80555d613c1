"""Confine this process's writes to a few folders, whatever code it runs afterwards.

A library that builds a path from a server's answer (huggingface_hub names its ``.incomplete``
file after the ETag header) then cannot create, write, truncate, remove or rename anything
outside those folders, as root too. Two ways, the first the kernel offers:

+ Landlock (an LSM any process may apply to itself, irrevocably; its ABI 2, Linux 5.19, lets a
  file be renamed from one folder to another: ABI 1 would refuse that, and the client's
  ``shutil.move`` would copy each shard instead);
+ a mount namespace of this process in which every mount is read-only but the folders, bound
  onto themselves (``mount_setattr``, Linux 5.12; needs CAP_SYS_ADMIN: root).

Neither: ``Unconfined``, saying why. Both hold for the calling thread and the threads and
processes it starts later: call ``confine`` before any other thread runs. Stand-alone (the
standard library): uploaded beside the model fetcher.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

#: The syscall numbers of x86_64 and of the generic table (aarch64): the same for these.
SYSCALLS = {"landlock_create_ruleset": 444, "landlock_add_rule": 445,
            "landlock_restrict_self": 446, "mount_setattr": 442}
MACHINES = ("x86_64", "aarch64")

# Landlock's filesystem rights (linux/landlock.h).
WRITE_FILE = 1 << 1
REMOVE_DIR, REMOVE_FILE = 1 << 4, 1 << 5
MAKES = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 0x1


class Unconfined(Exception):
    """The writes of this process could not be confined."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _call(libc, name: str, *args) -> int:
    result = libc.syscall(ctypes.c_long(SYSCALLS[name]), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers: 0 where it has none (not built in, not enabled in
    the kernel's ``lsm=`` list, or another architecture)."""
    if os.uname().machine not in MACHINES:
        return 0
    libc = _libc()
    abi = libc.syscall(ctypes.c_long(SYSCALLS["landlock_create_ruleset"]), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, abi)


def way(abi: int) -> str:
    """How to confine where the kernel's Landlock ABI is ABI: ``landlock`` from ABI 2 (renames
    across folders), else ``namespace``."""
    return "landlock" if abi >= 2 else "namespace"


def handled(abi: int) -> int:
    """The rights Landlock takes from everything but the allowed folders: every write."""
    return WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKES | REFER | (TRUNCATE if abi >= 3 else 0)


def single_threaded() -> bool:
    """Whether this process runs one thread (Landlock and unshare confine the calling thread
    and what it starts later, not the threads already running)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return threading.active_count() == 1


def _landlock(folders: list[str], files: list[str], abi: int) -> None:
    libc = _libc()
    rights = handled(abi)
    attr = ctypes.create_string_buffer(struct.pack("<Q", rights))
    ruleset = _call(libc, "landlock_create_ruleset", attr, ctypes.c_size_t(len(attr.raw)), ctypes.c_uint32(0))
    try:
        for path, allowed in [(f, rights) for f in folders] + [(f, rights & (WRITE_FILE | TRUNCATE)) for f in files]:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("<Qi", allowed, fd))
                _call(libc, "landlock_add_rule", ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                      rule, ctypes.c_uint32(0))
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        _call(libc, "landlock_restrict_self", ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _namespace(folders: list[str]) -> None:
    libc = _libc()

    def check(result: int, what: str) -> None:
        if result != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"{what}: {os.strerror(code)}")

    def set_attr(path: str, attr: _MountAttr) -> None:
        _call(libc, "mount_setattr", ctypes.c_int(AT_FDCWD), path.encode(), ctypes.c_uint(AT_RECURSIVE),
              ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))

    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Private first: nothing done here reaches the host's mounts.
    check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "mount --make-rprivate /")
    for folder in folders:
        check(libc.mount(folder.encode(), folder.encode(), None, ctypes.c_ulong(MS_BIND | MS_REC), None),
              f"mount --rbind {folder}")
    set_attr("/", _MountAttr(attr_set=MOUNT_ATTR_RDONLY))
    for folder in folders:
        set_attr(folder, _MountAttr(attr_clr=MOUNT_ATTR_RDONLY))


def confine(folders: list[str], files: tuple[str, ...] = (os.devnull,), abi: int | None = None) -> str:
    """From now on this process writes only under FOLDERS (each an existing folder) and to
    FILES (``/dev/null``); returns how (``landlock`` or ``namespace``). ABI: the kernel's
    Landlock ABI (asked when None)."""
    if not single_threaded():
        raise Unconfined("other threads already run: the confinement would not hold for them")
    abi = landlock_abi() if abi is None else abi
    folders = [os.path.realpath(f) for f in folders]
    if way(abi) == "landlock":
        try:
            _landlock(folders, [f for f in files if os.path.exists(f)], abi)
            return "landlock"
        except OSError as error:
            landlock_error = f"Landlock ABI {abi}: {error}"
    else:
        landlock_error = f"Landlock ABI {abi}: renames across folders need ABI 2 (Linux 5.19)" if abi \
            else "no Landlock in this kernel (Linux 5.19 with landlock in its lsm= list)"
    try:
        _namespace(folders)
        return "namespace"
    except OSError as error:
        raise Unconfined(f"{landlock_error}; a read-only mount namespace: {error}") from None
