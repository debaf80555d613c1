"""The software stack a container runs, and its rules (pure but for uv and the index):

- ``releases``: what each sglang release set needs (its pins, CUDA, Python);
- ``platform``: the Debian release and Python a set is built for;
- ``lock``: the lock per release set, made with uv on the machine running pyinfra;
- ``identity``: which stack a container's settings name (its lock, id and folder);
- ``switch_rules``: stacks side by side in a container: the switch, the rollback's verdict,
  retention (the decisions; ``operations/stack_switch.py`` runs them);
- ``wheel_fetch``: the locked wheels fetched for a host's wheel store;
- ``store_retention``: the wheel store's layout and which of its locks may go;
- ``cuda_driver``: a set's CUDA against the host's NVIDIA driver.
"""
