"""pve-sglang's fleet status: ``pyinfra inventory.py status.py`` (``make status``), read-only.

One row per GPU container and gateway (``tasks/status.py``): its host, state, serving release
and stack, model and commit, unit state and since when, /health, running and queued requests
and token usage from /metrics, the last benchmark, an upgrade on probation or a rollback seen, a
restart pending, the tuned file's date. ``STATUS_JSON=1`` (``make status JSON=1``) prints JSON.
Nothing is changed, uploaded or restarted: one command per container.
"""

from tasks.status import status_phase

status_phase()
