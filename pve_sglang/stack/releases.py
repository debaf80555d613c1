"""A release set: what one sglang release needs, read from its own wheel metadata.

``sglang_version`` alone picks the set: torch, flashinfer-python, the kernel package (renamed
``sgl-kernel`` -> ``sglang-kernel`` in 0.5.10) and the CUDA major follow from the release's
``Requires-Dist`` lines (``cuda-python==12.9`` -> CUDA 12.9, ``cuda-python>=13.0`` -> CUDA 13.0).
A version the user pins is kept only where the release allows it.

The requirements of a release come from, in order: the repository's records
(``group_data/releases/``), this machine's cache (``$PVE_SGLANG_CACHE/releases``), else the
release's wheel, fetched once with ``pip download --no-deps`` (the pip of the Python running
pyinfra; the index from ``pip_index_url`` when set) and its METADATA recorded in the cache.

    python -m pve_sglang.stack.releases record VERSION   # into group_data/releases/
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from pve_sglang.project import ROOT, cache_dir as machine_cache

#: The requirements of releases, recorded from their wheels, in the checkout.
RECORDED = ROOT / "group_data" / "releases"
#: The kernel package, by its name before and after 0.5.10's rename.
KERNEL_PACKAGES = ("sgl-kernel", "sglang-kernel")
#: The platform the wheel is fetched for: every release has a cp311 wheel for it (sglang's
#: requirements do not vary by platform on x86_64 Linux).
FETCH_TAGS = ("--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
              "--platform", "any", "--only-binary=:all:")


class ReleaseError(ValueError):
    """A release whose requirements cannot be read, or do not name what a set needs."""


@dataclass(frozen=True)
class ReleaseSet:
    """The versions one sglang release pins, and what it needs around them."""

    sglang: str
    torch: SpecifierSet
    flashinfer: SpecifierSet
    kernel_package: str
    kernel: SpecifierSet
    cuda: tuple[int, int]  # the CUDA major and minor its cuda-python names
    requires_python: SpecifierSet

    cuda_spec: SpecifierSet = SpecifierSet()  # cuda-python's specifier, as the release writes it

    @property
    def cuda_text(self) -> str:
        return f"{self.cuda[0]}.{self.cuda[1]}"

    @property
    def cuda_spec_text(self) -> str:
        return str(self.cuda_spec)

    def describe(self) -> str:
        return (f"sglang {self.sglang}: torch{self.torch}, flashinfer-python{self.flashinfer}, "
                f"{self.kernel_package}{self.kernel}, CUDA {self.cuda_text}, "
                f"Python{self.requires_python}")


def requirement_lines(metadata: str) -> tuple[str | None, list[str]]:
    """The Requires-Python value and the Requires-Dist lines of a METADATA text."""
    message = email.parser.HeaderParser().parsestr(metadata)
    return message.get("Requires-Python"), message.get_all("Requires-Dist") or []


def _exact(spec: SpecifierSet) -> str | None:
    """The version an ``==X`` specifier names, else None."""
    [*items] = spec
    if len(items) == 1 and items[0].operator == "==" and "*" not in items[0].version:
        return items[0].version
    return None


def release_set(sglang: str, requires_python: str | None, requires: list[str]) -> ReleaseSet:
    """The release set of sglang SGLANG from its Requires-Python and Requires-Dist lines."""
    found: dict[str, SpecifierSet] = {}
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement as error:
            raise ReleaseError(f"sglang {sglang}: requirement {line!r} unreadable: {error}") from None
        # Only what the plain install needs (no extra), on x86_64 Linux.
        env = {"extra": "", "sys_platform": "linux", "platform_machine": "x86_64",
               "platform_system": "Linux"}
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            continue
        found[canonicalize_name(requirement.name)] = requirement.specifier
    kernels = [name for name in KERNEL_PACKAGES if name in found]
    missing = [name for name in ("torch", "flashinfer-python", "cuda-python") if name not in found]
    if missing or not kernels:
        raise ReleaseError(f"sglang {sglang}: its requirements name no "
                           f"{', '.join(missing or ['kernel package (' + ' or '.join(KERNEL_PACKAGES) + ')'])}; "
                           "allowed: a release from 0.5.8 on")
    cuda_spec = found["cuda-python"]
    cuda_version = _exact(cuda_spec) or next(
        (s.version for s in cuda_spec if s.operator in (">=", "~=", "==")), None)
    if cuda_version is None:
        raise ReleaseError(f"sglang {sglang}: cuda-python{cuda_spec} names no CUDA version")
    release = Version(cuda_version).release
    return ReleaseSet(
        sglang=sglang, torch=found["torch"], flashinfer=found["flashinfer-python"],
        kernel_package=kernels[0], kernel=found[kernels[0]],
        cuda=(release[0], release[1] if len(release) > 1 else 0),
        requires_python=SpecifierSet(requires_python or ""),
        cuda_spec=cuda_spec,
    )


def pinned(release: ReleaseSet, what: str, spec: SpecifierSet, pin: str | None) -> str:
    """The version of WHAT (``torch``, ``flashinfer-python``) in the set: the user's PIN when
    the release allows it, else the release's own ``==`` version; ReleaseError when the pin is
    not allowed, naming both versions."""
    own = _exact(spec)
    if pin is not None:
        if spec.contains(pin, prereleases=True):
            return pin
        raise ReleaseError(f"sglang {release.sglang} requires {what}{spec}, not {pin}; allowed: "
                           f"{own or 'a version ' + str(spec) + ' allows'}, or null to follow "
                           "the release")
    if own is None:
        raise ReleaseError(f"sglang {release.sglang} requires {what}{spec}, not one version: "
                           "pin one it allows")
    return own


@dataclass(frozen=True)
class ChosenSet:
    """The versions a container installs: its release set, with torch and flashinfer chosen."""

    release: ReleaseSet
    torch: str
    flashinfer: str


def choose(release: ReleaseSet, torch: str | None, flashinfer: str | None,
           python: str | None = None) -> ChosenSet:
    """RELEASE with the user's pins (None: follow the release) checked against it, and the
    containers' PYTHON against its Requires-Python. ReleaseError names the field."""
    chosen = []
    for field, what, spec, pin in (("torch_version", "torch", release.torch, torch),
                                   ("flashinfer_version", "flashinfer-python",
                                    release.flashinfer, flashinfer)):
        try:
            chosen.append(pinned(release, what, spec, pin))
        except ReleaseError as error:
            raise ReleaseError(f"field '{field}' = {pin!r}: {error}") from None
    if python is not None and not release.requires_python.contains(f"{python}.0"):
        raise ReleaseError(f"field 'stack_python' = {python!r}: sglang {release.sglang} requires "
                           f"Python{release.requires_python}; allowed: a container release "
                           "whose python3 it allows")
    return ChosenSet(release, *chosen)


