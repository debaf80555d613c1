"""The @pct connector without a container: its names data, the outer connector it takes, the
commands it makes (end to end through the stand-in ``pct``: tests/lxc/test_connector_pct.py).
"""

from __future__ import annotations

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import InventoryError
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector

from pve_sglang.connectors.pct import PctConnector


# Names and outer connector (no container needed)


def test_pct_make_names_data():
    assert list(PctConnector.make_names_data("pve1/105")) == [
        ("@pct/pve1/105", {"ssh_hostname": "pve1", "pct_vmid": 105}, ["@pct"]),
    ]
    assert list(PctConnector.make_names_data("105")) == [("@pct/105", {"pct_vmid": 105}, ["@pct"])]
    # The range's edges (Proxmox: 100..999999999) and their outside neighbours.
    for vmid in (100, 999_999_999):
        assert list(PctConnector.make_names_data(f"pve1/{vmid}")) == [
            (f"@pct/pve1/{vmid}", {"ssh_hostname": "pve1", "pct_vmid": vmid}, ["@pct"]),
        ]
    for bad in ("", "pve1", "pve1/abc", "pve1/99", "pve1/1000000000", "pve1/0105", "a/b/105", "/105"):
        with pytest.raises(InventoryError):
            list(PctConnector.make_names_data(bad))


def test_pct_outer_connector_choice():
    inventory = Inventory(
        (
            [
                "@pct/pve1/105",
                "@pct/localhost/106",
                "@pct/@local/107",
                ("@pct/pve2/108", {"pct_local": True}),
            ],
            {},
        ),
    )
    State(inventory, Config())
    kinds = {h.name: type(h.connector.outer) for h in inventory}
    assert kinds == {
        "@pct/pve1/105": SSHConnector,
        "@pct/localhost/106": LocalConnector,
        "@pct/@local/107": LocalConnector,
        "@pct/pve2/108": LocalConnector,
    }
    host = inventory.get_host("@pct/pve1/105")
    assert host.data.ssh_hostname == "pve1"
    assert host.data.pct_vmid == 105


def test_pct_command_shapes():
    inventory = Inventory(([("@pct/pve1/105", {"pct_pve_container": "6.1.10"}),
                            ("@pct/pve1/106", {"pct_pve_container": "5.0.8"})], {}))
    State(inventory, Config())
    old = inventory.get_host("@pct/pve1/106").connector
    assert old.make_exec_command(StringCommand("id")).get_raw_value() == (
        "pct exec 106 -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
        "container=lxc sh -c id"
    )
    connector = inventory.get_host("@pct/pve1/105").connector
    exec_command = connector.make_exec_command(StringCommand("sh", "-c", "'echo hi'"))
    assert exec_command.get_raw_value() == "pct exec 105 --keep-env 0 -- sh -c 'sh -c '\"'\"'echo hi'\"'\"''"
    # Not `pct push` (in place): the script renames a complete temporary file over DEST.
    push = connector.make_push_command("/tmp/a", "/etc/x y").get_raw_value()
    assert push.startswith("pct exec 105 --keep-env 0 -- sh -c 'umask 077; ")
    assert push.endswith("' sh '/etc/x y' \"$(wc -c < /tmp/a )\" < /tmp/a")
    assert connector.make_pull_command("/etc/x", "/tmp/b").get_raw_value() == (
        "pct pull 105 /etc/x /tmp/b"
    )
