"""Move the default release set forward, on proof: ``make release VERSION=X``.

    python -m devtools.release advance X [--with KEY=YAML]...

Checks, cheapest first, and stops at the first that fails, with the repository unchanged:

1. the release's requirements (its wheel's METADATA) make a set (``stack.releases``);
2. the default settings with ``sglang_version: X`` validate (torch, flashinfer and the CUDA
   toolkit follow the release; ``--with`` sets more, as a hosts file would);
3. its lock for Debian 12 (``uv pip compile``, wheels only) is made, and every wheel of it is
   fetched into this machine's cache (``PVE_SGLANG_CACHE``), hashes checked;
4. the startup watch's log lines (``server.startup_log``: each phase, the shards bar, the KV
   cache line) occur in the release's own sources;
5. the server flags the settings render (one node, 8 GPUs, 2 nodes, an API key) are all
   flags of the release (read from its sources, as the deploy's in-container check reads them);
6. the proof (``devtools/release_proof.py``): the whole deploy of the set into a real
   unprivileged LXC container, from a wheel store with the shared layer, up to the deploy's
   flag check; the release's real argument parser then parses the unit's server flags and
   must neither refuse one nor call one deprecated; a second run changes nothing.

Then, and only then: the release's requirements go to ``group_data/releases/``, its lock to
``group_data/locks/`` (the previous default's lock goes; the presets' stay),
``sglang_version`` in ``group_data/all.py`` becomes X, and the settings table is written again.
Needs root, lxc (``make system-deps``), the package index and about 36 GB of free disk under
/var/tmp for the proof (a 0.5.23-sized set: 4.3 GB of wheels, 10 GB installed, and the
container's uv cache and the layer's staging on the way).
"""

from __future__ import annotations

import argparse
import functools
import io
import itertools
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from re import _parser as sre_parse  # the stdlib's regex parser: a pattern's literal text

import yaml

from pve_sglang.config import settings_table
from pve_sglang.config.settings import SettingsError, validate_container
from pve_sglang.project import ROOT, cache_dir, load_defaults
from pve_sglang.server import startup_log
from pve_sglang.server.command import EnvRef, check_flags, known_flags, server_argv
from pve_sglang.stack import lock as stack_lock
from pve_sglang.stack import releases
from pve_sglang.stack.wheel_fetch import fetch

#: The placeholder of a part of a log line the watch's pattern does not spell (``\d+``).
ANY = "\x00"


class NotProven(RuntimeError):
    """A check the release did not pass: the repository stays as it was."""


class DiskShort(NotProven):
    """The proof's container would not fit on this machine's disk now: nothing was proven or
    changed (a caller that can wait for room, a test, tells it from a failed check)."""


@dataclass
class Advance:
    """What ``advance`` found, step by step (``steps``: (name, seconds, what it says))."""

    version: str
    steps: list[tuple[str, float, str]] = field(default_factory=list)

    def step(self, name: str, started: float, words: str) -> None:
        self.steps.append((name, round(time.monotonic() - started, 1), words))
        print(f"[release] {name}: {words} ({self.steps[-1][1]} s)", flush=True)


# --- 4. log lines -------------------------------------------------------------------------

def _samples(parsed, limit: int = 16) -> list[str]:
    """The texts a parsed pattern spells, branches expanded (at most LIMIT), ANY where it
    spells no fixed text."""
    texts = [""]
    for op, value in parsed:
        name = str(op)
        if name == "LITERAL":
            texts = [text + chr(value) for text in texts]
        elif name == "BRANCH":
            options = [s for branch in value[1] for s in _samples(branch, limit)]
            texts = [text + option for text, option in itertools.product(texts, options)][:limit]
        elif name == "SUBPATTERN":
            options = _samples(value[-1], limit)
            texts = [text + option for text, option in itertools.product(texts, options)][:limit]
        elif name in ("AT",):
            continue
        else:
            texts = [text if text.endswith(ANY) else text + ANY for text in texts]
    return texts


def pattern_samples(pattern: re.Pattern) -> list[str]:
    """What PATTERN's alternatives spell (``Capture (?:cuda|piecewise CUDA) graph begin``:
    ``Capture cuda graph begin`` and ``Capture piecewise CUDA graph begin``)."""
    return _samples(sre_parse.parse(pattern.pattern, pattern.flags))


