"""SLO and recovery-objective specs (package data under this directory) and their loader.

from slo.specs import load_specs
specs = load_specs(env="prod")
specs.recovery_objectives["db-primary-loss"].rto_seconds
"""

from __future__ import annotations

from slo.specs.loader import KNOWN_SLIS, SPEC_DIR, SpecError, load_specs
from slo.specs.model import (
    ENVIRONMENTS,
    FAILURE_CLASSES,
    AlertCondition,
    AlertPolicy,
    Budgeting,
    EvaluationSettings,
    GateSettings,
    Indicator,
    IndicatorKind,
    Objective,
    RecoveryObjective,
    Rpo,
    RuleSettings,
    Slo,
    Specs,
)

__all__ = [
    "ENVIRONMENTS",
    "FAILURE_CLASSES",
    "KNOWN_SLIS",
    "SPEC_DIR",
    "AlertCondition",
    "AlertPolicy",
    "Budgeting",
    "EvaluationSettings",
    "GateSettings",
    "Indicator",
    "IndicatorKind",
    "Objective",
    "RecoveryObjective",
    "Rpo",
    "RuleSettings",
    "Slo",
    "SpecError",
    "Specs",
    "load_specs",
]
