"""The GPUs: which of the host's GPUs a container gets and which device nodes and cgroup rules
pass them into it (``passthrough``), and what the host's P2P topology and measurements mean
(``p2p``). Pure functions."""
