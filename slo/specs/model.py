"""Typed, validated view of the spec files (what the rest of slo/ and provisioning/ consume).

Field names are snake_case Python; the YAML documents use camelCase (OpenSLO for SLOs,
``gameday/v1`` for our own kinds). Conversion and error reporting live in loader.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FAILURE_CLASSES: tuple[str, ...] = (
    "api-replica-loss",
    "db-primary-loss",
    "artifact-store-unavailable",
    "node-pool-exhausted",
    "registry-failure",
    "node-interruption-checkpoint",
    "agent-connectivity-loss",
    "ineligible-fallback-region",
    "telemetry-loss",
    "clock-skew",
    "credential-rotation",
    "zone-outage",
    "upgrade",
    "pipeline-recovery",
    "network-gray",
    "artifact-store-brownout",
    "db-slow-disk",
    "db-disk-full",
    "overload-metastability",
    "checkpoint-power-loss",
    "data-source-unavailable",
    "tracking-outage",
    "serving-replica-loss",
    "bad-model-rollout",
    "model-store-unavailable",
)

ENVIRONMENTS: tuple[str, ...] = ("local", "dev", "staging", "prod")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class IndicatorKind(str, Enum):
    RATIO = "ratio"
    THRESHOLD = "threshold"


class Budgeting(str, Enum):
    OCCURRENCES = "Occurrences"
    TIMESLICES = "Timeslices"


class PromSource(_Frozen):
    """How the generated rules compute the SLI's error ratio in Prometheus.

    ratio: ``bad``/``total`` queries (``${window}`` is substituted);
    threshold: ``query`` is a gauge compared with the objective value per time slice, or,
    with ``histogram: true``, the name of a histogram whose ``le`` bucket is the threshold.
    """

    bad: str | None = None
    total: str | None = None
    query: str | None = None
    histogram: bool = False
    # threshold alternative: a query already returning 1 (good slice) or 0 (bad slice)
    good_query: str | None = None


class Indicator(_Frozen):
    name: str
    display_name: str
    description: str
    kind: IndicatorKind
    # None: the SLI is audited offline from evidence only (no recording rules/alerts)
    prometheus: PromSource | None


class Objective(_Frozen):
    display_name: str
    target: float = Field(gt=0, lt=1)
    # threshold SLIs only: good when `measured <op> value` (seconds)
    op: Literal["lt", "lte", "gt", "gte"] | None = None
    value: float | None = None
    time_slice_target: float | None = Field(default=None, gt=0, le=1)
    time_slice_window_seconds: float | None = Field(default=None, gt=0)


class AlertCondition(_Frozen):
    """One burn-rate window pair (multi-window multi-burn-rate, SRE workbook ch. 5)."""

    name: str
    severity: Literal["page", "ticket"]
    burn_rate: float = Field(gt=0)
    long_window_seconds: float = Field(gt=0)
    short_window_seconds: float = Field(gt=0)


class AlertPolicy(_Frozen):
    name: str
    description: str
    conditions: tuple[AlertCondition, ...]


class Slo(_Frozen):
    name: str
    display_name: str
    description: str
    service: str
    indicator: Indicator
    window_seconds: float = Field(gt=0)
    rolling: bool = True
    budgeting: Budgeting
    objective: Objective
    alert_policies: tuple[AlertPolicy, ...] = ()
    source: str = ""

    @property
    def error_budget(self) -> float:
        return 1.0 - self.objective.target

    @property
    def alert_name(self) -> str:
        """Name of the generated burn-rate alert (one name, severity label page|ticket)."""
        return "".join(p.capitalize() for p in self.name.split("-")) + "BurnRate"

    @property
    def alert_runbook(self) -> str:
        return f"alert-{self.name}-burn"


class Rpo(_Frozen):
    acknowledged_submissions: int = Field(ge=0)
    checkpoint_progress_intervals: float = Field(ge=0)
    artifacts: int = Field(ge=0)
    # restore-from-backup data window (db-primary-loss); drives PITR/backup settings
    restore_point_seconds: float | None = Field(default=None, ge=0)


class RecoveryObjective(_Frozen):
    name: str
    failure_class: str
    display_name: str
    description: str
    rto_seconds: float = Field(gt=0)
    rpo: Rpo
    expected_alerts: list[str] = Field(default_factory=list)
    runbook: str
    slos: list[str] = Field(default_factory=list)
    # per-experiment key checks judged on evidence records (names: slo/invariants.py)
    invariants: list[str] = Field(default_factory=list)
    backup_retention_days: int | None = Field(default=None, ge=1)
    scope: Literal["zone", "region"] | None = None
    # what the RTO is measured on: "slis", every recovery SLI back within its objective, from
    # the fault's start; "goodput", acknowledged submissions per second back to 95 % of their
    # level before the fault, from the fault's end (a class whose load sheds by design: an
    # overload trigger, where explicit refusals are the API working, not failing)
    recovered_by: Literal["slis", "goodput"] = "slis"
    source: str = ""

    @property
    def restore_point_seconds(self) -> float | None:
        return self.rpo.restore_point_seconds

    def judged_slos(self, own: Sequence[str]) -> list[str]:
        """The SLOs an experiment of this failure class is judged against: the experiment's
        own, then this objective's, each once (evaluation, settling and the budget gate)."""
        return list(dict.fromkeys([*own, *self.slos]))


