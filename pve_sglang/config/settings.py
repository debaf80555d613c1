"""Validated settings for Proxmox hosts and their GPU containers.

Defaults live only in ``group_data/all.py``; these models hold the types and the rules.
Every field is required here, because the data they validate always carries the defaults.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import json
import os
import posixpath
import re
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeGuard, TypeVar, Union
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version
from pve_sglang.model_store.rules import serving_link
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pve_sglang.connectors import connector_data_keys
from pve_sglang.connectors.pct import VMID_MAX, VMID_MIN
from pve_sglang.pve_releases import DEVN_FROM, upstream, version_problem
from pve_sglang.stack.lock import LockError, key_of, lock_path, read_checked
from pve_sglang.stack.platform import DEFAULT_RELEASE, PlatformError, platform_for
from pve_sglang.stack.releases import ReleaseError, choose, read_release, toolkit_pin
from pve_sglang.stack.switch_rules import StacksAt

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
# Every release's --schedule-policy choices (0.5.9 to 0.5.23's parsers); which release has which
# is server/spelling.py's SCHEDULE_POLICY_SINCE, checked when the command is rendered.
SCHEDULE_POLICIES = ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key",
                     "hrrn", "shortest-prefill-first")
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

# Keys that belong to the connectors (pyinfra's SSH, our @pct and @lxc) rather than to us, from
# the connectors' own data definitions; hosts_file checks where each may be set and its type.
CONNECTOR_KEYS = connector_data_keys()


class SettingsError(ValueError):
    """Bad host data: names the host, the field, the value and what is allowed."""


# --- field rules ----------------------------------------------------------------------------
# One function per rule; each returns the value or raises ValueError saying what is allowed
# (the value itself is shown by the caller, except for secrets).

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WHITESPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")
# Flags whose value is a secret: set api_key instead (it goes to the 0600 EnvironmentFile).
SECRET_FLAGS = ("--api-key", "--admin-api-key")
# Flags the deploy renders from a setting; the same flag in extra_server_args would override the
# setting behind the checks' back (argparse keeps the last one).
SETTING_FLAGS = {
    "--model-path": "model_path", "--model": "model_path",
    "--host": "server_host", "--port": "server_port",
    "--tp-size": "tp_size", "--tensor-parallel-size": "tp_size",
    "--moe-runner-backend": "moe_runner_backend", "--attention-backend": "attention_backend",
    "--mem-fraction-static": "mem_fraction_static",
    "--max-running-requests": "max_running_requests",
    "--cuda-graph-max-bs": "cuda_graph_max_bs", "--cuda-graph-max-bs-decode": "cuda_graph_max_bs",
    "--chunked-prefill-size": "chunked_prefill_size", "--schedule-policy": "schedule_policy",
    "--served-model-name": "served_model_name",
    "--nnodes": "nodes", "--node-rank": "nodes",
    "--dist-init-addr": "dist_init_addr", "--nccl-init-addr": "dist_init_addr",
}
# Proxmox's net0 keys ($netconf_desc in pve-container src/PVE/LXC/Config.pm); name is required.
NET_KEYS = ("name", "bridge", "hwaddr", "mtu", "ip", "gw", "ip6", "gw6", "firewall", "tag",
            "trunks", "rate", "link_down", "type", "host-managed")
# A DNS name as Proxmox checks ``hostname`` (pve-common JSONSchema.pm pve_verify_dns_name), with
# RFC 1123's 63 characters a label; at most 255 in all (pve-container Config.pm maxLength).
_DNS_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?:{_DNS_LABEL}\.)*{_DNS_LABEL}")


def _not_bool(value: Any) -> Any:
    """YAML's ``yes``/``true`` is not a number (pydantic would read it as 1)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not allowed here; allowed: a whole number")
    return value


