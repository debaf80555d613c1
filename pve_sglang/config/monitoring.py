"""Settings of the monitoring: Debian's Prometheus in a container of its own (a host's
``monitoring:`` entry, created as a gateway's container is), scraping every server, gateway and
GPU host of the inventory, with the deploy's alert and recording rules.

The entry's fields are these, with ``group_data/all.py``'s defaults under them; each value is
checked before pyinfra connects (``validate_monitoring``), as the containers' are.
"""

from __future__ import annotations

from typing import Annotated, Any

import re

from pydantic import AfterValidator, Field, ValidationError

from pve_sglang.config.settings import (
    ContainerPath,
    Int,
    Port,
    SettingsError,
    _format_error,
    _Strict,
    address,
    ip_address,
)

_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def unix_user(value: str) -> str:
    """A user name as Debian's adduser allows it by default."""
    if not _USER.fullmatch(value):
        raise ValueError("not a user name; allowed: a lower-case letter or '_', then lower-case "
                         "letters, digits, '_' or '-' (32 at most), e.g. 'prometheus'")
    return value


class MonitoringSettings(_Strict):
    """Where Prometheus listens, how often it scrapes, when its alerts fire."""

    prometheus_host: Annotated[str, AfterValidator(ip_address)]
    prometheus_address: Annotated[str, AfterValidator(address)] | None = None
    prometheus_user: Annotated[str, AfterValidator(unix_user)]
    prometheus_port: Port
    monitoring_dir: ContainerPath
    monitoring_scrape_interval_s: Int = Field(ge=1, le=3600)
    monitoring_alert_for_s: Int = Field(ge=0, le=86400)
    monitoring_throughput_share: float = Field(gt=0, lt=1)
    monitoring_token_usage: float = Field(gt=0, le=1)
    monitoring_low_power_pct: Int = Field(ge=1, le=100)
    monitoring_restarts: Int = Field(ge=1, le=100)
    node_exporter_port: Port
    node_textfile_dir: ContainerPath


MONITORING_FIELDS = frozenset(MonitoringSettings.model_fields)
#: The container settings a monitoring entry may set for its container (no GPU).
MONITORING_CONTAINER_FIELDS = frozenset({
    "hostname", "rootfs_storage", "rootfs_size_gib", "cores", "memory_mib", "swap_mib", "net0",
    "unprivileged", "onboot", "nesting"})
#: Its container's size unless the entry says otherwise (Prometheus for a few hosts is small).
MONITORING_CONTAINER_DEFAULTS = {"cores": 2, "memory_mib": 2048}


def validate_monitoring(where: str, data: dict[str, Any],
                        defaults: dict[str, Any]) -> MonitoringSettings:
    """The monitoring's settings from its DATA over the DEFAULTS; a bad value is a
    SettingsError naming WHERE, the field, the value and what is allowed."""
    merged = {k: v for k, v in {**defaults, **data}.items() if k in MONITORING_FIELDS}
    try:
        return MonitoringSettings.model_validate(merged)
    except ValidationError as error:
        raise SettingsError(_format_error(where, error, merged)) from None
