"""Settings of a gateway: SGLang's model gateway (``smg``) in a container of its own, in front
of the serving containers (its workers).

A host entry lists its gateways under ``gateways:`` (each with ``vmid`` on Proxmox, ``name`` on
plain LXC); their fields are these, with ``group_data/all.py``'s defaults under them. Each value
is checked before pyinfra connects (``validate_gateway``), as the containers' are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationError, field_validator, model_validator

from pve_sglang.config.settings import (
    GATEWAY_SECRET_FIELDS,
    ContainerPath,
    HttpUrl,
    Int,
    Port,
    SettingsError,
    StackView,
    _format_error,
    _Strict,
    exact_version,
    ip_address,
    secret_from_env,
    unit_word,
    usable_secret,
)
from pve_sglang.stack.lock import GATEWAY_LOCKS, SHIPPED, Lock, LockKey, parse

#: smg 1.13.0's ``--policy`` choices (``smg launch --help``; ``smg/router_args.py``).
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "least_load", "manual",
            "consistent_hashing", "prefix_hash")


def smg_lock_path(version: str, python: str) -> Path:
    """The checkout's hashed lock of smg VERSION for the container's PYTHON (``3.11``), beside
    the release sets' (``stack.lock.SHIPPED``): ``smg-VERSION-pyPYTHON.txt`` (``uv pip compile
    --generate-hashes``), one per release and container Python."""
    return SHIPPED / f"{GATEWAY_LOCKS}{version}-py{python}.txt"


def gateway_lock(gs: GatewaySettings) -> tuple[Lock, LockKey]:
    """The gateway's hashed lock and what it is made for (its Python, its index): what the
    host's wheel store keeps for it, as it keeps a serving container's set."""
    key = LockKey(pins=(("smg", gs.smg_version),), python=gs.gateway_python,
                  index_url=gs.gateway_pip_index_url)
    return parse(smg_lock_path(gs.smg_version, gs.gateway_python)), key


def gateway_store(stack: StackView, gs: GatewaySettings) -> str | None:
    """The host's wheel store the gateway installs smg from (mounted read-only in its
    container, whose STACK names it): its container's, unless ``gateway_wheelhouse`` names the
    user's own."""
    return stack.wheel_store if stack.uses_wheel_store and gs.gateway_wheelhouse is None else None


def smg_locks() -> list[str]:
    """``VERSION for Python PYTHON`` of every shipped smg lock, for a message."""
    found = sorted(SHIPPED.glob(f"{GATEWAY_LOCKS}*-py*.txt"))
    return [p.stem.removeprefix(GATEWAY_LOCKS).replace("-py", " for Python ") for p in found]


class GatewaySettings(_Strict):
    """One gateway: where it listens, how it routes and checks its workers, what it runs."""

    smg_version: Annotated[str, AfterValidator(exact_version)]
    gateway_python: Annotated[str, Field(pattern=r"^3\.\d+$")]
    gateway_venv: ContainerPath
    gateway_service_name: Annotated[str, AfterValidator(unit_word)]
    gateway_host: Annotated[str, AfterValidator(ip_address)]
    gateway_port: Port
    gateway_prometheus_port: Port
    # ignored (valid-type): a Literal of the tuple POLICIES, read by pydantic at run time.
    gateway_policy: Literal[POLICIES]  # type: ignore[valid-type]
    gateway_workers: list[Annotated[str, Field(min_length=1)]] | None
    gateway_health_check_interval_s: Int = Field(ge=1, le=3600)
    gateway_health_check_timeout_s: Int = Field(ge=1, le=600)
    gateway_health_failure_threshold: Int = Field(ge=1, le=100)
    gateway_remove_unhealthy: bool
    gateway_api_key: SecretStr | None
    gateway_wheelhouse: ContainerPath | None
    gateway_pip_index_url: HttpUrl | None
    gateway_register_timeout_s: Int = Field(ge=1, le=3600)
    gateway_worker_startup_timeout_s: Int = Field(ge=1, le=86400)
    gateway_bench: bool
    gateway_roll_batch: Int = Field(ge=1, le=1000)
    gateway_drain_timeout_s: Int = Field(ge=1, le=86400)
    gateway_roll_failure: Literal["keep", "back"]

    @field_validator("gateway_workers")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("an empty list fronts no server; allowed: null (every serving "
                                 "container of one model) or inventory names")
            repeated = sorted({item for item in value if value.count(item) > 1})
            if repeated:
                raise ValueError(f"{repeated} listed more than once; allowed: distinct values")
        return value

    _secret_from_env = field_validator("gateway_api_key", mode="before")(
        classmethod(lambda cls, value: secret_from_env(value)))
    _secret_is_usable = field_validator("gateway_api_key")(
        classmethod(lambda cls, value: usable_secret(value)))

    @model_validator(mode="after")
    def _lock_and_ports(self) -> GatewaySettings:
        """A shipped hashed lock for the release and Python; two listeners, two ports."""
        if not smg_lock_path(self.smg_version, self.gateway_python).is_file():
            raise ValueError(
                f"field 'smg_version' = {self.smg_version!r}: no hashed lock for Python "
                f"{self.gateway_python} ({smg_lock_path(self.smg_version, self.gateway_python).name}); "
                f"allowed: {', '.join(smg_locks()) or 'none shipped'}")
        if self.gateway_bench and self.gateway_host.startswith(("127.", "::1")):
            raise ValueError(f"gateway_bench runs the benchmark from the first worker's "
                             f"container, which cannot reach gateway_host {self.gateway_host!r}; "
                             "allowed: gateway_host 0.0.0.0 (or the container's address), or "
                             "gateway_bench false")
        if self.gateway_prometheus_port == self.gateway_port:
            raise ValueError(f"gateway_prometheus_port {self.gateway_prometheus_port} is "
                             "gateway_port too; allowed: another port")
        return self


GATEWAY_FIELDS = frozenset(GatewaySettings.model_fields)
#: The container settings a gateway entry (or its host entry) may set for its container, which
#: the host phase creates as it creates a serving one, without GPUs.
GATEWAY_CONTAINER_FIELDS = frozenset({
    "hostname", "rootfs_storage", "rootfs_size_gib", "cores", "memory_mib", "swap_mib", "net0",
    "unprivileged", "onboot", "nesting"})
#: A gateway's container size unless its entry says otherwise (the host entry's cores and memory
#: are its GPU containers' defaults, far more than a router needs).
GATEWAY_CONTAINER_DEFAULTS = {"cores": 4, "memory_mib": 4096}
assert GATEWAY_SECRET_FIELDS <= GATEWAY_FIELDS


def validate_gateway(where: str, data: dict[str, Any], defaults: dict[str, Any]) -> GatewaySettings:
    """A gateway's settings from its DATA over the DEFAULTS; a bad value is a SettingsError
    naming WHERE, the field, the value (never a key's) and what is allowed."""
    merged = {k: v for k, v in {**defaults, **data}.items() if k in GATEWAY_FIELDS}
    try:
        return GatewaySettings.model_validate(merged)
    except ValidationError as error:
        raise SettingsError(_format_error(where, error, merged)) from None
