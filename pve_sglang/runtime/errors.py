"""The error that stops a run at prepare time, before any host is changed.

Here, below everything that raises it (the host checks, a stack's lock lookup, the model
store's preflight), so that each of them can import it downwards.
"""

from __future__ import annotations

from pyinfra.api.exceptions import DeployError


class PreflightError(DeployError):
    """A host cannot take the deploy as it is; nothing has been changed."""
