"""
The wheels of a lock, fetched once on the machine running pyinfra for the containers' Python
and platform (``pip download``, hashes required), with a manifest in ``sha256sum`` format that
the hosts check what they receive against.

    <cache>/wheels/<lock id>/*.whl
    <cache>/wheels/<lock id>/MANIFEST       # "<sha256>  <file>" per wheel, written last

A wheel that a complete set of the cache holds already (the same sha256: an upgrade that keeps
torch and its CUDA libraries) is hard-linked from there, not downloaded again: one file on disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pve_sglang.project import cache_dir
from pve_sglang.remote.file_hash import file_digest
from pve_sglang.stack.lock import Lock, LockError, LockKey, index_env
from pve_sglang.stack.platform import platform_for

MANIFEST = "MANIFEST"
#: Parallel pip downloads: pip fetches one file at a time.
PARALLEL = 4


def wheel_dir(lock: Lock) -> Path:
    return cache_dir() / "wheels" / lock.id


def platform_args(python: str) -> list[str]:
    """pip's target options for PYTHON's Debian release (its glibc: the lock's platform): pip
    takes each manylinux tag a wheel may carry literally, older ones included."""
    tags = platform_for(python).manylinux_tags
    abi = "cp" + python.replace(".", "")
    return ["--python-version", python, "--implementation", "cp",
            *[arg for tag in tags for arg in ("--platform", tag)],
            "--abi", abi, "--abi", "abi3", "--abi", "none"]


def read_manifest(path: Path) -> dict[str, str]:
    """``{file: sha256}`` of a manifest."""
    entries = {}
    for line in path.read_text().splitlines():
        digest, name = line.split("  ", 1)
        entries[name] = digest
    return entries


def fetch(lock: Lock, key: LockKey) -> tuple[Path, dict[str, str]]:
    """The folder with every wheel of LOCK and its ``{file: sha256}``; downloaded only what is
    missing, once per machine. LockError when a package has no wheel for the platform."""
    folder = wheel_dir(lock)
    manifest = folder / MANIFEST
    if manifest.exists():
        return folder, read_manifest(manifest)
    folder.mkdir(parents=True, exist_ok=True)
    linked = link_known(lock, folder)
    owner = owners(lock)
    names = sorted(set(lock.packages) - {owner[digest] for digest in linked.values()})
    # Biggest last in each slice would be nicer; a round robin spreads torch and the CUDA
    # libraries well enough over the slices.
    slices = [names[i::PARALLEL] for i in range(PARALLEL)]
    with tempfile.TemporaryDirectory(prefix="pve-sglang-fetch-") as scratch:
        def download(index: int) -> subprocess.CompletedProcess | None:
            if not slices[index]:
                return None
            requirements = Path(scratch) / f"slice-{index}.txt"
            requirements.write_text(lock.requirement_lines(slices[index]))
            return subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--only-binary=:all:", "--require-hashes", *platform_args(lock.python or key.python),
                 "--dest", str(folder), "-r", str(requirements)],
                capture_output=True, text=True, env={**os.environ, **index_env(key, "pip")},
            )

        with ThreadPoolExecutor(PARALLEL) as pool:
            failed = [done for done in pool.map(download, range(PARALLEL))
                      if done is not None and done.returncode]
    if failed:
        errors = [line for done in failed for line in done.stderr.splitlines()
                  if line.startswith("ERROR")]
        raise LockError(f"could not fetch the wheels of lock {lock.path} here (pip download): "
                        + "; ".join(errors[:5] or [failed[0].stderr.strip()[-800:]]))
    return folder, _write_manifest(lock, folder, linked)


def owners(lock: Lock) -> dict[str, str]:
    """``{sha256: package}`` of LOCK's hashes."""
    return {digest: name for name, digests in lock.hashes.items() for digest in digests}


def known_wheels(cache: Path, skip: Path) -> dict[str, Path]:
    """``{sha256: file}`` of the wheels the cache's complete sets hold (their manifests), SKIP's
    aside. A manifest that cannot be read counts as no set."""
    known: dict[str, Path] = {}
    for manifest in sorted(cache.glob(f"*/{MANIFEST}")):
        if manifest.parent == skip:
            continue
        try:
            entries = read_manifest(manifest)
        except (OSError, ValueError):
            continue
        for name, digest in entries.items():
            known.setdefault(digest, manifest.parent / name)
    return known


def link_known(lock: Lock, folder: Path) -> dict[str, str]:
    """Hard-link into FOLDER the wheels of LOCK that another complete set of the cache holds,
    each checked against the lock's sha256 first (a changed file is downloaded instead).
    Returns ``{file: sha256}`` of those linked; a link that fails (another filesystem, a file
    gone) is downloaded too."""
    known = known_wheels(folder.parent, folder)
    linked: dict[str, str] = {}
    for digests in lock.hashes.values():
        digest = next((digest for digest in digests if digest in known), None)
        if digest is None:
            continue
        source = known[digest]
        target = folder / source.name
        try:
            if file_digest(source) != digest:
                continue
            target.unlink(missing_ok=True)  # a killed fetch's leftover
            os.link(source, target)
        except OSError:
            continue
        linked[target.name] = digest
    return linked


def _write_manifest(lock: Lock, folder: Path, checked: dict[str, str]) -> dict[str, str]:
    """Check each downloaded file against the lock's hashes (those CHECKED, ``{file: sha256}``,
    were), one wheel a package; write the manifest last (its presence says the folder is
    complete)."""
    owner = owners(lock)
    entries: dict[str, str] = {}
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.whl")):
        digest = checked.get(path.name) or file_digest(path)
        name = owner.get(digest)
        if name is None or name in found:
            path.unlink()  # not of this lock, or a second file of one package: a stale leftover
            continue
        found[name] = path.name
        entries[path.name] = digest
    missing = sorted(set(lock.packages) - set(found))
    if missing:
        raise LockError(f"lock {lock.path}: no wheel fetched for {', '.join(missing[:5])}")
    partial = folder / (MANIFEST + ".partial")
    partial.write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items())))
    partial.replace(folder / MANIFEST)
    return entries


def total_bytes(folder: Path, entries: dict[str, str]) -> int:
    return sum((folder / name).stat().st_size for name in entries)
