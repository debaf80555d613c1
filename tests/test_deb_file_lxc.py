"""``stack.deb_file`` in a real LXC container (devtools/lxc_env.py, systemd as PID 1): a
``dpkg -i`` that fails once (a stand-in dpkg in front of the real one, as a held dpkg lock or a
full disk would make it fail) is made again by the next run, which then converges; a third run
changes nothing. The package is a small .deb built in the container with the real dpkg-deb."""

from __future__ import annotations

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from pve_sglang.operations import stack

DEB = "/var/cache/pvs-test/pvs-test-keyring.deb"
# Fails the first `dpkg -i` (as a held lock would), then is the real dpkg; `dpkg -l` always works.
FLAKY_DPKG = """#!/bin/sh
case " $* " in *" -i "*)
  if [ ! -e /run/pvs-dpkg-failed ]; then touch /run/pvs-dpkg-failed
    echo "dpkg: error: dpkg frontend lock was locked by another process" >&2; exit 2; fi;;
esac
exec /usr/bin/dpkg "$@"
"""


def run_deb_file(container) -> tuple[bool, bool]:
    """One run of the operation alone: (succeeded, changed)."""
    state = State(Inventory(([(container.inventory_name, container.host_data())], {})), Config())
    connect_all(state)
    (host,) = state.inventory.get_active_hosts()
    op = add_op(state, stack.deb_file, name="test keyring", path=DEB, package="pvs-test-keyring",
                version="1.0-1")
    try:
        run_ops(state)
    except PyinfraError:  # "No hosts remaining": the one host failed
        pass
    result = (op[host].did_succeed(), op[host].did_change())
    disconnect_all(state)
    return result


def test_a_failed_dpkg_install_is_made_by_the_next_run(lxc_container):
    box = lxc_container
    box.attach("mkdir -p /tmp/pkg/DEBIAN /var/cache/pvs-test && printf '%s\\n' "
               "'Package: pvs-test-keyring' 'Version: 1.0-1' 'Architecture: all' "
               "'Maintainer: pve-sglang tests <tests@invalid>' 'Description: test package' "
               "> /tmp/pkg/DEBIAN/control && dpkg-deb --build /tmp/pkg " + DEB)
    box.attach("cat > /usr/local/sbin/dpkg && chmod 755 /usr/local/sbin/dpkg", input=FLAKY_DPKG.encode())
    try:
        assert run_deb_file(box) == (False, False)  # the stand-in failed it: nothing installed
        assert box.attach("dpkg -l pvs-test-keyring", check=False).returncode != 0
        assert run_deb_file(box) == (True, True)  # the file did not change; dpkg -l decides
        assert "1.0-1" in box.attach("dpkg-query -W pvs-test-keyring").stdout
        assert run_deb_file(box) == (True, False)  # converged
    finally:
        box.attach("rm -f /usr/local/sbin/dpkg /run/pvs-dpkg-failed; "
                   "dpkg --purge pvs-test-keyring >/dev/null 2>&1; rm -rf /tmp/pkg /var/cache/pvs-test",
                   check=False)
