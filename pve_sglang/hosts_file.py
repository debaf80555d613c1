"""The user's hosts file (YAML) turned into pyinfra inventory groups.

A host entry holds host settings, connection keys (``ssh_*``, and the container connector's own
keys as defaults for its containers) and container settings that act as defaults for its
containers; ``containers`` lists the containers, each with ``vmid`` (Proxmox) or ``name`` (plain
LXC) and its own overrides.

Every problem of the file (YAML syntax, structure, names, fields) and of values given with
``pyinfra --data`` is a ``SettingsError`` naming the file and line where known, the host, the
field, the value (never a secret's) and what is allowed: nothing here raises anything else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr
from pyinfra.api.exceptions import ConnectorDataTypeError
from pyinfra.api.util import raise_if_bad_type

from pve_sglang.connectors import connector_data_types
from pve_sglang.connectors.container import LOCAL_HOSTNAMES as LOCAL_NAMES
from pve_sglang.container_config.lxc_keys import check_settings as check_lxc_settings
from pve_sglang.project import load_defaults
from pve_sglang.stack.platform import release_of
from pve_sglang.tuning.space import COORDINATES, SpaceError, user_space
from pve_sglang.tuning.tuned_file import TunedFileError, read_tuned, tuned_path
from pve_sglang.runtime import pyinfra_private
from pve_sglang.config.gateway import (
    GATEWAY_CONTAINER_DEFAULTS,
    GATEWAY_CONTAINER_FIELDS,
    GATEWAY_FIELDS,
    GATEWAY_SECRET_FIELDS,
    validate_gateway,
)
from pve_sglang.gateway.workers import Serving, choose_workers, model_of
from pve_sglang.config.monitoring import (
    MONITORING_CONTAINER_DEFAULTS,
    MONITORING_CONTAINER_FIELDS,
    MONITORING_FIELDS,
    validate_monitoring,
)
from pve_sglang.monitoring import targets as monitoring_targets
from pve_sglang.config.settings import (
    CONTAINER_FIELDS,
    container_hostname,
    HOST_FIELDS,
    SECRET_FIELDS,
    SettingsError,
    did_you_mean,
    pve_container_version,
    check_container_keys,
    check_vmid,
    shown,
    validate_container,
    validate_host,
)

HOSTS_FILE_ENV = "PVE_SGLANG_HOSTS"
DEFAULT_HOSTS_FILE = "hosts.yml"
# Used when no hosts file exists: a local Debian LXC container on this machine.
EMBEDDED_HOSTS_FILE = Path(__file__).resolve().parent / "embedded_hosts.yml"

#: platform -> (connector entry point, key naming a container in the file, connector data key).
PLATFORMS = {"pve": ("pct", "vmid", "pct_vmid"), "lxc": ("lxc", "name", "lxc_name")}
#: The connector that reaches a host (and, from a container connector, the host it lives on).
HOST_CONNECTOR = "ssh"
#: Keys this module writes into host data; a hosts file or ``--data`` cannot set them.
INVENTORY_KEYS = frozenset(
    {"pve_host", "containers", "tune_pinned", "tuned_file", "gateways", "gateway_worker_list",
     "monitoring", "monitoring_targets", "monitoring_caps", "monitoring_external",
     *(data_key for _, _, data_key in PLATFORMS.values())}
)
#: Keys that decide the inventory's shape (names, connectors): ``--data`` cannot change them,
#: because pyinfra applies ``--data`` after the inventory was built from the file.
SHAPE_KEYS = frozenset({"platform", "ssh_hostname"})
#: A host's name: pyinfra's inventory name, the SSH host name when ``ssh_hostname`` is unset,
#: and part of its containers' ``@pct/HOST/VMID`` names (so no ``/``, ``@`` or spaces).
HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
HOST_NAME_ALLOWED = "letters, digits, '.', '-' and '_' (not first or last), or '@local'"

Group = list[tuple[str, dict[str, Any]]]
Lines = dict[tuple[Any, ...], int]


#: Connector keys that hold secrets.
SECRET_CONNECTOR_KEYS = frozenset(
    key for key in connector_data_types(HOST_CONNECTOR) if key.endswith("password")
)
ENV_PREFIX = "env:"


class HostSecret(SecretStr):
    """A secret written literally in the hosts file, as it sits in pyinfra host data.

    pyinfra prints host data (``debug-inventory``) through ``to_json``, so the value shows
    masked; the settings take it as the ``SecretStr`` it is.
    """

    def to_json(self) -> str:
        """What pyinfra prints for it."""
        return "<secret>"


class HostsDocument(dict):
    """A parsed hosts file: host name -> entry, plus the file's path and the line of each node."""

    def __init__(self, content: dict, path: Path | None = None, lines: Lines | None = None):
        super().__init__(content)
        self.path = path
        self.lines: Lines = lines or {}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a hosts file must not."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor": merged keys may be overridden, that is the point
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # SafeConstructor reports it ("found unhashable key")
            if key in seen:
                raise SettingsError(
                    f"line {key_node.start_mark.line + 1}: key {key!r} appears twice"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def hosts_file_path(cwd: Path | None = None) -> Path:
    """The hosts file in use: ``$PVE_SGLANG_HOSTS``, else ``hosts.yml``, else the embedded one."""
    if os.environ.get(HOSTS_FILE_ENV):
        path = Path(os.environ[HOSTS_FILE_ENV])
        if not path.is_file():
            raise SettingsError(f"{HOSTS_FILE_ENV}={path}: no such file")
        return path
    path = (cwd or Path.cwd()) / DEFAULT_HOSTS_FILE
    return path if path.is_file() else EMBEDDED_HOSTS_FILE


def _yaml_error(path: Path, text: str, error: yaml.YAMLError) -> str:
    """A YAML error as file, line, column and problem, without PyYAML's snippet of the line
    (it could show a secret written on it)."""
    if isinstance(error, yaml.reader.ReaderError):
        line = text.count("\n", 0, error.position) + 1
        char = error.character if isinstance(error.character, int) else ord(error.character[:1])
        return f"{path} line {line}: character U+{char:04X} is not allowed in YAML"
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"{path} line {mark.line + 1}, column {mark.column + 1}" if mark else f"{path}"
    parts = [getattr(error, "context", None), getattr(error, "problem", None)]
    problem = ": ".join(part for part in parts if part) or type(error).__name__
    if "'\\t'" in problem:
        problem += " (YAML indents with spaces only; replace the tab)"
    return f"{where}: YAML syntax error: {problem}"


def _node_lines(
    loader: yaml.SafeLoader, node: yaml.Node, path: tuple = (), depth: int = 5
) -> Lines:
    """The line of every node down to ``depth`` levels, keyed by its path of keys and indices."""
    lines = {path: node.start_mark.line + 1}
    if depth == 0:
        return lines
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = loader.construct_object(key_node)
                if isinstance(key, Hashable):
                    lines.update(_node_lines(loader, value_node, (*path, key), depth - 1))
                    lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines.update(_node_lines(loader, item, (*path, index), depth - 1))
    return lines


def read_hosts_file(path: Path) -> HostsDocument:
    """Parse the YAML hosts file: UTF-8, one document, a mapping, no duplicate keys."""
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise SettingsError(f"{path}: cannot read the hosts file: {error.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise SettingsError(
            f"{path} line {line}: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
            f"{error.start}); save the hosts file as UTF-8"
        ) from None
    loader = None
    try:
        loader = _UniqueKeyLoader(text)
        node = loader.get_single_node()
        content = loader.construct_document(node) if node is not None else None
        lines = _node_lines(loader, node) if node is not None else {}
    except SettingsError as error:
        raise SettingsError(f"{path} {error}") from None
    except yaml.YAMLError as error:
        raise SettingsError(_yaml_error(path, text, error)) from None
    except RecursionError:
        raise SettingsError(f"{path}: YAML nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    if content is None:
        raise SettingsError(
            f"{path}: the hosts file is empty; expected a mapping of host names to host "
            "entries (see hosts.example.yml)"
        )
    if not isinstance(content, dict):
        raise SettingsError(
            f"{path} line {lines.get((), 1)}: the top level is {_kind(content)}; expected a "
            "mapping of host names to host entries (see hosts.example.yml)"
        )
    if not content:
        raise SettingsError(f"{path}: no hosts; expected a mapping of host names to host entries")
    return HostsDocument(content, Path(path), lines)


def _kind(value: Any) -> str:
    """What a YAML value is, for a message: "a list", "an integer", ..."""
    kinds = {
        dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
        float: "a number", type(None): "null",
    }
    return kinds.get(type(value), f"a {type(value).__name__}")


def _at(hosts: Any, *path: Any) -> str:
    """`` (FILE line N)`` for a node of the file, when the file told where it is."""
    lines: Lines = getattr(hosts, "lines", {})
    source = getattr(hosts, "path", None)
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return f" ({source or 'hosts file'} line {lines[path[:end]]})"
    return f" ({source})" if source else ""


def _mentions(text: str, key: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", text) is not None


def _located(
    error: SettingsError, hosts: Any, *paths: tuple, override: dict | None = None
) -> SettingsError:
    """``error`` with a file line: of the field it names under one of ``paths`` (first match),
    else of the entry at the first path; none when the value came from ``--data``."""
    first, _, rest = str(error).partition("\n")
    if " line " in first or any(_mentions(first, key) for key in override or {}):
        return error
    lines: Lines = getattr(hosts, "lines", {})
    fields = re.findall(r"(?:field|key) '([^'.]+)", first)
    found = next(((*path, f) for f in fields for path in paths if (*path, f) in lines), None)
    at = _at(hosts, *found) if found else _at(hosts, *paths[0])
    return SettingsError(f"{first}{at}" + (f"\n{rest}" if rest else ""))


def in_force(defaults: dict[str, Any] | None = None, host: dict[str, Any] | None = None,
              tuned: dict[str, Any] | None = None, own: dict[str, Any] | None = None,
              override: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings' precedence, written once; each later wins: DEFAULTS (``group_data/all.py``),
    the HOST entry (its container settings are its containers' defaults), TUNED (``make
    tune``'s best, the tuned file), the entry's OWN (a container's or a gateway's), OVERRIDE
    (``--data``). Without DEFAULTS: the data a ``validate_*`` puts over the defaults itself."""
    merged: dict[str, Any] = {}
    for layer in (defaults, host, tuned, own, override):
        merged.update(layer or {})
    return merged


def _shown(key: Any, value: Any) -> str:
    """A value for an error message: secrets masked (settings' own as ``settings.shown``)."""
    if key in SECRET_FIELDS | SECRET_CONNECTOR_KEYS | GATEWAY_SECRET_FIELDS:
        return "<secret>"
    return repr(shown(key, value) if isinstance(key, str) else value)


# Connector keys


def _user_connector_keys(platform: str) -> dict[str, Any]:
    """Keys of a platform's container connector that a user may set (the others the inventory
    sets: the container's name, the host from the host entry, ``lxc_path`` from the setting)."""
    connector = PLATFORMS[platform][0]
    host_keys = connector_data_types(HOST_CONNECTOR)
    return {
        key: type_
        for key, type_ in connector_data_types(connector).items()
        if key not in INVENTORY_KEYS and key not in host_keys and key not in HOST_FIELDS
    }


def _connector_prefixes() -> tuple[str, ...]:
    keys = set(connector_data_types(HOST_CONNECTOR))
    for connector, _, _ in PLATFORMS.values():
        keys |= set(connector_data_types(connector))
    return tuple(sorted({key.split("_", 1)[0] + "_" for key in keys}))


#: Connector keys whose value has a rule beyond its type: the settings' rule of the same kind.
CONNECTOR_VALUE_RULES = {"pct_pve_container": pve_container_version}


def _check_connector_value(where: str, key: str, value: Any, type_: Any) -> None:
    """The type pyinfra will check when it builds the connector, checked now; then the value's
    rule where it has one (a pve-container version the rules can compare)."""
    try:
        raise_if_bad_type(value, type_, ConnectorDataTypeError, "")
    except ConnectorDataTypeError as error:
        detail = str(error).lstrip(": ")
        raise SettingsError(
            f"{where}: field '{key}' = {_shown(key, value)}: {detail}; allowed: "
            f"{getattr(type_, '__name__', type_)}"
        ) from None
    rule = CONNECTOR_VALUE_RULES.get(key)
    if rule is not None and value is not None:
        try:
            rule(value)
        except ValueError as error:
            raise SettingsError(f"{where}: field '{key}' = {_shown(key, value)}: {error}") from None


def _check_entry_connector_keys(where: str, data: dict, platform: str, level: str) -> None:
    """Connector keys of a host entry (``level`` "host") or container entry ("container").

    A host entry may hold the SSH connector's keys (how pyinfra reaches the host) and the user
    keys of its platform's container connector (defaults for its containers); a container entry
    only the latter. Keys of the other platform's connector, keys the inventory sets, and typos
    are refused with what is allowed.
    """
    host_keys = connector_data_types(HOST_CONNECTOR)
    allowed = dict(_user_connector_keys(platform))
    if level == "host":
        allowed.update(host_keys)
    for key, value in data.items():
        if key in HOST_FIELDS or key in CONTAINER_FIELDS:
            continue
        if key in allowed:
            _check_connector_value(where, key, value, allowed[key])
        elif key in INVENTORY_KEYS:
            raise SettingsError(
                f"{where}: field '{key}' is set by the inventory itself (from the hosts file's "
                "structure: host names, vmid, name); remove it"
            )
        elif level == "container" and key in host_keys:
            raise SettingsError(
                f"{where}: field '{key}' says how to reach the host; set it on the host entry"
            )
        elif any(key in _user_connector_keys(other) for other in PLATFORMS if other != platform):
            raise SettingsError(
                f"{where}: field '{key}' belongs to another platform's connector (this host's "
                f"platform is {platform}); allowed connector keys here: "
                f"{', '.join(sorted(allowed))}"
            )
        elif key.startswith(_connector_prefixes()):
            raise SettingsError(
                f"{where}: unknown connector key '{key}'{did_you_mean(key, allowed)}; allowed "
                f"connector keys here: {', '.join(sorted(allowed))}"
            )


# --data


def cli_override_data() -> dict[str, Any]:
    """The data pyinfra's CLI gives every host over the inventory (``--data``, ``--user``, ...).

    pyinfra computes it before it loads the inventory and does not pass it in; this reads the
    options of the running ``pyinfra`` command through click and computes it with pyinfra's own
    function, so the values are exactly the ones pyinfra will use. Outside the CLI: none.
    """
    import click

    context = click.get_current_context(silent=True)
    if context is None:
        return {}
    params = context.find_root().params
    if "data" not in params:
        return {}
    return pyinfra_private.cli_override_data(
        params["data"],
        params.get("ssh_user"),
        params.get("ssh_key"),
        params.get("ssh_key_password"),
        params.get("ssh_port"),
        params.get("ssh_password"),
    )


def _check_override(override: dict[str, Any]) -> None:
    """Keys given with ``--data``: known, not shaping the inventory, no literal secret."""
    connector_keys = dict(connector_data_types(HOST_CONNECTOR))
    for platform in PLATFORMS:
        connector_keys.update(_user_connector_keys(platform))
    known = HOST_FIELDS | CONTAINER_FIELDS | GATEWAY_FIELDS | MONITORING_FIELDS | set(connector_keys)
    for key, value in override.items():
        where = f"--data {key}"
        if key in SECRET_FIELDS | GATEWAY_SECRET_FIELDS and not (
            value is None or (isinstance(value, str) and value.startswith(ENV_PREFIX))
        ):
            raise SettingsError(
                f"{where}: a secret given on the command line is visible to every user of this "
                f"machine (ps, /proc/*/cmdline); put it in an environment variable and give its "
                f"name: --data {key}={ENV_PREFIX}NAME"
            )
        if key in INVENTORY_KEYS or key in SHAPE_KEYS:
            raise SettingsError(
                f"{where}: '{key}' decides the inventory's hosts and connectors, which pyinfra "
                "builds before it applies --data; set it in the hosts file"
            )
        if key not in known:
            raise SettingsError(
                f"{where}: unknown field '{key}'{did_you_mean(key, known)}; allowed fields: see "
                "docs/settings.md and the connectors' keys (ssh_*, pct_local, lxc_local, "
                "lxc_home)"
            )
        if key in connector_keys:
            _check_connector_value(where, key, value, connector_keys[key])


def _with_override_note(error: SettingsError, override: dict[str, Any]) -> SettingsError:
    notes = [
        f"(field '{key}' is given with --data)"
        for key in override
        if _mentions(str(error), key)
    ]
    return SettingsError("\n".join([str(error), *notes])) if notes else error


# Structure


def _check_host_name(hosts: Any, name: Any) -> None:
    if not isinstance(name, str) or not name.strip():
        raise SettingsError(
            f"host name {name!r}{_at(hosts, name)}: a host name must be a non-empty string "
            f"(it is {_kind(name)}); allowed: {HOST_NAME_ALLOWED}"
        )
    if name != "@local" and not HOST_NAME.match(name):
        raise SettingsError(
            f"host name {name!r}{_at(hosts, name)}: not allowed; allowed: {HOST_NAME_ALLOWED} "
            "(set the address with ssh_hostname)"
        )


def _check_entry_keys(where: str, at: str, entry: dict) -> None:
    for key in entry:
        if not isinstance(key, str) or not key:
            raise SettingsError(
                f"{where}{at}: key {key!r} is {_kind(key)}; keys are setting names (strings)"
            )


def _mapping(where: str, at: str, value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SettingsError(
            f"{where}{at}: the {what} is {_kind(value)} ({value!r:.60}); expected a mapping "
            "of setting names to values"
        )
    _check_entry_keys(where, at, value)
    return dict(value)


def _container_inventory_name(platform: str, host: str, key: Any, local: bool) -> str:
    connector = PLATFORMS[platform][0]
    if platform == "pve":
        return f"@{connector}/{host}/{key}"
    return f"@{connector}/{key}" if local else f"@{connector}/{host}/{key}"


def _host_inventory_name(name: str, data: dict[str, Any]) -> str:
    if name in LOCAL_NAMES or data.get("ssh_hostname") in LOCAL_NAMES:
        return "@local"
    return name


def _hide_secrets(data: dict[str, Any]) -> dict[str, Any]:
    """Literal secrets become ``HostSecret`` in host data (``env:NAME`` stays: it is a name)."""
    return {
        key: HostSecret(value)
        if key in SECRET_FIELDS | GATEWAY_SECRET_FIELDS and isinstance(value, str) and not value.startswith(ENV_PREFIX)
        else value
        for key, value in data.items()
    }


def build_groups(
    hosts: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    override: dict[str, Any] | None = None,
) -> tuple[Group, Group]:
    """Validate every host and container, then return (pve_hosts, gpu_containers).

    ``override`` is the data pyinfra's ``--data`` gives every host: it wins over the file, so
    each host and container is validated with it. Raises SettingsError on the first bad value,
    before anything connects or changes.
    """
    defaults = load_defaults() if defaults is None else defaults
    override = dict(override or {})
    _check_override(override)
    if not isinstance(hosts, dict) or not hosts:
        raise SettingsError("expected a mapping of host names to host entries")
    pve_hosts: Group = []
    gpu_containers: Group = []
    effective: Group = []
    for host_name, raw_entry in hosts.items():
        _check_host_name(hosts, host_name)
        where = f"host {host_name}"
        entry = _mapping(where, _at(hosts, host_name), raw_entry, "host entry")
        containers = entry.pop("containers", None)
        entry.pop("gateways", None)  # build_gateways' part
        entry.pop("monitoring", None)  # build_monitoring's part
        if containers is None:
            containers = []
        if not isinstance(containers, list):
            raise SettingsError(
                f"{where}{_at(hosts, host_name, 'containers')}: field 'containers' is "
                f"{_kind(containers)}; expected a list of container entries (each with vmid "
                "or name)"
            )
        try:
            pairs = _build_host(host_name, entry, containers, defaults, override, hosts)
        except SettingsError as error:
            raise _with_override_note(error, override) from None
        inventory_name = _host_inventory_name(host_name, entry)
        host_keys = connector_data_types(HOST_CONNECTOR)
        host_data = {k: v for k, v in entry.items() if k in HOST_FIELDS or k in host_keys}
        names = []
        for name, data in pairs:
            names.append(name)
            effective.append((name, in_force(own=data, override=override)))
            gpu_containers.append((name, _hide_secrets(data)))
        pve_hosts.append((inventory_name, {**host_data, "containers": names}))
    try:
        _check_nodes(effective)
    except SettingsError as error:
        raise _with_override_note(error, override) from None
    return pve_hosts, gpu_containers


def _build_host(
    host_name: str,
    entry: dict[str, Any],
    containers: list,
    defaults: dict[str, Any],
    override: dict[str, Any],
    hosts: Any,
) -> Group:
    """Validate one host entry and its containers; return its containers' names and data."""
    host_settings = _validated_host(host_name, entry, defaults, override, hosts)
    platform = host_settings.platform
    data_key = PLATFORMS[platform][2]
    inventory_name = _host_inventory_name(host_name, entry)
    host_keys = connector_data_types(HOST_CONNECTOR)
    user_keys = _user_connector_keys(platform)
    connection = {k: v for k, v in entry.items() if k in host_keys or k in user_keys}
    container_defaults = {k: v for k, v in entry.items() if k in CONTAINER_FIELDS}
    if not containers:
        # Nothing uses the host's container settings yet: still refuse a bad one now.
        _validated_container(host_name, None, {}, container_defaults, host_settings,
                             defaults, override, hosts, (host_name,))
    seen: set[Any] = set()
    pairs: Group = []
    for index, raw in enumerate(containers):
        path = (host_name, "containers", index)
        key, container = _container_key(host_name, index, raw, platform, hosts, path)
        if key in seen:
            error = SettingsError(
                f"host {host_name}: {PLATFORMS[platform][1]} {key} is declared twice; each "
                f"container on a host needs its own {PLATFORMS[platform][1]}"
            )
            raise _located(error, hosts, path, (host_name,), override=override) from None
        seen.add(key)
        data = _validated_container(host_name, key, container, container_defaults,
                                    host_settings, defaults, override, hosts, path)
        name = _container_inventory_name(platform, host_name, key, inventory_name == "@local")
        pairs.append((name, {
            **connection,
            **data,
            "pve_host": inventory_name,
            "platform": platform,
            # The search's settings the container's own entry sets: the user's, never tuned.
            "tune_pinned": sorted(set(container) & set(COORDINATES)),
            # Where make tune keeps its best for this container (read back above, ``_tuned``).
            "tuned_file": str(_tuned_file(host_name, key, data, defaults, override)),
            data_key: key,
            **({"lxc_path": host_settings.lxc_path} if platform == "lxc" else {}),
        }))
    return pairs


def _validated_host(host_name: str, entry: dict[str, Any], defaults: dict[str, Any],
                    override: dict[str, Any], hosts: Any):
    """The host's settings (HostSettings) from its ENTRY; a bad one is refused with its line."""
    try:
        platform = in_force(defaults, host=entry, override=override).get("platform")
        if platform in PLATFORMS:
            _check_entry_connector_keys(f"host {host_name}", entry, platform, "host")
        return validate_host(host_name, in_force(host=entry, override=override), defaults)
    except SettingsError as error:
        raise _located(error, hosts, (host_name,), override=override) from None


def _container_key(host_name: str, index: int, raw: Any, platform: str, hosts: Any,
                   path: tuple) -> tuple[Any, dict[str, Any]]:
    """The container entry RAW's identity (vmid or name, by PLATFORM) and its other keys."""
    where = f"host {host_name}, container #{index + 1}"
    at = _at(hosts, *path)
    container = _mapping(where, at, raw, "container entry")
    identity = PLATFORMS[platform][1]
    if identity not in container:
        other = next((i for _, i, _ in PLATFORMS.values() if i != identity), None)
        hint = f"; '{other}' names containers on the other platform" if other in container else ""
        raise SettingsError(
            f"{where}{at}: no '{identity}' (platform {platform} names containers by "
            f"{identity}){hint}"
        )
    return container.pop(identity), container


def _validated_container(host_name: str, key: Any, container: dict[str, Any],
                         container_defaults: dict[str, Any], host_settings: Any,
                         defaults: dict[str, Any], override: dict[str, Any], hosts: Any,
                         path: tuple) -> dict[str, Any]:
    """The container's data (the host's container settings under its own), validated; KEY None
    checks the host's container settings alone. A bad one is refused with its line."""
    host_path = (host_name,)
    platform = host_settings.platform
    data = in_force(host=container_defaults, own=container)
    try:
        if key is not None:
            data = in_force(host=container_defaults,
                             tuned=_tuned(host_name, key, data, defaults, override), own=container)
        _check_tune_space(host_name, key, container,
                          in_force(defaults, own=data, override=override))
    except SettingsError as error:
        paths = (path, host_path) if path != host_path else (host_path,)
        raise _located(error, hosts, *paths, override=override) from None
    if in_force(defaults, own=data, override=override).get("stack_python") is None:
        # The container's python3 is its Debian release's: the template or lxc_release it is
        # created from (Proxmox VE 9's debian-13-standard, trixie: 3.13).
        data["stack_python"] = release_of(platform, host_settings.template,
                                          host_settings.lxc_release).python
    try:
        if key is not None:
            check_vmid(host_name, platform, key)
            _check_entry_connector_keys(f"host {host_name}, container {key}", container,
                                        platform, "container")
            check_container_keys(host_name, str(key), container)
        merged = in_force(own=data, override=override)
        cs = validate_container(host_name, "(defaults)" if key is None else str(key), merged,
                                defaults)
        if platform == "lxc":
            label = f"host {host_name}" + ("" if key is None else f", container {key}")
            check_lxc_settings(label, cs.lxc, merged, host_settings.lxc_config)
    except SettingsError as error:
        paths = (path, host_path) if path != host_path else (host_path,)
        raise _located(error, hosts, *paths, override=override) from None
    return data


def _tuned_file(host_name: str, key: Any, data: dict[str, Any], defaults: dict[str, Any],
                override: dict[str, Any]) -> Path | None:
    """Where make tune keeps the best of container KEY: in its ``tune_dir`` (None where that
    is not a path: the settings' own check names it)."""
    tune_dir = in_force(defaults, own=data, override=override).get("tune_dir")
    return tuned_path(tune_dir, host_name, str(key)) if isinstance(tune_dir, str) else None


def _tuned(host_name: str, key: Any, data: dict[str, Any], defaults: dict[str, Any],
           override: dict[str, Any]) -> dict[str, Any]:
    """The container's tuned file (``make tune``'s best), less what its own entry or ``--data``
    sets: those are the user's and win."""
    path = _tuned_file(host_name, key, data, defaults, override)
    if path is None:
        return {}  # the settings' own check names a bad tune_dir
    try:
        tuned = read_tuned(path)
    except TunedFileError as error:
        raise SettingsError(f"host {host_name}, container {key}: {error}") from None
    return {k: v for k, v in tuned.items() if k not in override}


def _check_tune_space(host_name: str, key: Any, container: dict[str, Any],
                      merged: dict[str, Any]) -> None:
    """tune_space: only the search's settings, each value allowed by its setting and the
    container's release, none that the container's own entry sets (the user's, never moved)."""
    given = merged.get("tune_space")
    if not isinstance(given, dict):
        return  # null, or the settings' own check names it
    where = f"host {host_name}" + ("" if key is None else f", container {key}")
    release = str(merged.get("sglang_version"))
    try:
        user_space({k: v if isinstance(v, list) else [v] for k, v in given.items()}, release)
    except SpaceError as error:
        raise SettingsError(f"{where}: field {error}") from None
    pinned = sorted(set(given) & set(container))
    if pinned:
        raise SettingsError(f"{where}: field tune_space names {', '.join(pinned)}, which the "
                            "container's own entry sets (the user's value, never moved by the "
                            "search); allowed: remove it from one of them")


def _check_nodes(gpu_containers: Group) -> None:
    """Every name in ``nodes`` must be a container of this inventory."""
    known = {name for name, _ in gpu_containers}
    for name, data in gpu_containers:
        nodes = data.get("nodes") or []
        for node in nodes:
            if node not in known:
                raise SettingsError(
                    f"container {name}: field 'nodes' names {node!r}, which is not a container "
                    f"of this inventory; allowed: {', '.join(sorted(known))}"
                )
        if nodes and name not in nodes:
            raise SettingsError(
                f"container {name}: field 'nodes' must include the container itself"
            )


# Gateways


def build_inventory(
    hosts: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    override: dict[str, Any] | None = None,
) -> tuple[Group, Group, Group]:
    """``build_groups``, then each host's ``gateways:`` (``build_gateways``): (pve_hosts,
    gpu_containers, gateways); a host's data names its gateways (``gateways``). The
    monitoring entries are checked too (``build_monitored_inventory`` returns them)."""
    pve_hosts, gpu_containers, gateways, _ = build_monitored_inventory(hosts, defaults, override)
    return pve_hosts, gpu_containers, gateways


def build_monitored_inventory(
    hosts: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    override: dict[str, Any] | None = None,
) -> tuple[Group, Group, Group, Group]:
    """``build_inventory``'s groups and the ``monitoring`` group (``build_monitoring``); a
    host's data names its gateways (``gateways``) and monitoring container (``monitoring``)."""
    defaults = load_defaults() if defaults is None else defaults
    pve_hosts, gpu_containers = build_groups(hosts, defaults, override)
    gateways = build_gateways(hosts, gpu_containers, defaults, override)
    monitoring = build_monitoring(hosts, pve_hosts, gpu_containers, gateways, defaults,
                                  override)
    by_host: dict[str, list[str]] = {}
    for name, data in gateways:
        by_host.setdefault(data["pve_host"], []).append(name)
    watched: dict[str, list[str]] = {}
    for name, data in monitoring:
        if not data.get("monitoring_external"):  # a container the host phase creates
            watched.setdefault(data["pve_host"], []).append(name)
    pve_hosts = [(name, {**data, "gateways": by_host.get(name, []),
                         "monitoring": watched.get(name, [])}) for name, data in pve_hosts]
    return pve_hosts, gpu_containers, gateways, monitoring


def _serving(name: str, data: dict[str, Any]) -> Serving:
    return Serving(name=name, hostname=container_hostname(data),
                   server_host=str(data.get("server_host")), server_port=int(data["server_port"]),
                   model=model_of(data), nodes=tuple(data.get("nodes") or ()),
                   has_key=data.get("api_key") is not None)


def build_gateways(hosts: dict[str, Any], gpu_containers: Group, defaults: dict[str, Any],
                   override: dict[str, Any] | None = None) -> Group:
    """Each host's ``gateways:`` entries (``vmid`` or ``name``, gateway settings, connector
    keys), validated, with the workers each fronts (``gateway_worker_list``) chosen from the
    serving containers (GPU_CONTAINERS): a SettingsError before anything connects."""
    override = dict(override or {})
    serving = [_serving(name, in_force(defaults, own=data, override=override))
               for name, data in gpu_containers]
    group: Group = []
    for host_name, raw_entry in hosts.items():
        entry = raw_entry if isinstance(raw_entry, dict) else {}
        items = entry.get("gateways")
        if items is None:
            continue
        if not isinstance(items, list):
            raise SettingsError(
                f"host {host_name}{_at(hosts, host_name, 'gateways')}: field 'gateways' is "
                f"{_kind(items)}; expected a list of gateway entries (each with vmid or name)")
        host_in_force = in_force(defaults, host=entry, override=override)
        platform: str = host_in_force["platform"]  # build_groups checked it
        data_key = PLATFORMS[platform][2]
        inventory_name = _host_inventory_name(host_name, entry)
        host_keys = connector_data_types(HOST_CONNECTOR)
        connection = {k: v for k, v in entry.items()
                      if k in host_keys or k in _user_connector_keys(platform)}
        lxc_path = host_in_force.get("lxc_path")
        host_entry = {k: v for k, v in entry.items()
                      if k not in ("containers", "gateways", "monitoring")}
        container_defaults = {**{k: v for k, v in host_entry.items() if k in GATEWAY_CONTAINER_FIELDS},
                              **GATEWAY_CONTAINER_DEFAULTS}
        allowed = GATEWAY_FIELDS | GATEWAY_CONTAINER_FIELDS
        for index, raw in enumerate(items):
            path = (host_name, "gateways", index)
            key, gateway = _container_key(host_name, index, raw, platform, hosts, path)
            where = f"host {host_name}, gateway {key}"
            try:
                check_vmid(host_name, platform, key)
                for field in gateway:
                    if field not in allowed and field not in _user_connector_keys(platform):
                        raise SettingsError(
                            f"{where}: unknown field '{field}'"
                            f"{did_you_mean(field, allowed)}; allowed fields: "
                            f"{', '.join(sorted(allowed))}")
                gs = validate_gateway(where, in_force(own=gateway, override=override), defaults)
                workers = choose_workers(where, gs.gateway_workers, serving)
                hs = validate_host(host_name, in_force(host=host_entry, override=override),
                                   defaults)
            except SettingsError as error:
                raise _with_override_note(
                    _located(error, hosts, path, override=override), override) from None
            # Its container, as the host phase creates it: a container's settings, no GPU.
            container = _validated_container(
                host_name, key, {k: v for k, v in gateway.items() if k in GATEWAY_CONTAINER_FIELDS},
                container_defaults, hs, defaults, override, hosts, path)
            name = _container_inventory_name(platform, host_name, key, inventory_name == "@local")
            if any(name == other for other, _ in gpu_containers + group):
                raise SettingsError(f"{where}{_at(hosts, *path)}: {PLATFORMS[platform][1]} {key} "
                                    "is a serving container or another gateway too; allowed: a "
                                    "container of its own")
            group.append((name, _hide_secrets({
                **connection,
                **container,
                **gateway,
                "pve_host": inventory_name,
                "platform": platform,
                data_key: key,
                **({"lxc_path": lxc_path} if platform == "lxc" else {}),
                "gateway_worker_list": [{"name": w.name, "url": w.url, "has_key": w.has_key}
                                        for w in workers],
            })))
    return group


# Monitoring


def build_monitoring(hosts: dict[str, Any], pve_hosts: Group, gpu_containers: Group,
                     gateways: Group, defaults: dict[str, Any],
                     override: dict[str, Any] | None = None) -> Group:
    """Each host's ``monitoring:`` entry (``vmid`` or ``name``, the monitoring's settings, its
    container's, connector keys): Prometheus's container, with what it scrapes
    (``monitoring_targets``: every server and gateway of the inventory) and each server's
    request cap (``monitoring_caps``), validated: a SettingsError before anything connects."""
    override = dict(override or {})
    if not any(isinstance(e, dict) and e.get("monitoring") is not None for e in hosts.values()):
        return []  # nothing to scrape for: no server needs to be reachable
    found: list[monitoring_targets.Target] = []
    caps: dict[str, int] = {}
    for name, data in gpu_containers:
        merged = in_force(defaults, own=data, override=override)
        merged["hostname"] = container_hostname(merged)
        where = f"host {data['pve_host']}, container {name}"
        target = monitoring_targets.server_target(where, name, data["pve_host"], merged)
        if target is not None:
            found.append(target)
            if merged.get("max_running_requests") is not None:
                caps[name] = int(merged["max_running_requests"])
    for name, data in gateways:
        merged = in_force(defaults, own=data, override=override)
        merged["hostname"] = container_hostname(merged)
        found.append(monitoring_targets.gateway_target(
            f"host {data['pve_host']}, gateway {name}", name, data["pve_host"], merged))
    group: Group = []
    for host_name, raw_entry in hosts.items():
        entry = raw_entry if isinstance(raw_entry, dict) else {}
        if entry.get("monitoring") is None:
            continue
        path = (host_name, "monitoring")
        host_in_force = in_force(defaults, host=entry, override=override)
        platform: str = host_in_force["platform"]  # build_groups checked it
        raw = entry["monitoring"]
        if isinstance(raw, dict) and raw.get("prometheus_address") is not None:
            group.append(_existing_prometheus(hosts, host_name, entry, raw, defaults, override,
                                              found, caps, group))
            continue
        key, item = _container_key(host_name, 0, raw, platform, hosts, path)
        where = f"host {host_name}, monitoring {key}"
        allowed = MONITORING_FIELDS | MONITORING_CONTAINER_FIELDS
        host_entry = {k: v for k, v in entry.items()
                      if k not in ("containers", "gateways", "monitoring")}
        try:
            check_vmid(host_name, platform, key)
            for field in item:
                if field not in allowed and field not in _user_connector_keys(platform):
                    raise SettingsError(f"{where}: unknown field '{field}'"
                                        f"{did_you_mean(field, allowed)}; allowed fields: "
                                        f"{', '.join(sorted(allowed))}")
            validate_monitoring(where, {**item, **override}, defaults)
            hs = validate_host(host_name, {**host_entry, **override}, defaults)
        except SettingsError as error:
            raise _with_override_note(
                _located(error, hosts, path, override=override), override) from None
        container_defaults = {
            **{k: v for k, v in host_entry.items() if k in MONITORING_CONTAINER_FIELDS},
            **MONITORING_CONTAINER_DEFAULTS}
        container = _validated_container(
            host_name, key, {k: v for k, v in item.items() if k in MONITORING_CONTAINER_FIELDS},
            container_defaults, hs, defaults, override, hosts, path)
        inventory_name = _host_inventory_name(host_name, entry)
        name = _container_inventory_name(platform, host_name, key, inventory_name == "@local")
        if any(name == other for other, _ in gpu_containers + gateways + group):
            raise SettingsError(f"{where}{_at(hosts, *path)}: {PLATFORMS[platform][1]} {key} "
                                "is a serving container or a gateway too; allowed: a "
                                "container of its own")
        host_keys = connector_data_types(HOST_CONNECTOR)
        connection = {k: v for k, v in entry.items()
                      if k in host_keys or k in _user_connector_keys(platform)}
        lxc_path = host_in_force.get("lxc_path")
        group.append((name, {
            **connection,
            **container,
            **item,
            "pve_host": inventory_name,
            "platform": platform,
            PLATFORMS[platform][2]: key,
            **({"lxc_path": lxc_path} if platform == "lxc" else {}),
            "monitoring_targets": [t.as_data() for t in found],
            "monitoring_caps": caps,
        }))
    return group


def _existing_prometheus(hosts: dict[str, Any], host_name: str, entry: dict[str, Any],
                         item: dict[str, Any], defaults: dict[str, Any],
                         override: dict[str, Any], found: list, caps: dict[str, int],
                         group: Group) -> tuple[str, dict[str, Any]]:
    """A ``monitoring:`` entry naming the user's own Prometheus (``prometheus_address``):
    reached by SSH (the host's ``ssh_*`` keys under the entry's own), where the deploy writes
    only what its prometheus.yml includes; no container."""
    path = (host_name, "monitoring")
    where = f"host {host_name}, monitoring"
    ssh_keys = set(connector_data_types(HOST_CONNECTOR)) - {"ssh_hostname"}
    allowed = MONITORING_FIELDS | ssh_keys
    try:
        _check_entry_keys(where, _at(hosts, *path), item)
        for field in item:
            if field not in allowed:
                raise SettingsError(
                    f"{where}: field '{field}' is not one of an existing Prometheus's (it has "
                    f"no container){did_you_mean(field, allowed)}; allowed fields: "
                    f"{', '.join(sorted(allowed))}")
        ms = validate_monitoring(where, {**item, **override}, defaults)
    except SettingsError as error:
        raise _with_override_note(
            _located(error, hosts, path, override=override), override) from None
    name = str(ms.prometheus_address)
    taken = {n for n, _ in group} | {_host_inventory_name(h, e if isinstance(e, dict) else {})
                                     for h, e in hosts.items()}
    if name in taken or name in LOCAL_NAMES:
        raise SettingsError(f"{where}{_at(hosts, *path)}: field 'prometheus_address' = {name!r} "
                            "is a host of the hosts file or another monitoring's; allowed: a "
                            "machine of its own")
    connection = {k: v for k, v in entry.items() if k in ssh_keys}
    return name, _hide_secrets({
        **connection,
        **{k: v for k, v in item.items() if k in ssh_keys},
        **{k: v for k, v in item.items() if k in MONITORING_FIELDS},
        "ssh_hostname": name,
        "pve_host": _host_inventory_name(host_name, entry),
        "monitoring_external": True,
        "monitoring_targets": [t.as_data() for t in found],
        "monitoring_caps": caps,
    })
