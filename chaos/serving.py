"""Chaos Toolkit actions for model serving (docs/serving.md): a model version rolled out
through the environment's rollout controller ("Rollouts": the fault of the class
bad-model-rollout when the version is a bad one), and the replicas scaled at run time with
what a replica says of its model noted (environments/local/serving_scale.py).

A rollout returns once it ended (rolled back, done, or left holding its canary); how it ended
is data in the journal, never an exception: whether the platform did the right thing is for
the objectives to judge (slo/rollout_invariants.py), from the timeline's ``rollout_*`` notes
and the clients' inference ledger. ``expect`` is the experiment's declaration of what should
happen, noted on the timeline for those objectives.

Scaling is an operation, not a fault (not in ``FAULTS``): a scale-up is what a platform does
under load, the fault is whatever meets it (the model store cut off). The driver scales back
to the replicas `up` started on ``restore_all``. ``gameday validate`` checks every action's
arguments before anything starts (``argument_problems``).
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaos.context import ChaosError, Context
from controlplane.serving.catalog import VERSIONS
from controlplane.serving.rollout import Policy

__all__ = ["argument_problems", "rollout_version", "scale_serving", "watch_serving_replica"]

# The actions that inject a fault, as in chaos/actions.py (what `gameday run --dry-run` lists)
FAULTS = ("rollout_version",)

EXPECTATIONS = ("rollback", "done")

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None


def _policy(steps: Sequence[int], max_error_ratio: float, max_p99_ms: float) -> Policy:
    return Policy(steps=tuple(steps), max_error_ratio=max_error_ratio, max_p99_ms=max_p99_ms)


def rollout_version(version: str, expect: str = "rollback",
                    steps: Sequence[int] = (10, 50, 100), step_seconds: float = 4.0,
                    max_error_ratio: float = 0.02, max_p99_ms: float = 250.0,
                    configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Roll ``version`` out to the canary replica, its share stepped through ``steps``
    (percent) with ``step_seconds`` of analysis each; returns how it ended."""
    problems = _rollout_problems({"version": version, "expect": expect, "steps": list(steps),
                                  "step_seconds": step_seconds,
                                  "max_error_ratio": max_error_ratio, "max_p99_ms": max_p99_ms})
    if problems:
        raise ChaosError("rollout_version: " + "; ".join(f"{a}: {why}" for a, why in problems))
    ctx = Context.from_configuration(configuration)
    driver = ctx.driver
    if not hasattr(driver, "rollout"):
        raise ChaosError(f"the {driver.name} driver cannot roll a model version out (local "
                         "environment with `env up --serving` only)")
    try:
        return driver.rollout(version, _policy(steps, max_error_ratio, max_p99_ms),
                              step_seconds, expect)
    except ValueError as exc:
        raise ChaosError(f"rollout_version {version!r}: {exc}") from None


def _rollout_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    version = arguments.get("version")
    if version not in VERSIONS:
        known = ", ".join(VERSIONS)
        out.append(("version", f"{version!r} is no published model version (known: {known})"))
    expect = arguments.get("expect", "rollback")
    if expect not in EXPECTATIONS:
        out.append(("expect", f"{expect!r}: one of {', '.join(EXPECTATIONS)}"))
    seconds = arguments.get("step_seconds", 4.0)
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
        out.append(("step_seconds", f"{seconds!r}: a number of seconds above 0"))
    steps = arguments.get("steps", (10, 50, 100))
    if not isinstance(steps, Sequence) or isinstance(steps, str) \
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        return [*out, ("steps", f"{steps!r}: a list of integer percents")]
    try:
        _policy(steps, float(arguments.get("max_error_ratio", 0.02)),
                float(arguments.get("max_p99_ms", 250.0)))
    except (TypeError, ValueError) as exc:
        out.append(("", str(exc)))
    return out


def argument_problems(func: str, arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(argument or "", reason) for every bad parameter of a call to ``func`` (what `gameday
    validate` and every run check before anything starts, chaos/validate.py)."""
    if func == "rollout_version":
        return _rollout_problems(arguments)
    return _scale_problems(func, arguments)


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


def _scale_problems(func: str, arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
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
