"""pyinfra facts of the deploy, one topic per module, each a class with ``command``/``process``.

- ``nvidia``: the NVIDIA driver and GPUs of a host, their topology and P2P;
- ``pve``: Proxmox VE and its containers (``pct``, ``pveam``, the pve-container version);
- ``system``: the machine itself (virtualisation, IOMMU and ACS, the cgroup hierarchy);
- ``lxc_host``: a plain LXC host (cgroup limits, subordinate ids, bridges, a container's
  cgroup values) and ``HostPart``, the parts of its one read;
- ``container``: inside a GPU container (user-space driver, the venv, uv, paths, the unit);
- ``installed_stacks``: the stacks installed side by side in a container and their record;
- ``one_read``: several facts' commands run in one command (``ContainerState``), and
  ``Part``, the parts of a container's one read;
- ``wheel_store``: a host's wheel store, for its retention;
- ``gateway``: a gateway's container (the smg venv's packages, its worker list);
- ``verify``: the verify phase's read-only checks (GPUs, CUDA, health, startup, benchmark);
- ``status``: ``make status``'s one read of a container (``ContainerStatus``).

The model store's facts live with the model store (``pve_sglang/model_store/facts.py``).
"""
