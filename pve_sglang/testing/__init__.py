"""
Tooling for the tests and the benchmark, not used by the deploy: ``lxc_env``, a real LXC
environment on this machine (cached Debian rootfs, containers booted with systemd).

Here rather than under ``tests/`` so that ``tests/`` and ``bench/`` import it as a package
(``from pve_sglang.testing import lxc_env``) with no ``sys.path`` changes; nothing in
``pve_sglang`` imports it, and it needs only the standard library.
"""
