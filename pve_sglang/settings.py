"""Validated settings for Proxmox hosts and their GPU containers.

Defaults live only in ``group_data/all.py``; these models hold the types and the rules.
Every field is required here, because the data they validate always carries the defaults.
"""

from __future__ import annotations

import difflib
import os
import runpy
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
GROUP_DATA_FILE = REPO_ROOT / "group_data" / "all.py"

MOE_RUNNER_BACKENDS = (
    "auto",
    "deep_gemm",
    "triton",
    "triton_kernel",
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutlass",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "cutlass",
)
ATTENTION_BACKENDS = (
    "triton",
    "torch_native",
    "flex_attention",
    "nsa",
    "dsa",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
)
VMID_MIN, VMID_MAX = 100, 999_999_999

# Keys that belong to pyinfra's connectors rather than to us; pyinfra checks their types.
CONNECTOR_KEY_PREFIXES = ("ssh_",)
CONNECTOR_KEYS = ("lxc_attach_wrapper", "pct_local")


class SettingsError(ValueError):
    """Bad host data: names the host, the field, the value and what is allowed."""


class Mount(BaseModel):
    """A host directory bind-mounted into the container."""

    model_config = ConfigDict(extra="forbid")
    host_path: str
    path: str
    read_only: bool = False


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, hide_input_in_errors=False)


class HostSettings(_Strict):
    """Settings of one Proxmox (or plain LXC) host."""

    platform: Literal["pve", "lxc"]
    require_gpu: bool
    reload_modules: bool
    lxc_path: str
    lxc_release: str
    lxc_rootfs_tarball: str | None
    lxc_config: list[str]
    template_storage: str
    template: str
    pve_container_native_dev_min: str


class ContainerSettings(_Strict):
    """Settings of one GPU container and the SGLang server inside it."""

    hostname: str | None = Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
    rootfs_storage: str
    rootfs_size_gib: int = Field(gt=0)
    cores: int = Field(gt=0)
    memory_mib: int = Field(ge=1024)
    swap_mib: int = Field(ge=0)
    net0: str
    unprivileged: bool
    onboot: bool
    nesting: bool
    gpus: Union[Literal["all"], list[int]]
    mounts: list[Mount]

    sglang_version: str
    torch_version: str
    flashinfer_version: str
    cuda_toolkit_version: str
    uv_version: str
    venv_path: str
    pip_index_url: str | None
    ca_certificates: list[str]
    wheelhouse: str | None
    torch_index_url: str | None
    stack_install: Literal["pinned", "sglang-no-deps"]
    nvidia_runfile_url: str | None
    nvidia_runfile_path: str | None

    service_name: str = Field(pattern=r"^[A-Za-z0-9_.@-]+$")
    model_path: str
    model_download: str | None
    model_revision: str | None
    served_model_name: str | None
    server_host: str
    server_port: int = Field(ge=1, le=65535)
    tp_size: int | None = Field(ge=1)
    moe_runner_backend: Literal[MOE_RUNNER_BACKENDS]  # type: ignore[valid-type]
    attention_backend: Literal[ATTENTION_BACKENDS]  # type: ignore[valid-type]
    mem_fraction_static: float = Field(gt=0, lt=1)
    max_running_requests: int | None = Field(ge=1)
    disable_cuda_graph: bool
    enable_flashinfer_allreduce_fusion: bool
    extra_server_args: list[str]
    sglang_cache_dir: str
    hf_token: SecretStr | None
    api_key: SecretStr | None
    health_timeout_s: int = Field(gt=0)
    nodes: list[str]
    dist_init_addr: str | None
    dist_init_port: int = Field(ge=1, le=65535)

    bench: bool
    bench_concurrencies: list[int]
    bench_num_prompts: int = Field(gt=0)
    bench_input_len: int = Field(gt=0)
    bench_output_len: int = Field(gt=0)

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, value: Any) -> Any:
        """GPU indices must be distinct and non-negative."""
        if isinstance(value, list):
            if any(index < 0 for index in value) or len(set(value)) != len(value):
                raise ValueError("GPU indices must be distinct numbers >= 0, or 'all'")
        return value

    @field_validator("hf_token", "api_key", mode="before")
    @classmethod
    def _secret_from_env(cls, value: Any) -> Any:
        """``env:NAME`` reads a secret from the deploying machine's environment."""
        if isinstance(value, str) and value.startswith("env:"):
            name = value[4:]
            if name not in os.environ:
                raise ValueError(f"environment variable {name} is not set")
            return os.environ[name]
        return value

    @model_validator(mode="after")
    def _tp_fits_gpus(self) -> ContainerSettings:
        """TP cannot be larger than the GPUs passed through."""
        if isinstance(self.gpus, list) and self.tp_size and self.tp_size > len(self.gpus):
            raise ValueError(
                f"tp_size {self.tp_size} is larger than the {len(self.gpus)} GPUs passed "
                f"through (gpus: {self.gpus}); allowed: 1..{len(self.gpus)}"
            )
        return self

    @property
    def secrets(self) -> dict[str, str]:
        """Environment variables for the server's 0600 EnvironmentFile."""
        env = {}
        if self.hf_token:
            env["HF_TOKEN"] = self.hf_token.get_secret_value()
        if self.api_key:
            env["SGLANG_API_KEY"] = self.api_key.get_secret_value()
        return env


