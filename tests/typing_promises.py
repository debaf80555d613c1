"""What the annotations promise, checked by mypy (``make lint``), not run by pytest: each line
fails the lint where a signature stops promising it (issue 50: ``host_settings`` returned Any,
so nothing it gave was checked; ``Step`` promised a list that its steps do not return)."""

from __future__ import annotations

from typing_extensions import assert_type

from pve_sglang.config.gateway import GatewaySettings
from pve_sglang.config.settings import ContainerSettings, HostSettings, host_settings
from tasks.container import Step


def settings_are_the_model_asked_for() -> None:
    assert_type(host_settings(ContainerSettings), ContainerSettings)
    assert_type(host_settings(HostSettings), HostSettings)
    assert_type(host_settings(GatewaySettings, of=None), GatewaySettings)


def restarts_nothing(_: list) -> None:
    """A step that calls no operation a restart follows: the runner takes None as []."""


def restarts_on(earlier: list) -> list:
    return earlier


STEPS: list[Step] = [("a step with nothing to restart", restarts_nothing),
                     ("a step that gives its operations", restarts_on)]
