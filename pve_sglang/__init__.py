"""pve-sglang: a Proxmox VE or plain LXC host with NVIDIA GPUs to a tuned SGLang server.

Top level: ``project`` (the checkout's own files), ``hosts_file`` (the hosts file as
inventory), ``preflight`` (the host checks before any change), ``pve_releases`` (what differs
per Proxmox release). Packages: ``config``, ``stack``, ``model_store``, ``gpu``,
``container_config``, ``server``, ``tuning``, ``gateway``, ``monitoring``, ``runtime``, ``facts``,
``operations``, ``connectors``, ``remote``; each ``__init__`` names its modules. The README's
layout is the map.
"""