def _version_text(value: Any) -> Any:
    """YAML reads ``12.10`` as the number 12.1: versions must be quoted strings."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"a number, not a string: write it quoted, e.g. '{value}' (YAML reads "
                         "12.10 as 12.1)")
    return value


def _path(value: str, *, mount: bool = False) -> str:
    """An absolute path without whitespace, control characters, ``.`` or ``..`` (not ``/``),
    returned normalised: repeated and trailing slashes dropped."""
    if _WHITESPACE_OR_CONTROL.search(value):
        raise ValueError("holds whitespace or a control character; allowed: an absolute path "
                         "without spaces, tabs or newlines")
    if not value.startswith("/"):
        raise ValueError("not an absolute path; allowed: a path starting with '/'")
    parts = [part for part in value.split("/") if part]
    if "." in parts or ".." in parts:
        # Proxmox refuses them in mount points too (verify_lxc_mp_string in pve-container's
        # src/PVE/LXC/Config.pm); with a symlink on the way, '..' means another directory.
        raise ValueError(f"holds '.' or '..'; allowed: a normalised path, e.g. "
                         f"{posixpath.normpath(value)!r}")
    value = "/" + "/".join(parts)
    if value == "/":
        raise ValueError("'/' is not allowed; allowed: an absolute path below /")
    if mount and ("," in value or "=" in value):
        # pct reads mpN as key=value,key=value: '/tank,backup=1' would add a mount option.
        raise ValueError("holds ',' or '=', which Proxmox reads as further mpN options; allowed: "
                         "a path without ',' and '='")
    return value


def container_path(value: str) -> str:
    """A path in the container (or on the host) as the deploy writes it into units and configs."""
    return _path(value)


def mount_path(value: str) -> str:
    """A Proxmox mount point path (``mpN``): a container path without ',' or '='."""
    return _path(value, mount=True)


def local_path(value: str) -> str:
    """A path (or glob) on the machine running pyinfra: anything but an empty one or a newline."""
    if not value or _CONTROL.search(value):
        raise ValueError("empty, or holds a newline or control character; allowed: a path on "
                         "this machine")
    return value


#: The largest prompts file the benchmark is given: it is read whole here and uploaded.
PROMPTS_FILE_MAX_BYTES = 64 << 20


def prompts_file(value: str) -> str:
    """A JSONL file of the user's own prompts on the machine running pyinfra, as SGLang's
    benchmark reads a ``custom`` dataset (0.5.9 ``bench_serving.sample_custom_requests``,
    0.5.23 ``benchmark/datasets/custom.py``): one JSON object a line, its ``conversations``
    (or ``conversation``) a list whose first two turns have a ``content`` (or ``value``) text,
    the prompt and an answer. Checked whole: the benchmark skips a line it cannot read."""
    local_file(value)
    found = os.stat(value)
    if found.st_size > PROMPTS_FILE_MAX_BYTES:
        raise ValueError(f"{found.st_size} bytes; allowed: at most {PROMPTS_FILE_MAX_BYTES} "
                         "bytes")
    _checked_prompts(value, found.st_size, found.st_mtime_ns)
    return value


@functools.lru_cache(maxsize=16)
def _checked_prompts(value: str, size: int, mtime_ns: int) -> None:
    """``prompts_file``'s reading of the file, once per version of it (SIZE, MTIME_NS): the
    settings are validated again for every host and every try of a search."""
    rows = 0
    with open(value, encoding="utf-8", errors="strict") as lines:
        try:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    _prompt_row(line, number)
                    rows += 1
        except UnicodeDecodeError:
            raise ValueError("not UTF-8 text; allowed: a JSONL file of prompts") from None
    if not rows:
        raise ValueError("no prompt in it; allowed: a JSONL file, one "
                         '{"conversations": [{"content": PROMPT}, {"content": ANSWER}]} a line')


def _prompt_row(line: str, number: int) -> None:
    allowed = ('allowed: {"conversations": [{"content": PROMPT}, {"content": ANSWER}]} '
               "(SGLang's custom dataset)")
    try:
        row = json.loads(line)
    except ValueError:
        raise ValueError(f"line {number}: not JSON; {allowed}") from None
    turns = row.get("conversations", row.get("conversation")) if isinstance(row, dict) else None
    if not isinstance(turns, list) or len(turns) < 2 or not all(
            isinstance(t, dict) and isinstance(t.get("content", t.get("value")), str)
            for t in turns[:2]):
        raise ValueError(f"line {number}: no prompt and answer; {allowed}")


def local_file(value: str) -> str:
    """A file on the machine running pyinfra, which the deploy uploads: it must be there now."""
    local_path(value)
    if not os.path.isfile(value):
        raise ValueError("no such file on this machine; allowed: the path of an existing file "
                         "on the machine that runs pyinfra")
    return value


def exact_version(value: str) -> str:
    """An exact PEP 440 release in its normal form (``0.5.9``, ``2.9.1+cu128``), not ``latest``."""
    try:
        normal = str(Version(value))
    except InvalidVersion:
        raise ValueError("not an exact version; allowed: a PEP 440 version such as '0.5.9' "
                         "(not 'latest', a range or a specifier)") from None
    if normal != value:
        raise ValueError(f"allowed: the version in its normal form, {normal!r}")
    return value


def pve_container_version(value: str) -> str:
    """A pve-container version the rules of ``pve_releases`` can compare (``5.0.8``, ``4.4-3``)."""
    problem = version_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def devn_minimum(value: str) -> str:
    """``pve_container_native_dev_min``: it can only move the devN rule up; below
    ``DEVN_FROM`` pve-container has no ``devN`` entries to pass GPUs with."""
    pve_container_version(value)
    if upstream(value) < upstream(DEVN_FROM):
        raise ValueError(f"below {DEVN_FROM}, the first pve-container with devN entries (older "
                         "ones refuse them): the setting can only move the rule up; allowed: "
                         f"a version from {DEVN_FROM} (e.g. '{DEVN_FROM}', '6.0.4')")
    return value


def word_rule(pattern: str, allowed: str, flags: int = 0) -> Callable[[str], str]:
    """A validator: the whole value matches PATTERN, else "allowed: ALLOWED"."""
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value, flags):
            raise ValueError(f"allowed: {allowed}")
        return value
    return check


# MAJOR.MINOR, e.g. 12.8 (NVIDIA's cuda-toolkit-12-8 package).
major_minor = word_rule(r"\d+\.\d+", "MAJOR.MINOR, e.g. '12.8'")


def _python_of_release(value: Any) -> Any:
    """stack_python null: the default Debian release's python3 (a hosts file's container gets
    its host's release's, filled in by hosts_file before validation)."""
    return DEFAULT_RELEASE.python if value is None else value


def debian_python(value: str) -> str:
    """A Debian release's python3: the lock's platform (glibc) follows from it."""
    try:
        platform_for(value)
    except PlatformError as error:
        raise ValueError(str(error).split("; ", 1)[1]) from None
    return value


def http_url(value: str) -> str:
    """An http(s) URL with a host, without whitespace or control characters."""
    parts = urlsplit(value) if not _WHITESPACE_OR_CONTROL.search(value) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("allowed: an http:// or https:// URL with a host and no whitespace")
    if parts.username is not None or parts.password is not None:
        # The URL goes on uv's and curl's command lines, which ps shows to every user.
        raise ValueError(
            "credentials in a URL would be visible on command lines (ps) and in logs; allowed: "
            "a URL without user:password@ (e.g. a mirror that trusts the container's network)"
        )
    return value


# A Proxmox storage id (pve-common JSONSchema.pm parse_id: 2+ characters).
storage_id = word_rule(r"[a-z][a-z0-9\-_.]*[a-z0-9]",
                       r"a Proxmox storage id, [a-z][a-z0-9\-_.]*[a-z0-9], e.g. 'local-lvm'", re.I)
# A container template file name or name prefix, as pveam lists them.
template_name = word_rule(r"[A-Za-z0-9][A-Za-z0-9._+-]*", "a template name or prefix of "
                          "letters, digits and . _ + -, e.g. 'debian-12-standard'")


def dns_name(value: str) -> str:
    """A hostname as Proxmox accepts it (labels of letters, digits and '-', joined by dots)."""
    if len(value) > 255 or not _DNS_NAME.fullmatch(value):
        raise ValueError("allowed: a DNS name: labels of letters, digits and '-' (not first or "
                         "last, 63 at most) joined by '.'")
    return value


def ip_address(value: str) -> str:
    """An IPv4 or IPv6 address without a zone (the server binds to it and is reached by it)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError("not an IP address; allowed: an IPv4 or IPv6 address, e.g. '127.0.0.1', "
                         "'0.0.0.0' (every interface), '::1' or '::'") from None
    if "%" in value:
        raise ValueError("an IPv6 zone (%...) is not allowed; allowed: an address without one")
    return value


