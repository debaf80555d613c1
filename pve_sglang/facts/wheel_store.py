"""Facts of a host's wheel store for its retention (``stack.store_retention``): its locks, their
wheels, the containers' records, and which containers' configs mount it, in one read."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from pve_sglang.runtime.pyinfra_private import joined
from pve_sglang.stack.store_retention import LOCKS, REMOVING, USERS, StoreLock, user_locks

#: Where a Proxmox host keeps its containers' configs (``<vmid>.conf``).
PVE_CONFIGS = "/etc/pve/lxc"


class WheelStoreState(FactBase[dict]):
    """
    Returns ``{"locks": {id: StoreLock}, "users": {key: lock ids or None}, "sizes": {wheel:
    bytes}, "configs": {container key: its mount lines}}`` of STORE, and of the containers of
    PLATFORM (``pve``: ``/etc/pve/lxc/<vmid>.conf``; ``lxc``: ``LXC_PATH/<name>/config``).
    """

    @override
    def command(self, store: str, platform: str, lxc_path: str) -> StringCommand:
        if platform == "pve":
            configs = joined("c=", QuoteString(PVE_CONFIGS),
                             '; for f in "$c"/*.conf; do k="pct-$(basename "$f" .conf)"; ')
        else:
            configs = joined("c=", QuoteString(lxc_path.rstrip("/")), '; for f in "$c"/*/config; '
                             'do k="lxc-$(basename "$(dirname "$f")")"; ')
        return joined(
            # The configs first: a container mounting the store counts even when it is empty.
            configs, '[ -f "$f" ] || continue; '
            "grep -E '^[[:space:]]*(mp[0-9]+[[:space:]]*:|lxc\\.mount\\.(entry|fstab))' \"$f\" "
            '| while IFS= read -r l; do printf \'mount|%s|%s\\n\' "$k" "$l"; done; done; ',
            "cd ", QuoteString(store), " 2>/dev/null || exit 0; ",
            "for f in ", QuoteString(LOCKS), "/*; do [ -f \"$f\" ] || continue; ",
            'case "$f" in *.layer) continue;; esac; ',
            'printf \'lock|%s|%s\\n\' "$(basename "$f")" "$(stat -c %Y "$f")"; ',
            "sed 's/^/wheel|/' \"$f\"; done; ",
            "for f in ", QuoteString(USERS), "/*.json; do [ -f \"$f\" ] || continue; ",
            'printf \'user|%s|%s\\n\' "$(basename "$f" .json)" "$(tr -d \'\\n\' < "$f")"; done; ',
            "find . -maxdepth 1 -type f -name '*.whl' -printf 'size|%s|%f\\n'; true",
        )

    @staticmethod
    @override
    def default() -> dict:
        return {"locks": {}, "users": {}, "sizes": {}, "configs": {}}

    @override
    def process(self, output: list[str]) -> dict:
        found = self.default()
        wheels: dict[str, list[str]] = {}
        lock_id = None
        for line in output:
            what, _, rest = line.rstrip("\n").partition("|")
            if what == "mount":
                key, _, text = rest.partition("|")
                found["configs"].setdefault(key, []).append(text)
            elif what == "lock":
                name, _, mtime = rest.rpartition("|")
                removing = name.endswith(REMOVING)
                lock_id = name.removesuffix(REMOVING)
                old = found["locks"].get(lock_id)
                wheels.setdefault(lock_id, [])
                found["locks"][lock_id] = StoreLock(
                    mtime=max(float(mtime or 0), old.mtime if old else 0.0),
                    complete=(old.complete if old else False) or not removing,
                    removing=(old.removing if old else False) or removing)
            elif what == "wheel" and lock_id is not None:
                # A manifest line: ``<sha256>  <file name>``.
                _, _, name = rest.partition("  ")
                if name:
                    wheels[lock_id].append(name)
            elif what == "user":
                key, _, text = rest.partition("|")
                found["users"][key] = user_locks(text)
            elif what == "size":
                size, _, name = rest.partition("|")
                found["sizes"][name] = int(size or 0)
        for lock_id, names in wheels.items():
            found["locks"][lock_id] = found["locks"][lock_id]._replace(
                wheels=tuple(sorted(set(names))))
        return found


class FolderSizes(FactBase[dict]):
    """Returns ``{path: bytes}`` of PATHS that exist (``du -sb``): what a removal frees."""

    @override
    def command(self, paths: list[str]) -> StringCommand:
        return StringCommand("for p in", *(QuoteString(p) for p in paths),
                             '; do [ ! -e "$p" ] || du -sb -- "$p"; done; true')

    @override
    def process(self, output: list[str]) -> dict:
        sizes = {}
        for line in output:
            size, _, path = line.partition("\t")
            if size.isdigit():
                sizes[path] = int(size)
        return sizes
