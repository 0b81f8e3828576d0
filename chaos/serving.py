"""Chaos Toolkit actions for model serving: a model version rolled out through the
environment's rollout controller (docs/serving.md, "Rollouts"), the fault of the class
bad-model-rollout when the version is a bad one.

The action returns once the rollout ended (rolled back, done, or left holding its canary); how
it ended is data in the journal, never an exception: whether the platform did the right thing
is for the objectives to judge (slo/rollout_invariants.py), from the timeline's ``rollout_*``
notes and the clients' inference ledger. ``expect`` is the experiment's declaration of what
should happen, noted on the timeline for those objectives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaos.context import ChaosError, Context
from controlplane.serving.catalog import VERSIONS
from controlplane.serving.rollout import Policy

__all__ = ["argument_problems", "rollout_version"]

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
    return _rollout_problems(arguments) if func == "rollout_version" else []