class EvaluationSettings(_Frozen):
    """How the offline evaluator samples evidence (env-specific: local runs are minutes)."""

    sample_interval_seconds: float = Field(default=5.0, gt=0)
    sample_window_seconds: float = Field(default=30.0, gt=0)
    recovery_hold_samples: int = Field(default=3, ge=1)
    slow_request_seconds: float = Field(default=1.0, gt=0)
    # an expected alert may fire this long after the experiment ends and still count
    alert_grace_seconds: float = Field(default=60.0, ge=0)
    # length of one time slice for Timeslices budgeting when the objective names none
    time_slice_seconds: float = Field(default=60.0, gt=0)
    # how long a load balancer may take to notice a replica that cannot serve (health checks):
    # after it, the served-after-detection invariant wants no failed request while the fault lasts
    detection_grace_seconds: float = Field(default=10.0, ge=0)


class RuleSettings(_Frozen):
    """Rule generation per env: burn-rate windows scale with the SLO window, but never
    below what the scrape interval can support (a 2s rate() window has no samples)."""

    min_window_seconds: float = Field(default=300.0, gt=0)
    evaluation_interval_seconds: float = Field(default=30.0, gt=0)
    # what exports the API's request outcomes there (slo/metrics.py API_REQUEST_SOURCES): no
    # default, a new environment says it
    api_requests: str


class GateSettings(_Frozen):
    """Keptn-style scoring: pass 1 / warning 0.5 / fail 0, weighted; key checks fail all."""

    pass_score: float = Field(default=90.0, ge=0, le=100)
    warning_score: float = Field(default=75.0, ge=0, le=100)
    key_slis: tuple[str, ...] = ()
    # alerts whose objective is key (a silent required one, or one without Prometheus
    # evidence, fails the gate); the others are scored, or reported as no data
    key_alerts: tuple[str, ...] = ()
    weight_sli: float = Field(default=1.0, ge=0)
    weight_rto: float = Field(default=2.0, ge=0)
    weight_rpo: float = Field(default=3.0, ge=0)
    weight_alert: float = Field(default=1.0, ge=0)
    weight_invariant: float = Field(default=3.0, ge=0)
    # the experiment's own outcome (journal completed, not deviated); not key: exit 1, not 2
    weight_experiment: float = Field(default=1.0, ge=0)
    # relative criteria vs the last N passing runs: durations may grow by this much
    relative_tolerance_percent: float = Field(default=20.0, ge=0)
    # vs the last passing archived run (slo/baseline.py): ratio SLIs may drop this many
    # percentage points; durations use relative_tolerance_percent
    baseline_tolerance_points: float = Field(default=0.1, ge=0)
    # ... and durations may also grow by this many seconds, whichever is more (slo/baseline.py):
    # set it from the spread of repeated healthy runs of the environment
    baseline_tolerance_seconds: float = Field(default=0.0, ge=0)
    # how many of the last passing archived runs make the baseline: each objective is compared
    # with the worst of them, so one run that happened to be fast is not the bar
    baseline_runs: int = Field(default=5, ge=1)
    # budget-aware scheduling (slo/budget_gate.py): a game day with --budget-check skips when
    # an SLO it touches has less than this share of its window's error budget left
    min_remaining_budget: float = Field(default=0.25, ge=0, le=1)


class Specs(_Frozen):
    env: str
    slos: list[Slo]
    recovery_objectives: dict[str, RecoveryObjective]
    alert_policies: dict[str, AlertPolicy]
    evaluation: EvaluationSettings
    gate: GateSettings
    rules: RuleSettings

    def slo(self, name: str) -> Slo:
        for slo in self.slos:
            if slo.name == name:
                return slo
        raise KeyError(name)

    @property
    def slo_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slos)

    @property
    def alert_names(self) -> tuple[str, ...]:
        return tuple(s.alert_name for s in self.slos if s.alert_policies and s.indicator.prometheus)
