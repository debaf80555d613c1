"""The container's LXC configuration: the raw lines the deploy owns (``owned_lines``) and the
user's own ``lxc_config`` keys and limits, checked and rendered (``lxc_keys``). Pure functions."""