def address(value: str) -> str:
    """An IP address or a DNS name, without a port."""
    try:
        return ip_address(value)
    except ValueError:
        pass
    try:
        return dns_name(value)
    except ValueError:
        raise ValueError("allowed: an IP address or a DNS name, without a port (that is "
                         "dist_init_port)") from None


def hf_repo_id(value: str) -> str:
    """A Hugging Face repo id, as huggingface_hub's validate_repo_id checks it: ``NAME`` or
    ``ORG/NAME`` of letters, digits, '-', '_', '.', 96 characters at most, no '--' or '..'."""
    part = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9_])?"
    if (len(value) > 96 or not re.fullmatch(rf"(?:{part}/)?{part}", value, re.A)
            or "--" in value or ".." in value):
        raise ValueError("allowed: a Hugging Face repo id, ORG/NAME of letters, digits, '-', "
                         "'_' and '.' (no '--' or '..', 96 characters at most)")
    return value


# A branch, tag or commit name; no '..'.
git_revision = word_rule(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._/-]*",
                         "a branch, tag or commit of letters, digits and . _ / - (no '..')")
# A name the API serves the model as.
model_name = word_rule(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}",
                       "letters, digits and . _ : / @ + - (no spaces), e.g. 'glm-5'")
# A systemd unit name without its .service suffix (and the env file's name).
unit_word = word_rule(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", "letters, digits and _ . - (no '@': "
                      "that names a template unit), e.g. 'sglang'")


def net_options(value: str) -> str:
    """Proxmox's ``net0``: ``key=value,...`` with Proxmox's keys; ``name`` is required."""
    keys = []
    for item in value.split(","):
        key, sep, val = item.partition("=")
        # ';' separates VLAN ids in trunks only.
        chars = r"[A-Za-z0-9_.:/+;-]+" if key == "trunks" else r"[A-Za-z0-9_.:/+-]+"
        if not sep or key not in NET_KEYS or not re.fullmatch(chars, val):
            raise ValueError(f"item {item!r} is not allowed; allowed: key=value items joined by "
                             f"',' with keys {', '.join(NET_KEYS)} and values of letters, digits "
                             "and . _ : / + - (';' in trunks)")
        keys.append(key)
    if "name" not in keys or len(set(keys)) != len(keys):
        raise ValueError("allowed: each key once, name= included, e.g. "
                         "'name=eth0,bridge=vmbr0,ip=dhcp'")
    return value


def lxc_config_line(value: str) -> str:
    """One LXC config line ``lxc.key = value``, without a newline."""
    key, sep, val = value.partition("=")
    if not sep or not re.fullmatch(r"lxc\.[a-z0-9_.]+", key.strip()) or _CONTROL.search(value):
        raise ValueError(f"line {value!r} is not allowed; allowed: 'lxc.key = value' on one line, "
                         "e.g. 'lxc.net.0.type = none'")
    return value


def server_argument(value: str) -> str:
    """One extra server argument: one word of the command line, no secret, no flag of a setting."""
    if _CONTROL.search(value):
        raise ValueError("an item holds a newline or control character; allowed: one argument "
                         "per item, on one line")
    if not value.startswith("-"):
        return value
    flag = value.split("=", 1)[0]
    # argparse also takes an unambiguous prefix ("--api-k"), so prefixes count too.
    if len(flag) > 2 and any(secret.startswith(flag) for secret in SECRET_FLAGS):
        raise ValueError(f"{flag} would put a secret on the server's command line; set api_key "
                         "instead (it goes to the 0600 EnvironmentFile)")
    if re.search(r"\s", flag):
        raise ValueError(f"{value!r} holds a space; allowed: one argument per item, e.g. "
                         f"{value.split()!r}")
    if flag in SETTING_FLAGS:
        raise ValueError(f"{flag} is rendered from the setting {SETTING_FLAGS[flag]}; set that "
                         "instead")
    return value


# A Debian release name for the debian template (bookworm, trixie).
lxc_release = word_rule(r"[a-z][a-z0-9-]*", "a Debian release name, e.g. 'bookworm'")


def chunk_size(value: int) -> int:
    """A chunked prefill's tokens: at least 1, or -1 for none."""
    if value != -1 and value < 1:
        raise ValueError("allowed: a whole number of tokens >= 1, or -1 (no chunked prefill)")
    return value


def secret_from_env(value: Any) -> Any:
    """``env:NAME`` reads a secret from the deploying machine's environment."""
    if isinstance(value, str) and value.startswith("env:"):
        name = value[4:]
        if name not in os.environ:
            raise ValueError(f"environment variable {name} is not set")
        return os.environ[name]
    return value


def usable_secret(value: Any) -> Any:
    """An empty key would leave a unit unable to start; a space or newline cannot be passed
    through an EnvironmentFile unchanged."""
    if value is not None:
        check_secret(value.get_secret_value())
    return value


def check_secret(value: str) -> str:
    """A secret: not empty, no whitespace or control characters. Never echoed in a message."""
    if not value:
        raise ValueError("empty; allowed: a non-empty value (or null for none)")
    if _WHITESPACE_OR_CONTROL.search(value):
        raise ValueError("holds whitespace or a control character; allowed: a value without "
                         "spaces, tabs or newlines")
    return value


def tensor_parallel_size(tp_size: int | None, gpus_per_node: int | None, nnodes: int) -> int | None:
    """The TP size the server runs with: ``tp_size``, else one rank per GPU on every node.

    The one home of the TP rule (settings, preflight and the server argv use it): TP splits
    evenly over the nodes and each node's share fits its GPUs. ``gpus_per_node`` None (``gpus:
    all`` before the host's GPUs are known) checks the split alone and returns ``tp_size``.
    """
    nnodes = max(1, nnodes)
    total = gpus_per_node * nnodes if gpus_per_node is not None else None
    allowed = (f"1..{total}" if nnodes == 1 else
               f"multiples of {nnodes} up to {total}" if total else f"multiples of {nnodes}")
    where = f" ({gpus_per_node} GPU(s) per node x {nnodes} node(s))" if total is not None else ""
    if tp_size is not None and tp_size % nnodes:
        raise ValueError(f"tp_size {tp_size} does not split evenly over {nnodes} nodes"
                         f"{where}; allowed: {allowed}")
    if total is None:
        return tp_size
    tp = tp_size or total
    if tp > total:
        raise ValueError(f"tp_size {tp} is larger than the {total} GPUs passed through"
                         f"{where}; allowed: {allowed}")
    return tp


Int = Annotated[int, BeforeValidator(_not_bool)]
ContainerPath = Annotated[str, AfterValidator(container_path)]
MountPath = Annotated[str, AfterValidator(mount_path)]
LocalPath = Annotated[str, AfterValidator(local_path)]
ExactVersion = Annotated[str, BeforeValidator(_version_text), AfterValidator(exact_version)]
HttpUrl = Annotated[str, AfterValidator(http_url)]
StorageId = Annotated[str, AfterValidator(storage_id)]
Port = Annotated[Int, Field(ge=1, le=65535)]


class Mount(BaseModel):
    """A host directory bind-mounted into the container."""

    model_config = ConfigDict(extra="forbid")
    host_path: MountPath
    path: MountPath
    read_only: bool = False


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, hide_input_in_errors=False)


