"""
The locked stack: every package of a release set (sglang, torch, flashinfer-python and all
their dependencies) at one version, with the sha256 of each of its files.

A lock is ``uv pip compile --generate-hashes`` output for the containers' Python and platform,
under a header naming the set. The lock of the default set (for Debian 12) lives in
the repository (``group_data/locks/``) and are refreshed with ``make lock``; so does each
preset's (``PRESETS``: the tuned run's 0.5.9), kept as it was made. Any other set gets its
lock made once on the machine running pyinfra (in ``$PVE_SGLANG_CACHE``, else ``~/.cache/pve-sglang``)
and reused; a lock file of one's own is the ``stack_lock`` setting. A lock whose versions are
not the pins is refused.

    python -m pve_sglang.stack.lock refresh     # the repository's locks of the default set
    python -m pve_sglang.stack.lock show FILE   # what a lock holds
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name as normalized  # PEP 503 names

from pve_sglang.project import ROOT, cache_dir, load_defaults
from pve_sglang.stack.platform import DEFAULT_RELEASE, PlatformError, platform_for

#: The checkout's locks folder: the default release sets' and the gateway's (smg's, named
#: ``GATEWAY_LOCKS``...; ``config.gateway.smg_lock_path``).
SHIPPED = ROOT / "group_data" / "locks"
#: The prefix of the gateway's hashed locks in SHIPPED.
GATEWAY_LOCKS = "smg-"
#: The command that refreshes the repository's lock (CONTRIBUTING.md, error messages).
REFRESH = "make lock"
HEADER = "# pve-sglang stack lock: "
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


class LockError(ValueError):
    """A lock that cannot be used: unreadable, without hashes, or not the pinned set."""


@dataclass(frozen=True)
class LockKey:
    """What a lock is made for: the pins, the containers' Python, the indexes."""

    pins: tuple[tuple[str, str], ...]
    python: str
    index_url: str | None = None
    torch_index_url: str | None = None

    @property
    def name(self) -> str:
        """The lock's file name: the pins and Python, and a digest of the indexes if any."""
        words = "-".join(f"{n.replace('-python', '')}-{v}" for n, v in self.pins)
        indexes = [u for u in (self.index_url, self.torch_index_url) if u]
        digest = "-" + hashlib.sha256(" ".join(indexes).encode()).hexdigest()[:10] if indexes else ""
        return f"{words}-py{self.python}{digest}.txt"

    @property
    def platform(self) -> str:
        """uv's platform of the containers' Debian release (the one whose python3 it is)."""
        try:
            return platform_for(self.python).uv_platform
        except PlatformError as error:
            raise LockError(f"stack_python: {error}") from None

    @property
    def header(self) -> list[str]:
        indexes = ", ".join(f"{what} {_digest(url)}" for what, url in
                            (("index", self.index_url), ("torch index", self.torch_index_url)) if url)
        return [
            HEADER + " ".join(f"{n}=={v}" for n, v in self.pins),
            f"# python {self.python}, platform {self.platform}, indexes: {indexes or 'default'}",
            f"# made by uv pip compile --generate-hashes; refresh the repository's lock: {REFRESH}",
        ]


