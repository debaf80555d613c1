"""pyinfra operations of the deploy, one tool or topic per module, each documented with its
arguments (``+ arg:``) and an example.

On a host: ``pct`` (Proxmox containers, templates), ``lxc`` (plain LXC containers, the
network guard, cgroup limits), ``owned`` (the config lines the deploy owns), ``boot`` (the
initramfs), ``wheels`` (the wheel store's wheels), ``wheel_store`` (the store's retention),
``layer`` (the shared stack layer). In a container: ``debs`` (Debian packages),
``nvidia_driver`` (the user-space driver), ``venv`` (uv, the sglang venv, its packages, the
autotune patch, the server's flags), ``systemd_unit`` (the server's unit running),
``stack_switch`` (the failed-set check, the switch of stacks, retention, the rollback),
``paths`` (files and folders the steps manage), ``verify`` (the verify phase's checks). In a
gateway's container: ``gateway`` (smg as locked, its worker list, the workers' health). Behind a
gateway: ``roll`` (a replica's restart in its turn: out of the rotation, drained, judged, back).

What they share: ``container_reads`` and ``host_reads`` (what a run reads, folded into one
command per stage, and what forgets it), ``changes`` (whether earlier operations changed
something), ``phase`` (phase boundaries across hosts).

The model store's operations live with the model store (``pve_sglang/model_store/``).
"""
