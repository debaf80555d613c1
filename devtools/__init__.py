"""
Tooling for the tests and the benchmarks, not used by the deploy and not installed with the
package: ``lxc_env`` (a real LXC environment on this machine: cached Debian rootfs, containers
booted with systemd), ``wheel_store_site`` (a local wheel index), ``deploy_cost`` (the no-op
benchmark, run by ``bench/deploy_cost.py``) and ``deploys/`` (small deploy files they run).

At the checkout's root beside ``pve_sglang/``, so that ``tests/`` and ``bench/`` import it as
``from devtools import lxc_env`` (``python -m pytest`` and the bench scripts put the root on
``sys.path``); nothing in ``pve_sglang`` imports it.
"""