def _digest(url: str) -> str:
    # An index URL may hold credentials: the lock names a digest of it, never the URL.
    return "sha256:" + hashlib.sha256(url.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Lock:
    """A parsed lock file."""

    path: Path
    text: str
    packages: dict[str, str]  # normalized name -> version
    hashes: dict[str, tuple[str, ...]] = field(repr=False)  # normalized name -> sha256s
    python: str | None
    platform: str | None = None

    @property
    def id(self) -> str:
        """The lock's identity: a digest of its text (the wheel store keys on it)."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    def requirement_lines(self, names: list[str] | None = None) -> str:
        """Requirements-file text, hashes included, of NAMES (all when None)."""
        return "".join(
            f"{name}=={self.packages[name]} "
            + " ".join(f"--hash=sha256:{h}" for h in self.hashes[name]) + "\n"
            for name in (self.packages if names is None else names)
        )

    def summary(self, names: tuple[str, ...] = ("sglang", "torch", "flashinfer-python")) -> str:
        shown = ", ".join(f"{n} {self.packages[n]}" for n in names if n in self.packages)
        return f"{len(self.packages)} packages ({shown})"


def parse(path: Path, text: str | None = None) -> Lock:
    """Read the lock at PATH: requirements pinned with ``==`` and each with its hashes."""
    text = path.read_text() if text is None else text
    packages: dict[str, str] = {}
    hashes: dict[str, list[str]] = {}
    current = None
    python = platform = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("# python "):
            python = line.split()[2].rstrip(",")
            found = re.search(r"platform (\S+?),", line)
            platform = found[1] if found else None
        if not line or line.startswith("#"):
            continue
        match = _REQUIREMENT.match(line)
        if match:
            current = normalized(match[1])
            packages[current] = match[2]
            hashes[current] = []
        elif current is None or not line.startswith("--hash="):
            raise LockError(f"lock {path}, line {number}: {raw.strip()[:80]!r} is not a "
                            "'name==version' requirement or its --hash")
        hashes[current] += _HASH.findall(line)
    if not packages:
        raise LockError(f"lock {path}: no 'name==version' requirement in it")
    unhashed = sorted(name for name, found in hashes.items() if not found)
    if unhashed:
        raise LockError(f"lock {path}: no --hash=sha256 for {', '.join(unhashed[:5])}; a lock "
                        "needs the hashes of every package (uv pip compile --generate-hashes)")
    return Lock(path, text, packages, {k: tuple(v) for k, v in hashes.items()}, python, platform)


def check(lock: Lock, key: LockKey) -> None:
    """LockError unless LOCK holds each pin of KEY at its version, for KEY's Python."""
    for name, version in key.pins:
        found = lock.packages.get(normalized(name))
        if found != version:
            held = f"holds {name}=={found}" if found else f"does not hold {name}"
            raise LockError(f"lock {lock.path} {held}, the pins say {name}=={version}: make "
                            f"the lock of the pinned set ({REFRESH} for the defaults), or pin "
                            "what the lock holds")
    if lock.python not in (None, key.python):
        raise LockError(f"lock {lock.path} is made for Python {lock.python}, the containers "
                        f"run {key.python} (stack_python)")
    if lock.platform not in (None, key.platform):
        raise LockError(f"lock {lock.path} is made for platform {lock.platform}, the containers "
                        f"are {key.platform} (Debian's glibc of Python {key.python}): make the "
                        f"lock for it ({REFRESH} for the defaults)")


#: The environment variables of each client for (the default index, an extra index).
INDEX_VARIABLES = {"uv": ("UV_DEFAULT_INDEX", "UV_INDEX"),
                   "pip": ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}


def index_env(key: LockKey, client: str = "uv") -> dict[str, str]:
    """CLIENT's (``uv``, ``pip``) environment for KEY's indexes: in the environment, never on
    a command line (an index URL may hold a token)."""
    default, extra = INDEX_VARIABLES[client]
    env = {default: key.index_url} if key.index_url else {}
    if key.torch_index_url:
        env[extra] = key.torch_index_url
        if client == "uv":
            # torch's own index serves the CUDA builds; take the best match across indexes.
            env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return env


def compile_lock(key: LockKey, dest: Path) -> Lock:
    """Make the lock of KEY at DEST with uv (here, on the machine running pyinfra)."""
    from uv import find_uv_bin

    requirements = "".join(f"{n}=={v}\n" for n, v in key.pins)
    done = subprocess.run(
        # Wheels only: the wheel store and the containers install wheels, never build one (a
        # release pinning an sdist-only version, as 0.5.19-0.5.21 pin cuda-tile 1.6.0rc5, is
        # refused here, not when its wheels are fetched).
        [find_uv_bin(), "pip", "compile", "--quiet", "--generate-hashes", "--no-header",
         "--only-binary", ":all:",
         "--python-version", key.python, "--python-platform", key.platform, "-"],
        input=requirements, capture_output=True, text=True, timeout=900,
        # The lock is resolved for KEY's Python from metadata alone: uv needs no interpreter of
        # that version, and would otherwise try to download one (from outside the package
        # index, where a closed network makes it retry for minutes).
        env={**os.environ, **index_env(key), "UV_PYTHON_DOWNLOADS": "never"},
    )
    if done.returncode != 0:
        raise LockError(
            f"could not make the lock of {' '.join(f'{n}=={v}' for n, v in key.pins)} here "
            f"(uv pip compile): {done.stderr.strip()[-1500:]}; or give a lock in stack_lock"
        )
    text = "\n".join(key.header) + "\n" + done.stdout
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(dest)
    lock = parse(dest)
    check(lock, key)
    return lock


@cache
def read_checked(path: Path, key: LockKey) -> Lock:
    """The lock at PATH, checked against KEY (read once per run)."""
    lock = parse(path)
    check(lock, key)
    return lock


def lock_path(key: LockKey, given: str | None) -> Path:
    """Where the lock of KEY is: the one GIVEN, the repository's, else this machine's cache
    (there only once it was made)."""
    if given:
        return Path(given).expanduser()
    shipped = SHIPPED / key.name
    return shipped if shipped.exists() else cache_dir() / "locks" / key.name


def lock_for(key: LockKey, given: str | None = None) -> Lock:
    """The lock of KEY, made here once when neither GIVEN nor the repository has it."""
    path = lock_path(key, given)
    if not path.exists() and not given:
        compile_lock(key, path)
    return read_checked(path, key)


def default_key() -> LockKey:
    """The key of the default release set (group_data/all.py)."""
    defaults = load_defaults()
    return key_of(defaults)


def key_of(values) -> LockKey:
    """The lock key of settings VALUES (a ContainerSettings or a mapping of its fields)."""
    get: Callable[[str], Any] = (
        values.get if isinstance(values, dict) else lambda name: getattr(values, name))
    url = lambda name: str(get(name)) if get(name) else None  # noqa: E731
    torch, flashinfer = get("torch_version"), get("flashinfer_version")
    if torch is None or flashinfer is None:
        # Unvalidated values (the defaults): the release's own versions fill the gaps.
        from pve_sglang.stack.releases import choose, read_release
        chosen = choose(read_release(get("sglang_version"), url("pip_index_url")), torch, flashinfer)
        torch, flashinfer = chosen.torch, chosen.flashinfer
    return LockKey(
        pins=(("sglang", get("sglang_version")), ("torch", torch),
              ("flashinfer-python", flashinfer)),
        python=get("stack_python") or DEFAULT_RELEASE.python,  # null: Debian 12's (the defaults)
        index_url=url("pip_index_url"),
        torch_index_url=url("torch_index_url"),
    )


#: Release sets the repository keeps the locks of besides the default's, by name: the tuned
#: run's (sglang 0.5.9, torch 2.9.1 cu128, flashinfer 0.6.3; Debian 12), ``sglang_version:
#: "0.5.9"`` picks it.
PRESETS = {"tuned": {"sglang_version": "0.5.9", "stack_python": "3.11"}}


def kept_keys() -> list[LockKey]:
    """The keys of the locks the repository keeps: the default set's for the default Debian
    release (12), and each preset's. Not Debian 13's: 0.5.23's set has no wheels-only lock for
    Python 3.13 (outlines-core 0.1.26, which outlines 0.1.11 pins, has no cp313 wheel)."""
    defaults = load_defaults()
    keys = [key_of({**defaults, "stack_python": DEFAULT_RELEASE.python})]
    return keys + [key_of({**defaults, **preset}) for preset in PRESETS.values()]


def refresh(folder: Path = SHIPPED) -> list[Lock]:
    """Make the default set's locks again in FOLDER, and a preset's where it has none (a
    preset's lock stays what its run used); the locks of any other set there go."""
    keys = kept_keys()
    defaults = len(keys) - len(PRESETS)
    locks = [compile_lock(key, folder / key.name)
             if index < defaults or not (folder / key.name).exists()
             else read_checked(folder / key.name, key) for index, key in enumerate(keys)]
    for old in folder.glob("*.txt"):
        # The gateway's locks (smg-*.txt, config/gateway.py) are no stack's: kept.
        if old.name not in {key.name for key in keys} and not old.name.startswith(GATEWAY_LOCKS):
            old.unlink()  # the repository keeps the default's and the presets' locks only
    return locks


def main(argv: list[str]) -> int:
    if argv[:1] == ["refresh"]:
        for lock in refresh():
            print(f"{lock.path.relative_to(ROOT)}: {lock.summary()}, {len(lock.text)} bytes, "
                  f"id {lock.id}")
        return 0
    if argv[:1] == ["show"] and len(argv) == 2:
        lock = parse(Path(argv[1]))
        print(f"{lock.path}: {lock.summary()}, Python {lock.python}, id {lock.id}")
        for name, version in sorted(lock.packages.items()):
            print(f"  {name}=={version}")
        return 0
    print("usage: python -m pve_sglang.stack.lock refresh | show FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