class HostSettings(_Strict):
    """Settings of one Proxmox (or plain LXC) host."""

    platform: Literal["pve", "lxc"]
    require_gpu: bool
    reload_modules: bool
    lxc_path: ContainerPath
    lxc_release: Annotated[str, AfterValidator(lxc_release)]
    lxc_rootfs_tarball: ContainerPath | None
    lxc_config: list[Annotated[str, AfterValidator(lxc_config_line)]]
    template_storage: StorageId
    template: Annotated[str, AfterValidator(template_name)]
    pve_container_native_dev_min: Annotated[str, BeforeValidator(_version_text),
                                            AfterValidator(devn_minimum)]


class ContainerSettings(_Strict):
    """Settings of one GPU container and the SGLang server inside it."""

    hostname: Annotated[str, AfterValidator(dns_name)] | None
    rootfs_storage: StorageId
    # Ranges as pve-container's src/PVE/LXC/Config.pm declares them: cores 1..8192, memory
    # (MiB) >= 16, swap (MiB) >= 0; a new rootfs is STORAGE:SIZE_GiB ($NEW_DISK_RE in
    # src/PVE/LXC.pm), where 0 would mean no disk image at all, so at least 1.
    rootfs_size_gib: Int = Field(ge=1)
    cores: Int = Field(ge=1, le=8192)
    memory_mib: Int = Field(ge=16)
    swap_mib: Int = Field(ge=0)
    net0: Annotated[str, AfterValidator(net_options)]
    unprivileged: bool
    onboot: bool
    nesting: bool
    gpus: Union[Literal["all"], list[Annotated[Int, Field(ge=0)]]]
    mounts: list[Mount]

    sglang_version: ExactVersion
    # null: the version sglang_version requires; filled in by _set_follows_the_release.
    torch_version: ExactVersion | None
    flashinfer_version: ExactVersion | None
    # null: the CUDA of the set's torch (tasks/container.py asks stack.releases.toolkit_version).
    cuda_toolkit_version: Annotated[str, BeforeValidator(_version_text),
                                    AfterValidator(major_minor)] | None
    uv_version: ExactVersion
    venv_path: ContainerPath
    pip_index_url: HttpUrl | None
    ca_certificates: list[LocalPath]
    wheelhouse: ContainerPath | None
    torch_index_url: HttpUrl | None
    stack_install: Literal["pinned", "sglang-no-deps"]
    stack_lock: Annotated[str, AfterValidator(local_file)] | None
    # null: the python3 of the Debian release the host creates the container from (the hosts
    # file fills it in from template or lxc_release), Debian 12's where nothing names one.
    stack_python: Annotated[str, BeforeValidator(_python_of_release), BeforeValidator(_version_text),
                            AfterValidator(major_minor), AfterValidator(debian_python)]
    wheel_store: MountPath | None
    shared_layer: bool
    nvidia_runfile_url: HttpUrl | None
    nvidia_runfile_path: Annotated[str, AfterValidator(local_file)] | None

    service_name: Annotated[str, AfterValidator(unit_word)]
    model_path: ContainerPath
    model_download: Annotated[str, AfterValidator(hf_repo_id)] | None
    model_revision: Annotated[str, AfterValidator(git_revision)] | None
    model_store: MountPath | None
    model_accept_unhashed: bool
    served_model_name: Annotated[str, AfterValidator(model_name)] | None
    # An IP address, not a host name: the server binds to it (a name may resolve to several
    # addresses, or to none in the container) and verify reaches the server by it.
    server_host: Annotated[str, AfterValidator(ip_address)]
    server_port: Port
    tp_size: Int | None = Field(ge=1)
    # ignored (valid-type): a Literal of a tuple, the values listed once above; pydantic reads
    # them at run time, mypy takes only literal values.
    moe_runner_backend: Literal[MOE_RUNNER_BACKENDS]  # type: ignore[valid-type]
    attention_backend: Literal[ATTENTION_BACKENDS]  # type: ignore[valid-type]
    mem_fraction_static: float = Field(gt=0, lt=1)
    max_running_requests: Int | None = Field(ge=1)
    disable_cuda_graph: bool
    cuda_graph_max_bs: Int | None = Field(ge=1)
    # -1: no chunking (sglang's own meaning); 0 or below -1 mean nothing there.
    chunked_prefill_size: Annotated[Int, AfterValidator(chunk_size)] | None
    schedule_policy: Literal[SCHEDULE_POLICIES] | None  # type: ignore[valid-type]
    enable_flashinfer_allreduce_fusion: bool
    enable_metrics: bool
    extra_server_args: list[Annotated[str, AfterValidator(server_argument)]]
    sglang_cache_dir: ContainerPath
    hf_token: SecretStr | None
    api_key: SecretStr | None
    # Up to a day: a 400 GB model loads in many minutes, not in days (a longer value is a typo).
    health_timeout_s: Int = Field(ge=1, le=86400)
    startup_stall_s: Int = Field(ge=1, le=86400)
    restart_on_change: bool
    upgrade_rollback: bool
    # Minutes to days; up to a week (a longer trial keeps the previous stack forever).
    upgrade_probation_s: Int = Field(ge=0, le=604800)
    retry_failed_stack: bool
    stack_retention: Int = Field(ge=1, le=100)
    generation_check: bool
    # One short completion answers in seconds; up to an hour for a slow first compile.
    generation_timeout_s: Int = Field(ge=1, le=3600)
    nodes: list[Annotated[str, Field(min_length=1)]]
    dist_init_addr: Annotated[str, AfterValidator(address)] | None
    dist_init_port: Port

    bench: bool
    bench_preset: Literal["full", "quick"]
    bench_concurrencies: list[Annotated[Int, Field(ge=1)]] = Field(min_length=1)
    bench_quick_concurrencies: list[Annotated[Int, Field(ge=1)]] = Field(min_length=1)
    bench_num_prompts: Int = Field(ge=1)
    bench_prompts_per_concurrency: Int = Field(ge=1)
    bench_input_len: Int = Field(ge=1)
    bench_output_len: Int = Field(ge=1)
    bench_prompts_file: Annotated[str, AfterValidator(prompts_file)] | None
    bench_history_dir: LocalPath
    bench_regression_pct: float = Field(gt=0, lt=100)
    bench_gpu_sample_ms: Int = Field(ge=50, le=60000)
    bench_metrics_sample_ms: Int = Field(ge=100, le=60000)
    bench_low_power_pct: float = Field(ge=0, le=100)

    # Coordinates and values are checked against the tuning space when the hosts file is read
    # (hosts_file: tuning.space.user_space), where the release is known.
    tune_space: dict[str, list[Any]] | None
    # From ten minutes (a restart and one benchmark) up to a week.
    tune_budget_s: Int = Field(ge=600, le=604800)
    tune_concurrency: Int | None = Field(ge=1)
    tune_max_p99_ttft_ms: float | None = Field(gt=0)
    tune_dir: LocalPath

    @field_validator("gpus", "nodes", "bench_concurrencies", "bench_quick_concurrencies")
    @classmethod
    def _distinct(cls, value: Any, info: ValidationInfo) -> Any:
        """A GPU, node or concurrency listed twice is a mistake; ``gpus: []`` passes no GPU."""
        if info.field_name == "gpus" and value == []:
            raise ValueError("an empty list passes no GPU; allowed: 'all' or a list of GPU "
                             "indices, e.g. [0, 1]")
        if isinstance(value, list):
            repeated = sorted({item for item in value if value.count(item) > 1})
            if repeated:
                raise ValueError(f"{repeated} listed more than once; allowed: distinct values")
        return value

    @field_validator("mounts")
    @classmethod
    def _mount_points_distinct(cls, value: list[Mount]) -> list[Mount]:
        """Two mounts on one container path hide each other."""
        paths = [mount.path for mount in value]
        repeated = sorted({path for path in paths if paths.count(path) > 1})
        if repeated:
            raise ValueError(f"mount path {repeated} used more than once; allowed: one mount a path")
        return value

    _secret_from_env = field_validator("hf_token", "api_key", mode="before")(
        classmethod(lambda cls, value: secret_from_env(value)))
    _secret_is_usable = field_validator("hf_token", "api_key")(
        classmethod(lambda cls, value: usable_secret(value)))

    @model_validator(mode="after")
    def _set_follows_the_release(self) -> ContainerSettings:
        """sglang_version picks the set: torch and flashinfer follow its own requirements, and
        a pin of the user's must be one the release allows (before the lock is looked at)."""
        if self.stack_install != "pinned":
            return self
        try:
            release = read_release(self.sglang_version, self.pip_index_url)
        except ReleaseError as error:
            raise ValueError(f"field 'sglang_version' = {self.sglang_version!r}: {error}; "
                             "allowed: a release on the package index") from None
        try:
            chosen = choose(release, self.torch_version, self.flashinfer_version,
                            self.stack_python)
            toolkit_pin(release, self.cuda_toolkit_version)
        except ReleaseError as error:
            raise ValueError(str(error)) from None
        self.torch_version, self.flashinfer_version = chosen.torch, chosen.flashinfer
        return self

    @model_validator(mode="after")
    def _lock_is_the_pinned_set(self) -> ContainerSettings:
        """A lock there is (stack_lock's, or the repository's) must hold the pins: a lock made
        later, on the machine running pyinfra, is checked when it is made."""
        if self.stack_install != "pinned":
            return self
        key = key_of(self)
        path = lock_path(key, self.stack_lock)
        if path.exists():
            try:
                read_checked(path, key)
            except LockError as error:
                where = "field 'stack_lock'" if self.stack_lock else "the repository's lock"
                raise ValueError(f"{where}: {error}") from None
        return self

    @model_validator(mode="after")
    def _wheel_store_is_its_own_mount(self) -> ContainerSettings:
        if self.wheel_store and any(m.path.rstrip("/") == self.wheel_store.rstrip("/")
                                    for m in self.mounts):
            raise ValueError(f"field 'wheel_store' = {self.wheel_store!r} is a mount's path too; "
                             "allowed: a folder no mount uses, or null")
        return self

    @model_validator(mode="after")
    def _model_store_mount_is_free(self) -> ContainerSettings:
        """The store's mount goes on model_path: a mount of the user's there would hide it."""
        if self.uses_model_store and any(m.path.rstrip("/") == self.model_path.rstrip("/")
                                         for m in self.mounts):
            raise ValueError(f"field 'model_store' = {self.model_store!r}: model_path "
                             f"{self.model_path!r} is a mount's path too; allowed: model_store "
                             "null (the model from that mount), or no mount on model_path")
        if self.uses_model_store:
            mount_path(self.model_path)
        return self

    @property
    def uses_model_store(self) -> bool:
        """Whether model_download is fetched once into the host's model store and mounted
        read-only at model_path (else into the container's own model_path)."""
        return self.model_store is not None and self.model_download is not None

    @property
    def uses_wheel_store(self) -> bool:
        """Whether the container installs the locked set from the host's wheel store."""
        return self.stack_install == "pinned" and self.wheel_store is not None

    @property
    def uses_shared_layer(self) -> bool:
        """Whether the venv reads the locked set but sglang from the host's shared layer."""
        return self.uses_wheel_store and self.shared_layer

    @property
    def all_mounts(self) -> list[Mount]:
        """The mounts the container gets: the user's, the wheel store and the model's commit
        in the model store (its ``serving`` link), read-only."""
        store = [Mount(host_path=wheels, path=wheels, read_only=True)] \
            if self.uses_wheel_store and (wheels := self.wheel_store) is not None else []
        if self.uses_model_store:
            assert self.model_store is not None and self.model_download is not None
            link = serving_link(self.model_store, self.model_download, self.model_revision)
            store.append(Mount(host_path=link, path=self.model_path, read_only=True))
        return [*self.mounts, *store]

    @model_validator(mode="after")
    def _tp_fits_gpus(self) -> ContainerSettings:
        """TP against the GPUs: as far as the settings alone tell (``gpus: all`` waits for the
        host's GPU count, in preflight)."""
        per_node = len(self.gpus) if isinstance(self.gpus, list) else None
        tensor_parallel_size(self.tp_size, per_node, len(self.nodes))
        if self.dist_init_port == self.server_port:
            raise ValueError(f"dist_init_port {self.dist_init_port} is server_port too; allowed: "
                             "two different ports")
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

    # --- views: the part of these settings one area reads (see _View) ---------------------
    @property
    def stack(self) -> StackView:
        return StackView.of(self)

    @property
    def server(self) -> ServerView:
        return ServerView.of(self)

    @property
    def model(self) -> ModelView:
        return ModelView.of(self)

    @property
    def benchmark(self) -> BenchView:
        return BenchView.of(self)

    @property
    def tuning(self) -> TuningView:
        return TuningView.of(self)

    @property
    def lxc(self) -> LxcView:
        return LxcView.of(self)


