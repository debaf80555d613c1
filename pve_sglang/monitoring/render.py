"""The monitoring container's files, rendered from its settings and targets (pure).

``prometheus.yml`` (Debian's ``/etc/prometheus/prometheus.yml``: the deploy's own in the
monitoring container), the shipped rules with each alert's ``for:`` set, the inventory's rules
(thresholds, each server's last benchmark and request cap) and where each server's API key lives
(a 0600 file Prometheus reads through ``authorization.credentials_file``: never in the
configuration's text).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from pve_sglang.config.monitoring import MonitoringSettings
from pve_sglang.monitoring.targets import Target
from pve_sglang.server.addresses import host_port
from pve_sglang.server.unit_text import env_quote, systemd_quote

#: Debian's configuration file of its prometheus package.
CONFIG_PATH = "/etc/prometheus/prometheus.yml"
#: Debian's unit of its prometheus package, and its default flags' file.
UNIT = "prometheus.service"
DEFAULTS_PATH = "/etc/default/prometheus"
#: In an existing Prometheus's monitoring_dir: the scrape configs its prometheus.yml includes.
SCRAPE_NAME = "scrape-configs.yml"
#: The shipped rules, and their name in the monitoring container.
RULES_SOURCE = Path(__file__).resolve().parent / "pve-sglang.rules.yml"
RULES_NAME = "pve-sglang.rules.yml"
INVENTORY_RULES_NAME = "pve-sglang-inventory.rules.yml"
#: A key file's name: ``server-`` and 16 hex digits (the deploy removes only names like it).
KEY_PREFIX, KEY_SUFFIX = "server-", ".key"


def rules_dir(ms: MonitoringSettings) -> str:
    return f"{ms.monitoring_dir.rstrip('/')}/rules"


def keys_dir(ms: MonitoringSettings) -> str:
    return f"{ms.monitoring_dir.rstrip('/')}/keys"


def key_path(ms: MonitoringSettings, name: str) -> str:
    """The 0600 file of the API key of the server of container NAME."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{keys_dir(ms)}/{KEY_PREFIX}{digest}{KEY_SUFFIX}"


def is_key_name(name: str) -> bool:
    """A file name the deploy gives a key file (``key_path``): the only ones it removes."""
    digest = name.removeprefix(KEY_PREFIX).removesuffix(KEY_SUFFIX)
    return (name.startswith(KEY_PREFIX) and name.endswith(KEY_SUFFIX) and len(digest) == 16
            and all(c in "0123456789abcdef" for c in digest))


def _static(target: Target) -> dict[str, Any]:
    return {"targets": [target.address],
            "labels": {"container": target.name, "pve_host": target.pve_host}}


def scrape_configs(ms: MonitoringSettings, targets: list[Target]) -> list[dict[str, Any]]:
    """One job per kind of target; a server with a key a job of its own (its key file), its
    ``job`` label set back to ``sglang``; a kind without targets no job."""
    configs: list[dict[str, Any]] = []
    for job in ("sglang", "smg", "node"):
        plain = [t for t in targets if t.job == job and not t.has_key]
        if plain:
            configs.append({"job_name": job, "static_configs": [_static(t) for t in plain]})
    for index, target in enumerate((t for t in targets if t.has_key), start=1):
        configs.append({
            "job_name": f"{target.job}-key-{index}",
            "authorization": {"type": "Bearer",
                              "credentials_file": key_path(ms, target.name)},
            "static_configs": [_static(target)],
            "relabel_configs": [{"target_label": "job", "replacement": target.job}]})
    return configs


def render_config(ms: MonitoringSettings, targets: list[Target]) -> str:
    """``prometheus.yml``: the scrape interval, the deploy's rule files, every target."""
    interval = f"{ms.monitoring_scrape_interval_s}s"
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
              "rule_files": [f"{rules_dir(ms)}/*.yml"],
              "scrape_configs": scrape_configs(ms, targets)}
    return "# Written by pve-sglang's deploy: changes here are replaced on its next run.\n" + \
        yaml.safe_dump(config, sort_keys=False)


def scrape_path(ms: MonitoringSettings) -> str:
    return f"{ms.monitoring_dir.rstrip('/')}/{SCRAPE_NAME}"


def render_scrape_file(ms: MonitoringSettings, targets: list[Target]) -> str:
    """For an existing Prometheus: its ``scrape_configs`` to include (a file of
    ``scrape_config_files``, Prometheus 2.43 and later, or copied into prometheus.yml)."""
    return ("# Written by pve-sglang's deploy: changes here are replaced on its next run.\n"
            + yaml.safe_dump({"scrape_configs": scrape_configs(ms, targets)}, sort_keys=False))


def render_defaults(ms: MonitoringSettings) -> str:
    """``/etc/default/prometheus``: where it listens (Debian's unit reads ``ARGS`` there)."""
    address = host_port(ms.prometheus_host, ms.prometheus_port)
    return ("# Written by pve-sglang's deploy.\n"
            f"ARGS={env_quote(f'--web.listen-address={address}')}\n")


def render_node_defaults(ms: MonitoringSettings) -> str:
    """``/etc/default/prometheus-node-exporter`` on a GPU host: its port and textfile folder
    (Debian's unit reads ``ARGS`` there)."""
    flags = (f"--web.listen-address=:{ms.node_exporter_port} "
             f"--collector.textfile.directory={ms.node_textfile_dir}")
    return f"# Written by pve-sglang's deploy (its monitoring).\nARGS={env_quote(flags)}\n"


def systemd_arg(value: str) -> str:
    """VALUE as one argument of a unit's ExecStart (nothing in it expanded)."""
    return systemd_quote(value)


def render_rules(ms: MonitoringSettings) -> str:
    """The shipped rules, each alert that waits waiting ``monitoring_alert_for_s``."""
    rules = yaml.safe_load(RULES_SOURCE.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{ms.monitoring_alert_for_s}s"
    return yaml.safe_dump(rules, sort_keys=False)


def _constant(record: str, value: float, labels: dict[str, str] | None = None) -> dict:
    rule: dict[str, Any] = {"record": record, "expr": f"vector({value:g})"}
    if labels:
        rule["labels"] = labels
    return rule


def render_inventory_rules(ms: MonitoringSettings, benchmarks: dict[str, float],
                           caps: dict[str, int]) -> str:
    """The thresholds the alerts compare with, and per container (by inventory name) its last
    benchmark's best output tok/s (BENCHMARKS) and its ``max_running_requests`` (CAPS)."""
    rules = [_constant("pve_sglang:throughput_alert_share", ms.monitoring_throughput_share),
             _constant("pve_sglang:token_usage_alert", ms.monitoring_token_usage),
             _constant("pve_sglang:low_power_alert_ratio", ms.monitoring_low_power_pct / 100),
             _constant("pve_sglang:restart_alert_changes", 2 * ms.monitoring_restarts)]
    rules += [_constant("pve_sglang:benchmark_output_tok_s", round(tok_s, 1), {"container": name})
              for name, tok_s in benchmarks.items()]
    rules += [_constant("pve_sglang:max_running_requests", cap, {"container": name})
              for name, cap in caps.items()]
    return yaml.safe_dump({"groups": [{"name": "pve-sglang-inventory", "rules": rules}]},
                          sort_keys=False)


def best_output_tok_s(runs: list[dict]) -> float | None:
    """The last benchmark run's highest output tok/s over its levels (``bench_history``)."""
    if not runs:
        return None
    rates = [row.get("output_token_throughput") for row in runs[-1].get("rows") or ()]
    known = [float(r) for r in rates if isinstance(r, (int, float)) and r > 0]
    return max(known) if known else None
