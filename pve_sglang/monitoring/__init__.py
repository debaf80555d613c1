"""Monitoring: Prometheus's scrape targets from the inventory, its configuration and rules."""
