"""pyinfra inventory: the Proxmox hosts, their GPU containers, gateways and monitoring, from the
hosts file.

The hosts file is ``$PVE_SGLANG_HOSTS``, else ``hosts.yml`` here, else the embedded default
(a local Debian LXC container). Every value, including those given with ``--data``, is
validated now, before pyinfra connects.
"""

import sys

from pve_sglang.hosts_file import (
    build_monitored_inventory,
    cli_override_data,
    hosts_file_path,
    read_hosts_file,
)
from pve_sglang.config.settings import SettingsError

try:
    pve_hosts, gpu_containers, gateways, monitoring = build_monitored_inventory(
        read_hosts_file(hosts_file_path()), override=cli_override_data()
    )
except SettingsError as error:
    # A clean message and a non-zero exit, before any host is contacted or changed.
    sys.stderr.write(f"pve-sglang: invalid settings\n{error}\n")
    sys.exit(2)
