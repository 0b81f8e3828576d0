"""The verdict: everything the evaluator concluded, as written to verdict.json and read back
as a baseline. Plain data; reports render it, nothing recomputes from it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "gameday.verdict/v1"
StatusName = Literal["pass", "warning", "fail"]


class _M(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Check(_M):
    """One objective compared with one measurement (one JUnit test case)."""

    id: str
    experiment: str | None
    objective: str
    measured: float | None
    expected: str
    status: StatusName | None
    weight: float
    key: bool
    message: str
    baseline: float | None = None


class SliSummary(_M):
    name: str
    display_name: str
    kind: str
    budgeting: str
    target: float
    op: str | None = None
    threshold: float | None = None
    window_seconds: float
    duration_seconds: float
    good: int
    total: int
    value: float | None
    burn_rate: float | None
    budget_consumed: float | None
    objective_met: bool | None
    key: bool
    details: dict[str, Any] = Field(default_factory=dict)


class SliWindow(_M):
    name: str
    display_name: str
    target: float
    good: int
    total: int
    value: float | None
    burn_rate: float | None
    budget_consumed: float | None
    breached_at: float | None
    recovery_seconds: float | None
    series: list[tuple[float, float | None]]


class AlertResult(_M):
    name: str
    fired: bool
    fired_at: float | None
    fired_after_seconds: float | None
    # False when the SLO the alert guards stayed within its objective during the fault: a
    # burn-rate alert must not page then, so silence is correct (not a detection gap)
    required: bool = True
    note: str | None = None


class ExperimentResult(_M):
    name: str
    title: str
    failure_class: str
    runbook: str
    journal_status: str
    deviated: bool
    steady_state_before_met: bool | None
    experiment_ok: bool
    blast_radius: Any = None
    start: float
    end: float
    fault_name: str | None
    fault_start: float
    fault_end: float
    fault_source: str
    rto_seconds: float
    detection_seconds: float | None
    detected_by: str | None
    recovery_seconds: float | None
    requests: int
    failed_requests: int
    slow_requests: int
    automation: dict[str, int]
    manual_decisions: list[str]
    acknowledged_lost: int
    acknowledged_duplicated: int
    checkpoint_steps_recomputed: float
    checkpoint_intervals_lost: float | None
    torn_checkpoints_used: int
    artifacts_missing: int
    time_to_accepted_result_seconds: float | None
    accepted_result_basis: str
    slis: list[SliWindow]
    alerts: list[AlertResult]
    findings: list[str]


class Verdict(_M):
    schema_: str = Field(default=SCHEMA, alias="schema")
    run_id: str
    env: str
    suite: str
    platform: str
    started_at: float
    ended_at: float
    result: StatusName
    score: float | None
    key_failed: bool
    exit_code: int
    reason: str
    slis: list[SliSummary]
    experiments: list[ExperimentResult]
    checks: list[Check]
    findings: list[str]
    baseline_runs: list[str] = Field(default_factory=list)
    not_applicable: dict[str, str] = Field(default_factory=dict)

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True)
