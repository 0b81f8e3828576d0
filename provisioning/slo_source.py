"""Adapter from slo/ (the single source of truth for objectives) to what provisioning/ needs.

Imported lazily by ``__main__`` so the pure mapping in ``provisioning.objectives`` never depends on
slo/ being importable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from provisioning.config import ConfigError
from provisioning.objectives import missing_failure_classes


@dataclass(frozen=True)
class PlatformObjectives:
    env: str
    recovery: dict[str, Any]  # failure-class id -> slo.specs.RecoveryObjective
    rules: dict[str, Any]  # Prometheus rule file: {"groups": [...]}

    def __getitem__(self, failure_class: str) -> Any:
        return self.recovery[failure_class]


def load_objectives(env: str) -> PlatformObjectives:
    try:
        from slo.rules import generate_rules
        from slo.specs import SpecError, load_specs
    except ImportError as exc:
        raise ConfigError(f"slo/ is not importable ({exc}); the program reads objectives from it") from exc
    try:
        specs = load_specs(env=env)
    except SpecError as exc:
        raise ConfigError(f"slo specs for env {env!r} are invalid: {exc}") from exc
    recovery = dict(specs.recovery_objectives)
    missing = missing_failure_classes(recovery)
    if missing:
        raise ConfigError(f"slo specs for env {env!r} declare no objective for {missing}")
    return PlatformObjectives(env=env, recovery=recovery, rules=generate_rules(specs))