HOST_FIELDS = frozenset(HostSettings.model_fields)
CONTAINER_FIELDS = frozenset(ContainerSettings.model_fields)


def load_defaults(path: Path = GROUP_DATA_FILE) -> dict[str, Any]:
    """Read the defaults from ``group_data/all.py``, as pyinfra itself does."""
    return {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("__")}


def _is_connector_key(key: str) -> bool:
    return key.startswith(CONNECTOR_KEY_PREFIXES) or key in CONNECTOR_KEYS


def _allowed_hint(key: str, allowed: frozenset[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{hint}; allowed fields: {', '.join(sorted(allowed))}"


def _format_error(where: str, error: ValidationError, data: dict[str, Any]) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(settings)"
        top = str(item["loc"][0]) if item["loc"] else None
        value = data.get(top, "<missing>") if top else None
        if top in ("hf_token", "api_key"):
            value = "<secret>"
        message = item["msg"]
        if item["type"] == "literal_error":
            message = "not allowed; " + message.replace("Input should be", "allowed:")
        shown = f" = {value!r}" if top else ""
        lines.append(f"{where}: field '{field}'{shown}: {message}")
    return "\n".join(lines)


def validate_host(name: str, data: dict[str, Any], defaults: dict[str, Any]) -> HostSettings:
    """Validate one host's own data (without its containers) merged over the defaults."""
    for key in data:
        if key not in HOST_FIELDS | CONTAINER_FIELDS and not _is_connector_key(key):
            raise SettingsError(
                f"host {name}: unknown field '{key}'{_allowed_hint(key, HOST_FIELDS | CONTAINER_FIELDS)}"
            )
    merged = {k: v for k, v in {**defaults, **data}.items() if k in HOST_FIELDS}
    try:
        return HostSettings.model_validate(merged)
    except ValidationError as error:
        raise SettingsError(_format_error(f"host {name}", error, merged)) from None


def validate_container(
    host: str, container: str, data: dict[str, Any], defaults: dict[str, Any]
) -> ContainerSettings:
    """Validate a container's data merged over its host's data and the defaults."""
    merged = {k: v for k, v in {**defaults, **data}.items() if k in CONTAINER_FIELDS}
    try:
        return ContainerSettings.model_validate(merged)
    except ValidationError as error:
        raise SettingsError(
            _format_error(f"host {host}, container {container}", error, merged)
        ) from None


def check_container_keys(host: str, container: str, data: dict[str, Any]) -> None:
    """A container entry may set container fields only."""
    for key in data:
        if key in HOST_FIELDS:
            raise SettingsError(
                f"host {host}, container {container}: field '{key}' belongs to the host, "
                "set it on the host entry"
            )
        if key not in CONTAINER_FIELDS and not _is_connector_key(key):
            raise SettingsError(
                f"host {host}, container {container}: unknown field '{key}'"
                f"{_allowed_hint(key, CONTAINER_FIELDS)}"
            )


def check_vmid(host: str, platform: str, key: Any) -> None:
    """Proxmox VMIDs are whole numbers in 100..999999999; LXC names are plain words."""
    if platform == "pve":
        if isinstance(key, bool) or not isinstance(key, int) or not VMID_MIN <= key <= VMID_MAX:
            raise SettingsError(
                f"host {host}: container VMID {key!r} is not allowed; allowed: whole numbers "
                f"{VMID_MIN}..{VMID_MAX}"
            )
    elif not isinstance(key, str) or not key.replace("-", "").replace("_", "").isalnum():
        raise SettingsError(
            f"host {host}: container name {key!r} is not allowed; allowed: letters, digits, - and _"
        )


def container_hostname(host_data: Any) -> str:
    """A container's hostname: the setting, else ``sglang-<VMID or name>``."""
    ident = host_data.get("pct_vmid") or host_data.get("lxc_name")
    return host_data.get("hostname") or f"sglang-{ident}"


def settings_for(host_data: Any, model: type[BaseModel]) -> Any:
    """Build settings from a pyinfra host's merged data (group_data plus host data)."""
    return model.model_validate(
        {name: host_data.get(name) for name in model.model_fields}
    )
