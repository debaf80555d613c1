"""
GPU peer-to-peer preflight: what the topology allows, what the driver reports, what a copy
measures, and what to do when they disagree.

Inputs:
- ``nvidia-smi topo -m``: the link between each GPU pair (``X``, ``NV#``, ``PIX``, ``PXB``, ``PHB``,
  ``NODE``, ``SYS``), plus CPU/NUMA affinity.
- ``nvidia-smi topo -p2p r`` / ``-p2p w``: the driver's P2P read/write status per pair (``OK``,
  ``CNS``, ``GNS``, ``TNS``, ``NS``, ``U``).
- the JSON of ``gpu_checks.py p2p`` (torch's ``can_device_access_peer`` and measured GB/s).

``build_report`` combines them into one entry per ordered GPU pair, warnings and advice;
``format_report`` renders it with a bandwidth matrix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV(\d+)$")

P2P_STATUS_MEANING = {
    "X": "self",
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
}

# Links over which P2P should work on a healthy bare-metal or LXC host.
P2P_EXPECTED_PREFIXES = ("NV", "PIX", "PXB")

ADVICE_VM = (
    "This host is a virtual machine ({virt}): with VFIO passthrough the guest sees a flat, "
    "made-up PCIe topology and P2P falls back through host memory or hangs. Run the GPUs on the "
    "Proxmox host in an LXC container instead (it sees the host's real topology)."
)
ADVICE_IOMMU = (
    "With the IOMMU in translated mode, peer traffic is remapped or blocked: boot the host with "
    "iommu=pt (with intel_iommu=on / amd_iommu=on) and check `lspci -vvv | grep ACSCtl`."
)
ADVICE_ACS = (
    "PCIe bridges with ACS redirection on (ReqRedir+/CmpltRedir+: {bridges}) route P2P through "
    "the root complex: disable ACS on the GPUs' switch ports in the BIOS, or clear ACSCtl with "
    "setpci at boot (only on hosts that need no IOMMU isolation between those devices)."
)
ADVICE_LAST_RESORT = (
    "Last resort: NCCL_P2P_DISABLE=1 in the SGLang environment makes NCCL avoid P2P (slower "
    "all-reduce, but no hangs)."
)


def _tokens(line: str, header: bool) -> list[str]:
    """
    Cells of one matrix line. nvidia-smi separates them with tabs (and pads some with spaces,
    ``" X "``, or doubles a tab before ``GPU NUMA ID``); copies pasted into issues and forum posts
    often have the tabs turned into runs of spaces. Header names may hold single spaces
    (``CPU Affinity``); the cells of a row never do.
    """
    line = _ANSI.sub("", line).rstrip("\n")
    if "\t" in line:
        cells = line.split("\t")
    else:
        cells = re.split(r"\s{2,}" if header else r"\s+", line)
    return [cell.strip() for cell in cells if cell.strip()]


def _parse_gpu_matrix(text: str) -> tuple[list[int], dict[tuple[int, int], str], dict[int, dict]]:
    """
    The GPU matrix that ``nvidia-smi topo -m`` and ``topo -p2p X`` print: the header names the
    columns (GPU0..., then NICs and affinities for ``-m``), each ``GPUn`` row gives a cell per
    column. Returns (GPU indices, {(row, column): cell}, {row: {other column: cell}}).
    """
    header: list[str] | None = None
    cells: dict[tuple[int, int], str] = {}
    extra: dict[int, dict] = {}
    for raw in text.splitlines():
        if not raw.strip():
            if header is not None and cells:
                break  # the legend follows the matrix
            continue
        if header is None:
            names = _tokens(raw, header=True)
            if names and _GPU.match(names[0]):
                header = names
            continue
        row = _tokens(raw, header=False)
        if not row:
            continue
        match = _GPU.match(row[0])
        if not match:
            continue  # NIC rows of topo -m, or the legend
        src = int(match.group(1))
        for name, value in zip(header, row[1:]):
            gpu = _GPU.match(name)
            if gpu:
                cells[(src, int(gpu.group(1)))] = value
            else:
                extra.setdefault(src, {})[name] = value
    gpus = sorted({src for src, _ in cells} | {dst for _, dst in cells})
    return gpus, cells, extra


def _square(cells: dict[tuple[int, int], str]) -> tuple[list[int], list[list[str | None]]]:
    gpus = sorted({src for src, _ in cells} | {dst for _, dst in cells})
    position = {gpu: i for i, gpu in enumerate(gpus)}
    matrix: list[list[str | None]] = [[None] * len(gpus) for _ in gpus]
    for (src, dst), value in cells.items():
        matrix[position[src]][position[dst]] = value
    return gpus, matrix


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """
    ``nvidia-smi topo -m`` -> ``{"gpus": [0, 1], "matrix": [["X", "NV18"], ["NV18", "X"]],
    "affinity": {"0": {"CPU Affinity": "0-47", "NUMA Affinity": "0", ...}}, "nics": {...}}``:
    ``matrix[i][j]`` is the link from ``gpus[i]`` to ``gpus[j]``. Columns other than GPUs go to
    ``nics`` (NIC0...) and ``affinity`` (the rest), keyed by the GPU index as a string.
    """
    _, cells, extra = _parse_gpu_matrix(text)
    gpus, matrix = _square(cells)
    affinity: dict[str, dict[str, str]] = {}
    nics: dict[str, dict[str, str]] = {}
    for gpu, columns in extra.items():
        for name, value in columns.items():
            target = nics if re.match(r"^(NIC|mlx)\w*\d+$", name) else affinity
            target.setdefault(str(gpu), {})[name] = value
    return {"gpus": gpus, "matrix": matrix, "affinity": affinity, "nics": nics}


def parse_p2p_matrix(text: str) -> dict[str, Any]:
    """``nvidia-smi topo -p2p r|w|n|a|p`` -> ``{"gpus": [0, 1], "matrix": [["X", "OK"], ["OK", "X"]]}``."""
    _, cells, _ = _parse_gpu_matrix(text)
    gpus, matrix = _square(cells)
    return {"gpus": gpus, "matrix": matrix}


def matrix_pairs(parsed: dict[str, Any] | str | None, parse=parse_p2p_matrix) -> dict[tuple[int, int], str]:
    """A parsed matrix (or its text) as ``{(src, dst): value}``."""
    if parsed is None:
        return {}
    matrix: dict[str, Any] = parse(parsed) if isinstance(parsed, str) else parsed
    gpus = matrix.get("gpus") or []
    return {
        (src, dst): value
        for i, src in enumerate(gpus)
        for j, dst in enumerate(gpus)
        if (value := matrix["matrix"][i][j]) is not None
    }


def link_kind(link: str | None) -> str | None:
    """``NV18`` -> ``NV``; other codes as they are."""
    if link is None:
        return None
    return "NV" if _NVLINK.match(link) else link


def p2p_expected(link: str | None) -> bool:
    return link is not None and link.startswith(P2P_EXPECTED_PREFIXES)


def _checks_by_pair(checks: dict | None) -> dict[tuple[int, int], dict]:
    if not checks:
        return {}
    return {(entry["src"], entry["dst"]): entry for entry in checks.get("pairs", [])}


def build_report(
    topo: dict[str, Any] | str | None,
    p2p_read: dict[str, Any] | str | None = None,
    p2p_write: dict[str, Any] | str | None = None,
    checks: dict | None = None,
    virt: str | None = None,
    iommu_acs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """
    TOPO, P2P_READ and P2P_WRITE are the parsed matrices (the ``NvidiaTopoMatrix`` and
    ``NvidiaP2pMatrix`` facts) or the raw ``nvidia-smi topo`` text. Returns one entry per ordered GPU pair with ``link``, ``p2p_read``, ``p2p_write``, ``can_access_peer``,
    ``gbps`` and ``data_ok`` (None where the input was not given), plus ``warnings`` and
    ``advice`` (strings) and the inputs' summaries. ``virt`` is ``systemd-detect-virt --vm``;
    ``iommu_acs`` the ``IommuAcs`` fact.
    """
    if isinstance(topo, str):
        topo = parse_topo_matrix(topo)
    topo = topo or {"gpus": [], "matrix": [], "affinity": {}}
    gpus, pairs = _pairs(topo, p2p_read, p2p_write, checks)
    warnings, missing = _pair_warnings(pairs)
    slow, slow_warnings = _slow_pairs(pairs)
    warnings += slow_warnings
    advice: list[str] = []
    in_vm = virt not in (None, "", "none")
    if missing or slow or any(pair["data_ok"] is False for pair in pairs):
        advice = _advice(virt if in_vm else None, iommu_acs)
    elif in_vm and len(gpus) > 1:
        warnings.append(
            f"This host is a VM ({virt}): its P2P topology may not be the real one "
            "(VFIO); check the bandwidth matrix."
        )
    notes = _notes(pairs, gpus, checks)
    if checks is not None and checks.get("error"):
        warnings.append(f"gpu_checks p2p failed: {checks['error']}")
        if checks.get("hint"):
            advice.append(checks["hint"])

    return {
        "gpus": gpus,
        "pairs": pairs,
        "local_gbps": {
            entry["src"]: entry.get("gbps") for entry in (checks or {}).get("local", []) or []
        },
        "affinity": topo.get("affinity", {}),
        "virt": virt,
        "warnings": warnings,
        "advice": advice,
        "notes": notes,
        "ok": not warnings,
    }


def _pairs(topo: dict[str, Any], p2p_read, p2p_write, checks: dict | None,
           ) -> tuple[list[int], list[dict[str, Any]]]:
    """The GPUs any input names, and one entry per ordered pair of them with what each input
    says of it."""
    links = matrix_pairs(topo)
    reads = matrix_pairs(p2p_read)
    writes = matrix_pairs(p2p_write)
    measured = _checks_by_pair(checks)
    gpus = sorted(set(topo["gpus"]) | {s for s, _ in reads} | {s for s, _ in measured})
    if checks and checks.get("device_count"):
        gpus = sorted(set(gpus) | set(range(checks["device_count"])))
    pairs = []
    for src in gpus:
        for dst in gpus:
            if src == dst:
                continue
            link = links.get((src, dst))
            check = measured.get((src, dst), {})
            pairs.append({
                "src": src,
                "dst": dst,
                "link": link,
                "p2p_expected": p2p_expected(link),
                "p2p_read": reads.get((src, dst)),
                "p2p_write": writes.get((src, dst)),
                "can_access_peer": check.get("can_access_peer"),
                "gbps": check.get("gbps"),
                "data_ok": check.get("data_ok"),
                "error": check.get("error"),
            })
    return gpus, pairs


def _pair_warnings(pairs: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Warnings for copies that failed or delivered wrong data, and for pairs whose link allows
    P2P but that lack it; the second list holds the latter pairs."""
    warnings: list[str] = []
    missing: list[dict] = []
    for pair in pairs:
        name = f"GPU{pair['src']}->GPU{pair['dst']}"
        if pair["data_ok"] is False:
            warnings.append(
                f"{name}: the copy {'failed' if pair['error'] else 'delivered wrong data'}"
                f"{': ' + pair['error'] if pair['error'] else ''} (link {pair['link']})."
            )
        if not pair["p2p_expected"]:
            continue
        problems = []
        for key, label in (("p2p_read", "P2P read"), ("p2p_write", "P2P write")):
            if pair[key] is not None and pair[key] != "OK":
                meaning = P2P_STATUS_MEANING.get(pair[key], pair[key])
                problems.append(f"{label} {pair[key]} ({meaning})")
        if pair["can_access_peer"] is False:
            problems.append("torch.cuda.can_device_access_peer is False")
        if problems:
            missing.append(pair)
            warnings.append(
                f"{name}: P2P missing although the topology allows it (link {pair['link']}): "
                + ", ".join(problems) + "."
            )
    return warnings, missing