_ViewT = TypeVar("_ViewT", bound="_View")


class _View(BaseModel):
    """A read-only part of one container's settings: the fields (and derived values) the
    functions of one area read, under their ``ContainerSettings`` names. A function given a view
    cannot read another area's settings (mypy says so; at run time: AttributeError). Built from
    settings already validated, so not validated again; the schema and its messages stay
    ``ContainerSettings``'."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def of(cls: type[_ViewT], settings: ContainerSettings) -> _ViewT:
        return cls.model_construct(**{name: getattr(settings, name) for name in cls.model_fields})


class StackView(_View):
    """The stack: the release and its pins, the Python, the venv, where its wheels, the CUDA
    toolkit and the driver's runfile come from (``stack/``, the container phase's stack
    steps)."""

    sglang_version: str
    torch_version: str | None
    flashinfer_version: str | None
    cuda_toolkit_version: str | None
    uv_version: str
    venv_path: str
    pip_index_url: str | None
    ca_certificates: list[str]
    wheelhouse: str | None
    torch_index_url: str | None
    stack_install: Literal["pinned", "sglang-no-deps"]
    stack_lock: str | None
    stack_python: str
    wheel_store: str | None
    shared_layer: bool
    nvidia_runfile_url: str | None
    nvidia_runfile_path: str | None
    uses_wheel_store: bool
    uses_shared_layer: bool


class ServerView(_View):
    """The server: its command line, unit, env file and the unit that switches a failed stack
    back (``server/command.py``, ``server/unit_text.py``, ``server/render.py``)."""

    service_name: str
    venv_path: str
    sglang_version: str
    model_path: str
    served_model_name: str | None
    server_host: str
    server_port: int
    tp_size: int | None
    moe_runner_backend: str
    attention_backend: str
    mem_fraction_static: float
    max_running_requests: int | None
    disable_cuda_graph: bool
    cuda_graph_max_bs: int | None
    chunked_prefill_size: int | None
    schedule_policy: str | None
    enable_flashinfer_allreduce_fusion: bool
    enable_metrics: bool
    extra_server_args: list[str]
    sglang_cache_dir: str
    api_key: SecretStr | None
    # The env file's variables (``ContainerSettings.secrets``): never in a repr.
    secrets: dict[str, str] = Field(repr=False)
    health_timeout_s: int
    upgrade_rollback: bool
    nodes: list[str]
    dist_init_addr: str | None
    dist_init_port: int

    @property
    def stacks_at(self) -> StacksAt:
        """Where the container's stacks are (``venv_path``) and what names their state record
        (the service): the one value the stack switch's operations take."""
        return StacksAt(self.venv_path, self.service_name)


