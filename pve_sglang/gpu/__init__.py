"""The GPUs: which device nodes and cgroup rules pass them into a container (``passthrough``)
and what the host's P2P topology and measurements mean (``p2p``). Pure functions."""