def _words(text: str) -> list[str]:
    return [word for word in re.split(r"\s+", text) if word]


def _fits(sample: list[str], literal: Sequence[str]) -> bool:
    """Whether the words of a SAMPLE occur in a source LITERAL's words, in order: a literal's
    ``{...}`` (an f-string's value) stands for one or two of the sample's words, ANY for one
    literal word; the ends compare as parts of a word (``begin`` fits ``begin.``). At least all
    but two of the sample's words, and two at least, must be the literal's own words: an
    f-string of placeholders alone proves nothing."""
    need = max(2, len(sample) - 2)

    def match(i: int, j: int, own: int) -> bool:
        if i == len(sample):
            return own >= need
        if j == len(literal):
            return False
        word, text = sample[i], literal[j]
        if re.fullmatch(r"\{[^{}]*\}\W*", text):
            return any(match(i + n, j + 1, own) for n in (1, 2) if i + n <= len(sample))
        if ANY in word:
            head, _, tail = word.partition(ANY)
            return (text.startswith(head) and tail.strip(ANY) in text
                    and match(i + 1, j + 1, own + bool(head or tail.strip(ANY))))
        last, first = i == len(sample) - 1, i == 0
        word, text = word.strip(".:,;!"), text.strip(".:,;!")  # tqdm adds the ': ' itself
        ok = (text == word or (last and text.startswith(word)) or (first and text.endswith(word))
              or (first and last and word in text))
        return ok and match(i + 1, j + 1, own + 1)

    return any(match(0, start, 0) for start in range(len(literal)))


