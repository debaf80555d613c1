"""How the deploy runs inside pyinfra: the per-run fact cache (``cache``), the error that stops
a run before any change (``errors``), the speed patch of pyinfra's per-operation work
(``pyinfra_per_op``), and every use of a pyinfra name that is not its public API, checked
against the pinned pyinfra (``pyinfra_private``)."""