def _slow_pairs(pairs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Slow pairs: under half the best pair over the same kind of link, and their warnings."""
    best: dict[str, float] = {}
    for pair in pairs:
        kind = link_kind(pair["link"]) or "?"
        if pair["gbps"]:
            best[kind] = max(best.get(kind, 0.0), pair["gbps"])
    slow: list[dict] = []
    warnings: list[str] = []
    for pair in pairs:
        kind = link_kind(pair["link"]) or "?"
        if pair["gbps"] and best.get(kind) and pair["gbps"] < 0.5 * best[kind]:
            slow.append(pair)
            warnings.append(
                f"GPU{pair['src']}->GPU{pair['dst']}: {pair['gbps']:.1f} GB/s, under half of the "
                f"best {kind} pair ({best[kind]:.1f} GB/s)."
            )
    return slow, warnings


def _advice(vm: str | None, iommu_acs: Mapping[str, Any] | None) -> list[str]:
    """What to try when P2P is missing, slow or wrong: on a VM (VM: its kind), the IOMMU,
    the bridges whose ACS redirects P2P, and the last resort."""
    advice = [ADVICE_VM.format(virt=vm)] if vm else []
    if iommu_acs is None or not iommu_acs.get("iommu_passthrough"):
        advice.append(ADVICE_IOMMU)
    redirect = (iommu_acs or {}).get("p2p_redirect") or []
    if redirect:
        advice.append(ADVICE_ACS.format(bridges=", ".join(redirect)))
    advice.append(ADVICE_LAST_RESORT)
    return advice


def _notes(pairs: list[dict[str, Any]], gpus: list[int], checks: dict | None) -> list[str]:
    """What is not a problem but worth saying: links without P2P by design, too few GPUs, and
    bandwidth not measured."""
    notes = []
    by_design = sorted({
        (min(p["src"], p["dst"]), max(p["src"], p["dst"]), p["link"], p["p2p_read"])
        for p in pairs
        if not p["p2p_expected"] and p["p2p_read"] not in (None, "OK", "X")
    })
    for src, dst, link, status in by_design:
        notes.append(
            f"GPU{src}<->GPU{dst}: {link}, P2P {status} "
            f"({P2P_STATUS_MEANING.get(status, status)}): no P2P over this link; NCCL uses "
            "host memory (SHM) between them."
        )
    if len(gpus) < 2:
        notes.append(f"{len(gpus)} GPU(s): no GPU pairs, nothing to check for P2P.")
    if checks is None:
        notes.append(
            "Bandwidth not measured: no gpu_checks.py p2p result (give a python that holds "
            "torch, host data p2p_python)."
        )
    return notes


def format_matrix(gpus: list[int], value, width: int = 9) -> str:
    """A square text matrix; ``value(src, dst)`` gives each cell's text."""
    head = "".ljust(7) + "".join(f"GPU{dst}".rjust(width) for dst in gpus)
    rows = [head]
    for src in gpus:
        rows.append(f"GPU{src}".ljust(7) + "".join(str(value(src, dst)).rjust(width) for dst in gpus))
    return "\n".join(rows)


def format_bandwidth_matrix(report: dict[str, Any]) -> str:
    """GB/s of each copy (rows: source, columns: destination); the diagonal is a local copy."""
    by_pair = {(p["src"], p["dst"]): p for p in report["pairs"]}

    def cell(src: int, dst: int) -> str:
        if src == dst:
            gbps = report["local_gbps"].get(src)
        else:
            gbps = by_pair.get((src, dst), {}).get("gbps")
        return "-" if gbps is None else f"{gbps:.1f}"

    return format_matrix(report["gpus"], cell)


def format_report(report: dict[str, Any]) -> str:
    gpus = report["gpus"]
    by_pair = {(p["src"], p["dst"]): p for p in report["pairs"]}
    lines = [f"GPU P2P preflight: {len(gpus)} GPU(s)"
             + (f", virtualisation: {report['virt']}" if report.get("virt") else "")]
    if len(gpus) > 1:
        lines += ["", "Links (nvidia-smi topo -m) / P2P read (topo -p2p r):"]
        lines.append(format_matrix(gpus, lambda s, d: "X" if s == d else
                                   f"{by_pair[(s, d)]['link'] or '?'}/{by_pair[(s, d)]['p2p_read'] or '?'}",
                                   width=11))
    if report["local_gbps"] or any(p["gbps"] is not None for p in report["pairs"]):
        lines += ["", "Copy bandwidth, GB/s (rows: from, columns: to; diagonal: on one GPU):",
                  format_bandwidth_matrix(report)]
    for title, key in (("Warnings", "warnings"), ("Advice", "advice"), ("Notes", "notes")):
        if report[key]:
            lines += ["", f"{title}:"] + [f"  - {item}" for item in report[key]]
    if len(gpus) < 2:
        lines += ["", f"P2P preflight: nothing to check ({len(gpus)} GPU)"]
    elif report["ok"]:
        lines += ["", "P2P preflight: OK"]
    else:
        lines += ["", f"P2P preflight: {len(report['warnings'])} warning(s)"]
    return "\n".join(lines)
