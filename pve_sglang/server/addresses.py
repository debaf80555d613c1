"""Where the server is reached: ``host:port`` and its URL, IPv6 addresses in brackets."""

from __future__ import annotations

import ipaddress


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    bare = host.strip("[]")
    try:
        if ipaddress.ip_address(bare).version == 6:
            return f"[{bare}]:{port}"
    except ValueError:
        pass
    return f"{bare}:{port}"


def base_url(host: str, port: int) -> str:
    """The server's base URL, ``http://host:port`` (``http://[::1]:30000`` for IPv6)."""
    return f"http://{host_port(host, port)}"


def client_address(server_host: str) -> str:
    """Where a client in the container reaches a server bound to ``server_host``: a wildcard
    address (every interface) is reached on loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(server_host, server_host)