class ModelView(_View):
    """The model: where it is served from, what is fetched and into which store
    (``model_store/``)."""

    model_path: str
    model_download: str | None
    model_revision: str | None
    model_store: str | None
    model_accept_unhashed: bool
    uses_model_store: bool


class BenchView(_View):
    """The benchmark: its levels, prompts, samplers and history, and what it asks of the server
    it measures (``server/bench.py``, ``server/bench_history.py``)."""

    bench: bool
    bench_preset: Literal["full", "quick"]
    bench_concurrencies: list[int]
    bench_quick_concurrencies: list[int]
    bench_num_prompts: int
    bench_prompts_per_concurrency: int
    bench_input_len: int
    bench_output_len: int
    bench_prompts_file: str | None
    bench_history_dir: str
    bench_regression_pct: float
    bench_gpu_sample_ms: int
    bench_metrics_sample_ms: int
    bench_low_power_pct: float
    model_path: str
    served_model_name: str | None
    server_port: int
    enable_metrics: bool


class TuningView(_View):
    """The tuning search: its space, budget, load and bound, and what it reads of the server it
    moves and the benchmark it measures with: the release its space is spelled for, each
    coordinate's value as found (where the search starts: ``tuning.space.start_of``), the
    objective's default level, the benchmark's lengths and the low power bound its signals use
    (``tuning/``, ``tasks/tune.py``)."""

    tune_space: dict[str, list[Any]] | None
    tune_budget_s: int
    tune_concurrency: int | None
    tune_max_p99_ttft_ms: float | None
    tune_dir: str
    sglang_version: str
    # The coordinates (``tuning.space.COORDINATES``): the server's values the search moves.
    max_running_requests: int | None
    mem_fraction_static: float
    disable_cuda_graph: bool
    cuda_graph_max_bs: int | None
    moe_runner_backend: str
    chunked_prefill_size: int | None
    schedule_policy: str | None
    bench_concurrencies: list[int]
    bench_input_len: int
    bench_output_len: int
    bench_low_power_pct: float


