"""Monitoring: what Prometheus scrapes, chosen from the inventory (``targets``), and its
configuration, rules and key files rendered (``render``); the shipped rules in
``pve-sglang.rules.yml``."""
