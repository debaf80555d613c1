"""How the deploy runs inside pyinfra: the per-run fact cache (``cache``) and the speed patch
of pyinfra's per-operation work (``pyinfra_per_op``)."""