def toolkit_pin(release: ReleaseSet, pin: str | None) -> str | None:
    """The user's ``cuda_toolkit_version`` PIN when its CUDA major is the release's (FlashInfer's
    JIT compiles against torch's CUDA: another major does not link), else ReleaseError naming
    both; None (follow the set) stays None."""
    if pin is None or int(pin.split(".")[0]) == release.cuda[0]:
        return pin
    raise ReleaseError(f"field 'cuda_toolkit_version' = {pin!r}: sglang {release.sglang} runs "
                       f"CUDA {release.cuda[0]} (cuda-python{release.cuda_spec_text}), not "
                       f"CUDA {pin.split('.')[0]}; allowed: a {release.cuda[0]}.x toolkit, or "
                       "null to follow the release")


#: The CUDA runtime package torch's PyPI wheels depend on, before and after CUDA 13.
CUDA_RUNTIME_PACKAGES = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime")


def toolkit_version(release: ReleaseSet, pin: str | None, locked: dict[str, str]) -> str:
    """The CUDA toolkit (``MAJOR.MINOR``) FlashInfer's JIT gets: the user's PIN, else the CUDA of
    the torch the set locks (its runtime package in LOCKED, ``{name: version}``: torch 2.9.1 ->
    12.8, torch 2.14.1 -> 13.0), else the release's own CUDA (cuda-python's)."""
    if pin is not None:
        return pin
    for name in CUDA_RUNTIME_PACKAGES:
        version = locked.get(name)
        if version and Version(version).release[0] == release.cuda[0]:
            major, minor = Version(version).release[:2]
            return f"{major}.{minor}"
    return release.cuda_text


# --- where a release's requirements come from -----------------------------------------------

def record_text(sglang: str, source: str, metadata: str) -> str:
    """The recorded form of a release's requirements: a header naming its SOURCE, then its
    Requires-Python and Requires-Dist lines as METADATA spells them."""
    requires_python, requires = requirement_lines(metadata)
    lines = [f"# sglang {sglang}: the requirements of {source}"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Requires-Dist: {line}" for line in requires]
    return "\n".join(lines) + "\n"


def parse_record(sglang: str, text: str) -> ReleaseSet:
    requires_python, requires = requirement_lines(
        "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n")
    return release_set(sglang, requires_python, requires)


def cache_dir() -> Path:
    """Where release requirements fetched on this machine are kept."""
    return machine_cache() / "releases"


def fetch_metadata(sglang: str, index_url: str | None = None) -> tuple[str, str]:
    """The wheel file name and METADATA of sglang SGLANG, with pip (no dependencies)."""
    env = {**os.environ, **({"PIP_INDEX_URL": index_url} if index_url else {})}
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *FETCH_TAGS,
             "--dest", tmp, f"sglang=={sglang}"],
            capture_output=True, text=True, timeout=600, env=env)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ReleaseError(f"sglang {sglang}: could not fetch its wheel to read its "
                               f"requirements (pip download): {done.stderr.strip()[-800:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            return wheels[0].name, wheel.read(name).decode()


def read_release(sglang: str, index_url: str | None = None, fetch: bool = True) -> ReleaseSet:
    """The release set of SGLANG: recorded, cached, else fetched and cached (FETCH)."""
    for folder in (RECORDED, cache_dir()):
        path = folder / f"sglang-{sglang}.txt"
        if path.exists():
            return parse_record(sglang, path.read_text())
    if not fetch:
        raise ReleaseError(f"sglang {sglang}: its requirements are not recorded here")
    wheel, metadata = fetch_metadata(sglang, index_url)
    text = record_text(sglang, f"{wheel} (METADATA)", metadata)
    release = parse_record(sglang, text)  # before caching: an unusable release is not kept
    path = cache_dir() / f"sglang-{sglang}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".partial").write_text(text)
    path.with_suffix(".partial").replace(path)
    return release


def main(argv: list[str]) -> int:
    if argv[:1] == ["record"] and len(argv) == 2:
        wheel, metadata = fetch_metadata(argv[1])
        dest = RECORDED / f"sglang-{argv[1]}.txt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(record_text(argv[1], f"{wheel} (METADATA)", metadata))
        print(f"{dest.relative_to(ROOT)}: {parse_record(argv[1], dest.read_text()).describe()}")
        return 0
    print("usage: python -m pve_sglang.stack.releases record VERSION", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