class LxcView(_View):
    """The container itself: its Proxmox/LXC keys, resources, network, GPUs and every mount it
    gets (``container_config/``, the host phase's container steps)."""

    hostname: str | None
    rootfs_storage: str
    rootfs_size_gib: int
    cores: int
    memory_mib: int
    swap_mib: int
    net0: str
    unprivileged: bool
    onboot: bool
    nesting: bool
    gpus: Literal["all"] | list[int]
    all_mounts: list[Mount]


#: Each view and the property of ``ContainerSettings`` that gives it.
VIEWS: dict[str, type[_View]] = {"stack": StackView, "server": ServerView, "model": ModelView,
                                 "benchmark": BenchView, "tuning": TuningView, "lxc": LxcView}


#: The gateway's secrets (``config/gateway.py``'s settings, which build on these): masked too.
GATEWAY_SECRET_FIELDS = frozenset({"gateway_api_key"})
HOST_FIELDS = frozenset(HostSettings.model_fields)
CONTAINER_FIELDS = frozenset(ContainerSettings.model_fields)
#: Settings that hold secrets (their values are never shown), from their pydantic types.
SECRET_FIELDS = frozenset(
    name for name, field in ContainerSettings.model_fields.items()
    if field.annotation is SecretStr or SecretStr in typing.get_args(field.annotation)
)


