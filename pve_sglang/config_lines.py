"""Container config lines the deploy owns, reconciled inside a file the user also edits.

Proxmox moves ``#`` lines of a container config into its description, so a block between
marker comments would not stay put; owned lines are recognised by their content instead
(NVIDIA device rules and mounts), and every other line is left as it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

# Raw LXC keys the GPU passthrough writes, in either config style ("k: v" or "k = v").
_OWNED = re.compile(
    r"^lxc\.(cgroup2?\.devices\.allow\s*[:=]\s*c\s+(?P<major>\d+):"
    r"|mount\.entry\s*[:=]\s*\S*/nvidia)"
)


def owned_by_gpu_passthrough(nvidia_majors: Iterable[int]) -> Callable[[str], bool]:
    """A predicate for the lines GPU passthrough owns: mounts of nvidia nodes, rules for its majors."""
    majors = {int(major) for major in nvidia_majors}

    def owned(line: str) -> bool:
        match = _OWNED.match(line.strip())
        if not match:
            return False
        major = match.group("major")
        return major is None or int(major) in majors

    return owned


def reconcile_lines(content: str, desired: list[str], owned: Callable[[str], bool]) -> str:
    """CONTENT with its owned lines replaced by DESIRED; unchanged when they already match.

    Only the main section counts: in a Proxmox config, ``[snapshot]`` sections follow it and
    keep their own copies. DESIRED goes where the first owned line was, else at the end of
    the main section.
    """
    lines = content.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    main, rest = lines[:end], lines[end:]
    current = [line for line in main if owned(line)]
    if current == desired:
        return content
    first = next((i for i, line in enumerate(main) if owned(line)), None)
    kept = [line for line in main if not owned(line)]
    if first is None:
        while kept and not kept[-1].strip():
            kept.pop()
        insert_at = len(kept)
    else:
        insert_at = sum(1 for line in main[:first] if not owned(line))
    new_main = kept[:insert_at] + desired + kept[insert_at:]
    while new_main and not new_main[-1].strip():
        new_main.pop()
    if rest:
        new_main.append("")
    return "\n".join(new_main + rest) + "\n"
