"""Chaos Toolkit actions for model serving's capacity: scale the replicas at run time, and
note what a replica says of its model (environments/local/serving_scale.py; docs/serving.md).

Scaling is an operation, not a fault (``FAULTS`` is empty): a scale-up is what a platform
does under load, the fault is whatever meets it (the model store cut off). The driver scales
back to the replicas `up` started on ``restore_all``. ``gameday validate`` checks the
arguments before anything starts (``argument_problems``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.context import ChaosError, Context

FAULTS: tuple[str, ...] = ()

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None

# what a model server says of its model (controlplane/serving/server.py, env status)
MODEL_STATES = ("starting", "loading", "ready", "unready", "stopped")


def _scaler(configuration: Configuration) -> Any:
    driver = Context.from_configuration(configuration).driver
    if not hasattr(driver, "scale_serving"):
        raise ChaosError(f"the {driver.name} driver cannot scale model serving (local "
                         "environment only)")
    return driver


def scale_serving(replicas: int, configuration: Configuration = None,
                  secrets: Secrets = None) -> dict:
    """Run ``replicas`` model-server replicas; a new one is started and enabled behind its
    readiness check, without waiting for its model."""
    return _scaler(configuration).scale_serving(replicas)


def watch_serving_replica(replica: str, states: list[str], timeout: float = 30.0,
                          configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Wait until ``replica`` says its model is in one of ``states`` (at most ``timeout`` s)
    and note what it said, and HAProxy's view of it, on the timeline either way."""
    return _scaler(configuration).watch_serving_replica(replica, states, timeout)


def argument_problems(func: str, arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(argument, reason) for every bad value of a call to ``func``."""
    problems: list[tuple[str, str]] = []
    if func == "scale_serving":
        n = arguments.get("replicas")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            problems.append(("replicas", f"{n!r} is not a positive whole number"))
    if func == "watch_serving_replica":
        states = arguments.get("states")
        if not isinstance(states, list) or not states:
            problems.append(("states", f"{states!r} is not a non-empty list of model states"))
        else:
            problems += [("states", f"{s!r} is not a model state ({', '.join(MODEL_STATES)})")
                         for s in states if s not in MODEL_STATES]
        timeout = arguments.get("timeout", 30.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            problems.append(("timeout", f"{timeout!r} is not a positive number of seconds"))
    return problems