def _is_connector_key(key: str) -> bool:
    return key in CONNECTOR_KEYS


def did_you_mean(key: str, allowed: typing.Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the allowed name closest to a mistyped KEY, else ``""``."""
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _allowed_hint(key: str, allowed: frozenset[str]) -> str:
    return f"{did_you_mean(key, allowed)}; allowed fields: {', '.join(sorted(allowed))}"


def shown(top: str, value: Any) -> Any:
    """A value of field TOP as an error message may show it: secrets masked, also inside
    extra_server_args and a URL's user:password@."""
    if top in SECRET_FIELDS or top in GATEWAY_SECRET_FIELDS:
        return "<secret>"
    if isinstance(value, str) and top.endswith("_url"):
        # user:password@ of a URL is a secret too.
        return re.sub(r"(?<=://)[^/@]*@", "<secret>@", value)
    if top == "extra_server_args" and isinstance(value, (list, str)):
        items = value if isinstance(value, list) else [value]
        shown, hide = [], False
        for arg in items:
            secret = isinstance(arg, str) and len(flag := arg.split("=", 1)[0]) > 2 and any(
                name.startswith(flag) for name in SECRET_FLAGS)
            shown.append("<secret>" if hide or (secret and "=" in arg) else arg)
            hide = secret and "=" not in arg
        return shown if isinstance(value, list) else shown[0]
    return value


def _union_branch(part: Any) -> TypeGuard[str]:
    """pydantic names the member of a union in an error's location (``list[...]``)."""
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def _format_error(where: str, error: ValidationError, data: dict[str, Any]) -> str:
    lines = []
    for item in error.errors():
        loc = [part for part in item["loc"] if not _union_branch(part)]
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "literal_error":
            message = "not allowed; " + message.replace("Input should be", "allowed:")
        if not loc:
            # A rule over several fields: its message names them.
            lines.append(f"{where}: {message}")
            continue
        top = str(loc[0])
        # A union tried each member: keep the errors of the member the value's type meant.
        branch = next((part for part in item["loc"] if _union_branch(part)), None)
        value = data.get(top, "<missing>")
        if branch and (branch.startswith("literal") != isinstance(value, str)):
            continue
        if len(loc) > 1 and item["type"] != "missing":
            value = item["input"]
            if top == "extra_server_args" and isinstance(data.get(top), list):
                # Masked by its place: the item after --api-key is the key.
                value = shown(top, data[top])[loc[1]]
        field = ".".join(str(part) for part in loc)
        line = f"{where}: field '{field}' = {shown(top, value)!r}: {message}"
        if line not in lines:
            lines.append(line)
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


_Model = TypeVar("_Model", bound=BaseModel)


def host_settings(model: type[_Model], of: Any = None) -> _Model:
    """MODEL's settings of pyinfra host OF (the current host when None), validated once per run
    and shared by every phase and operation that asks: host data does not change while the
    deploy runs. A value that fails validation raises ``SettingsError`` at each ask."""
    from pyinfra import host

    from pve_sglang.runtime.cache import Kind, memo

    target = host if of is None else of
    known = memo(Kind.SETTINGS, of=of)
    if model not in known:
        known[model] = settings_for(target.data, model)
    return known[model]