def source_literals(wheel: Path) -> tuple[tuple[str, ...], ...]:
    """The words of every string literal (f-strings with their ``{...}``) in the release's
    ``sglang/`` Python sources, one tuple a literal; comments are not read (``tokenize``).
    Read once per wheel file (its path, size and time): tokenizing 3,000 files takes 12 s."""
    status = wheel.stat()
    return _literals(str(wheel), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _literals(wheel: str, size: int, mtime_ns: int) -> tuple[tuple[str, ...], ...]:
    import tokenize

    literals = []
    prefix = re.compile(r"^[rbfuRBFU]{0,2}")
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not (name.startswith("sglang/") and name.endswith(".py")):
                continue
            source = io.BytesIO(archive.read(name))
            try:
                for token in tokenize.tokenize(source.readline):
                    if token.type == tokenize.STRING:
                        body = prefix.sub("", token.string)
                        quote = body[:3] if body[:3] in ('"""', "'''") else body[:1]
                        words = _words(body[len(quote):-len(quote)])
                        if words:
                            literals.append(tuple(words))
            except (tokenize.TokenError, SyntaxError):
                continue  # a file tokenize cannot read: its strings are not counted
    return tuple(literals)


def missing_log_lines(wheel: Path) -> list[str]:
    """The watch's phases and formats of which no alternative occurs in the release's sources."""
    literals = source_literals(wheel)
    watched = [(f"phase {name!r}", pattern, False) for name, pattern in startup_log.PHASES] + [
        ("the shards bar (SHARDS)", startup_log.SHARDS, True),
        ("the KV cache line (KV_CACHE)", startup_log.KV_CACHE, True)]
    missing = []
    for what, pattern, head in watched:
        # A format (HEAD) is put together from several literals (tqdm's bar from its
        # description and BAR_FORMAT): its text up to the first value must be one of them.
        samples = [_words(sample.split(ANY)[0] if head else sample)
                   for sample in pattern_samples(pattern)]
        # A sample that is all placeholders proves nothing; uvicorn's own lines are not sglang's.
        samples = [s for s in samples if any(ANY not in word for word in s)]
        if not any(_fits(sample, words) for sample in samples for words in literals):
            missing.append(f"{what} ({pattern.pattern})")
    return missing


# --- 5. flags -----------------------------------------------------------------------------

#: The renderings checked: (words, settings overrides, GPUs, compute capabilities, nodes).
RENDERINGS = (
    ("one node, 8 GPUs (Blackwell)", {}, 8, ["12.0"] * 8, 1),
    ("one node, 8 GPUs (Hopper), an API key", {"api_key": "sk-x"}, 8, ["9.0"] * 8, 1),
    ("two nodes, rank 1", {"nodes": ["@lxc/a", "@lxc/b"], "tp_size": 16}, 8, ["9.0"] * 8, 2),
)


def flag_problems(wheel: Path, values: dict) -> list[str]:
    """What the release's flags (read from its sources) say of each rendering of VALUES."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name in ("sglang/srt/server_args.py", "sglang/_version.py", "sglang/version.py") \
                        or (name.startswith("sglang/srt/arg_groups/") and name.endswith(".py")):
                    archive.extract(name, tmp)
        known = known_flags(Path(tmp))
    problems = []
    for words, overrides, gpus, caps, nnodes in RENDERINGS:
        cs = validate_container("release", "check", {**values, **overrides}, {})
        rank = 1 if nnodes > 1 else None
        addr = "10.0.0.1:50000" if nnodes > 1 else None
        argv = server_argv(cs, gpus, caps, rank, nnodes, addr, "/opt/sglang/venv/bin/python")
        try:
            check_flags([a for a in argv if not isinstance(a, EnvRef)], known,
                        values["sglang_version"])
        except ValueError as error:
            problems.append(f"{words}: {error}")
    return problems


# --- the whole of it ----------------------------------------------------------------------

def _fail(report: Advance, name: str, started: float, problems: list[str],
          error: type[NotProven] = NotProven) -> None:
    report.step(name, started, "FAILED")
    raise error(f"sglang {report.version}: {name}: " + "; ".join(problems)
                + "; the repository is unchanged")


def advance(version: str, repo: Path = ROOT, overrides: dict | None = None,
            work: Path | None = None, proof: bool = True, site=None) -> Advance:
    """Prove sglang VERSION's set and make it REPO's default; NotProven, with REPO as it was,
    on the first check it fails. OVERRIDES: settings beside the defaults (``--with``). SITE: a
    ``release_proof.ReleaseDeploy`` that has deployed another set already, to prove this one
    in its container and wheel store (an upgrade there; the caller keeps and destroys it),
    instead of a new container and store of its own."""
    from devtools import release_proof

    report = Advance(version)
    defaults = load_defaults(repo / "group_data" / "all.py")
    values = {**defaults, **(overrides or {}), "sglang_version": version}
    work = Path(tempfile.mkdtemp(prefix="pve-sglang-release-", dir=work or "/var/tmp"))
    try:
        # 1. the release's requirements, kept in this machine's cache (not the repository) so
        # that the settings and the deploy below read them.
        started = time.monotonic()
        try:
            wheel_name, metadata = releases.fetch_metadata(version, values.get("pip_index_url"))
            record = releases.record_text(version, f"{wheel_name} (METADATA)", metadata)
            release = releases.parse_record(version, record)
        except releases.ReleaseError as error:
            _fail(report, "requirements", started, [str(error)])
        cached = releases.cache_dir() / f"sglang-{version}.txt"
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(record)
        report.step("requirements", started, release.describe())

        # 2. the settings.
        started = time.monotonic()
        try:
            values["stack_python"] = values.get("stack_python") or "3.11"  # Debian 12's
            cs = validate_container("release", version, values, {})
        except SettingsError as error:
            _fail(report, "settings", started, [str(error)])
        report.step("settings", started, f"torch {cs.torch_version}, flashinfer "
                    f"{cs.flashinfer_version}, Python {cs.stack_python}")

        # 3. the lock (staged) and its wheels.
        started = time.monotonic()
        key = stack_lock.key_of(cs)
        staged = work / "locks" / key.name
        try:
            lock = stack_lock.compile_lock(key, staged)
            folder, entries = fetch(lock, key)
        except stack_lock.LockError as error:
            _fail(report, "lock", started, [str(error)])
        [wheel] = [folder / name for name in entries if name.startswith(f"sglang-{version}-")]
        report.step("lock", started, f"{lock.summary()}, id {lock.id}; {len(entries)} wheels here")

        # 4. the startup watch's lines in the release's sources.
        started = time.monotonic()
        missing = missing_log_lines(wheel)
        if missing:
            _fail(report, "log lines", started, [f"no line of its sources fits {m}" for m in missing])
        report.step("log lines", started, "every phase and format the watch reads occurs")

        # 5. the rendered flags against the release's own.
        started = time.monotonic()
        problems = flag_problems(wheel, values)
        if problems:
            _fail(report, "flags", started, problems)
        report.step("flags", started, f"{len(RENDERINGS)} renderings, every flag the release's")

        # 6. the proof in a real container.
        if proof:
            started = time.monotonic()
            short = release_proof.disk_shortfall(work) if site is None else \
                release_proof.disk_shortfall(site.root, release_proof.UPGRADE_BYTES)
            if short:
                _fail(report, "deploy", started, [short], DiskShort)
            deploy = site or release_proof.ReleaseDeploy(
                work / "proof", version, _uv_wheel(work, defaults["uv_version"]), cache_dir())
            before = dict(deploy.container)
            deploy.container.update({"sglang_version": version, "stack_lock": str(staged),
                                     **(overrides or {})})
            try:
                problems = prove(deploy, version)
            finally:
                if site is None:
                    deploy.destroy()
                else:  # the staged lock goes with WORK: the site keeps its own settings
                    deploy.container.clear()
                    deploy.container.update(before)
            if problems:
                _fail(report, "deploy", started, problems)
            report.step("deploy", started, "deployed, flags parsed by the release's parser, "
                        "converged")

        # Proven: the repository takes the release as its default.
        started = time.monotonic()
        write_default(repo, version, record, staged, defaults)
        report.step("repository", started, f"sglang_version = {version!r}")
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prove(deploy, version: str) -> list[str]:
    """The deploy of DEPLOY's set, the real parser on its unit, and a second run: problems."""
    import json

    from devtools.release_proof import changed, failed

    done = deploy.run_cli()
    if done.returncode != 0:
        return [f"the deploy failed: {done.stderr[-3000:]}"]
    results = json.loads(done.stdout)
    if failed(results):
        return [f"operations failed: {failed(results)}"]
    flag_check = [op for op in results["results"]["operations"]
                  if op["name"].endswith(f"Server flags exist in sglang {version}")]
    if not flag_check:
        return ["the deploy ran no flag check"]
    problems = deploy.real_parser().problems
    again = deploy.run_cli()
    if again.returncode != 0 or changed(json.loads(again.stdout)):
        problems.append("a second run changed "
                        f"{changed(json.loads(again.stdout)) if again.returncode == 0 else again.stderr[-2000:]}")
    return problems


def write_default(repo: Path, version: str, record: str, lock: Path, defaults: dict) -> None:
    """REPO's default becomes VERSION: its requirements, its lock (the previous default's lock
    goes, a preset's stays), ``sglang_version`` in group_data/all.py, the settings table."""
    group_data = repo / "group_data"
    (group_data / "releases" / f"sglang-{version}.txt").write_text(record)
    presets = {stack_lock.key_of({**defaults, "stack_python": defaults.get("stack_python") or "3.11",
                                  **preset}).name for preset in stack_lock.PRESETS.values()}
    for old in (group_data / "locks").glob("*.txt"):
        if old.name not in presets:
            old.unlink()
    shutil.copy(lock, group_data / "locks" / lock.name)
    all_py = group_data / "all.py"
    text, count = re.subn(r'(?m)^sglang_version = "[^"]*"$', f'sglang_version = "{version}"',
                          all_py.read_text())
    if count != 1:
        raise NotProven(f"{all_py}: no one line 'sglang_version = \"...\"' to set")
    all_py.write_text(text)
    doc = repo / settings_table.DOC
    if doc.exists():
        doc.write_text(settings_table.replace_table(doc.read_text(), settings_table.markdown(all_py)))


def _uv_wheel(dest: Path, version: str) -> Path:
    """uv's wheel (the container's tools venv installs it with pip, offline), into DEST."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.11", "--platform", "manylinux_2_17_x86_64",
         "--platform", "manylinux2014_x86_64", f"uv=={version}", "-d", str(dest)],
        capture_output=True, text=True, timeout=600)
    found = sorted(dest.glob(f"uv-{version}-*.whl"))
    if done.returncode != 0 or not found:
        raise NotProven(f"uv {version}'s wheel could not be fetched: {done.stderr[-500:]}")
    return found[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.release",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    move = sub.add_parser("advance", help="prove sglang VERSION's set and make it the default")
    move.add_argument("version")
    move.add_argument("--with", dest="overrides", action="append", default=[],
                      metavar="KEY=YAML", help="a setting beside the defaults, as in a hosts file")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.overrides:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    try:
        report = advance(args.version, overrides=overrides)
    except NotProven as error:
        print(f"[release] not proven: {error}", file=sys.stderr)
        return 1
    print(f"[release] sglang {report.version} is the default now")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
