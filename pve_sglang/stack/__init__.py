"""The locked software stack, made on the machine running pyinfra: the lock per release set
(``lock``, with uv) and the wheels fetched into a host's wheel store (``wheel_fetch``)."""
