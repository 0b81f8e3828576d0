"""The verdict: everything the evaluator concluded, as written to verdict.json and read back
as a baseline. Plain data; reports render it, nothing recomputes from it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from slo.budget_gate import BudgetCheck
from slo.confidence import Classification
from slo.cost import CostSummary

SCHEMA = "gameday.verdict/v2"
# pass/warning/fail are scored; not_measured (the experiment did not run as designed) and
# no_data (a non-key SLI without events) are reported only (slo/scoring.py)
StatusName = Literal["pass", "warning", "fail", "not_measured", "no_data"]
# "error": expected evidence is missing, the verdict cannot be trusted (exit 3)
ResultName = Literal["pass", "warning", "fail", "error"]


class _M(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Demonstration(_M):
    """What an event-ratio SLI's events demonstrate about its target (slo/confidence.py):
    the one-sided Clopper-Pearson lower bound of the success ratio at `confidence`.
    "consistent" = met by the point estimate, not shown by the bound: scored as a pass, and
    every output says so next to it. `events_needed`: None when violated."""

    classification: Classification
    events: int
    failures: int
    confidence: float
    lower_bound: float
    events_needed: int | None = None
    text: str


class Check(_M):
    """One objective compared with one measurement (one JUnit test case)."""

    id: str
    experiment: str | None
    objective: str
    measured: float | None
    expected: str
    status: StatusName | None  # None only in verdicts written before v2
    weight: float
    key: bool
    message: str
    baseline: float | None = None
    # an event-ratio SLI's check: what its events demonstrate (None elsewhere and in verdicts
    # written before it)
    demonstration: Demonstration | None = None


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
    # event ratios only (Occurrences budgeting) with events: time slices of one timeline are not
    # independent trials. None there, without events, and in verdicts written before it
    demonstration: Demonstration | None = None
    # outcomes left to the experiments that declare this SLI, inside their impact windows
    # (slo/fault_impact.py): good/total above count the rest. 0 in verdicts written before it
    excused: int = 0
    excused_bad: int = 0
    excused_by: dict[str, int] = Field(default_factory=dict)


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
    # False: no sample with data between fault start and the horizon (no recovery to judge)
    has_data: bool = True
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
    # why the Prometheus evidence of the window is lost (slo/telemetry.py): then nothing is
    # known about the alert, and its check is "no data"
    no_data: str | None = None


class InvariantOutcome(_M):
    """One invariant judged over one experiment (slo/invariants.py)."""

    name: str
    judged: int
    violations: list[str] = Field(default_factory=list)
    no_data: str | None = None  # why nothing was judged (the check then fails)
    measured: str | None = None  # what the invariant measured, when it has a figure


class ExperimentResult(_M):
    """One expected experiment. Everything measured is None unless `measured`: an experiment
    whose journal is missing, whose steady state was broken before the method or that recorded
    no fault has no fault window, so no number about it would be true."""

    name: str
    measured: bool = True
    not_measured_reason: str | None = None
    journal_present: bool = True
    runner_status: str | None = None  # run.json experiment_status, when the runner wrote it
    runner_detail: str | None = None
    title: str | None = None
    failure_class: str | None = None
    runbook: str | None = None
    journal_status: str | None = None
    deviated: bool = False
    steady_state_before_met: bool | None = None
    experiment_ok: bool = False
    blast_radius: Any = None
    start: float | None = None
    end: float | None = None
    fault_name: str | None = None
    fault_start: float | None = None
    fault_end: float | None = None
    fault_source: str | None = None
    rto_seconds: float | None = None
    expected_alerts: list[str] = Field(default_factory=list)
    detection_seconds: float | None = None
    detected_by: str | None = None
    recovery_seconds: float | None = None
    # recovery SLIs without any data in the experiment window (left out of the recovery)
    recovery_no_data: list[str] = Field(default_factory=list)
    # "slis": recovery_seconds counts from the fault's start until every recovery SLI was
    # back; "goodput": from the fault's end until goodput was (slo/specs/model.py)
    recovered_by: str = "slis"
    requests: int | None = None
    failed_requests: int | None = None
    slow_requests: int | None = None
    automation: dict[str, int] = Field(default_factory=dict)
    manual_decisions: list[str] = Field(default_factory=list)
    acknowledged_lost: int | None = None
    acknowledged_duplicated: int | None = None
    # acknowledged under an id the store does not have, found by key: answered under a new id
    acknowledged_matched_by_key_only: int | None = None
    checkpoint_steps_recomputed: float | None = None
    checkpoint_intervals_lost: float | None = None
    torn_checkpoints_used: int | None = None
    artifacts_missing: int | None = None
    time_to_accepted_result_seconds: float | None = None
    accepted_result_basis: str | None = None
    # pipelines created in the window: pipeline id -> phase -> seconds from submission to that
    # phase's usable result (None: the phase produced none); None: no pipeline evidence
    # (reported, no objective; slo/pipelines.py usable_result_seconds)
    pipeline_usable_result_seconds: dict[str, dict[str, float | None]] | None = None
    slis: list[SliWindow] = Field(default_factory=list)
    alerts: list[AlertResult] = Field(default_factory=list)
    # why the experiment's Prometheus evidence is lost (slo/telemetry.py); its
    # Prometheus-dependent objectives are then "no data"
    telemetry_lost: str | None = None
    invariants: list[InvariantOutcome] = Field(default_factory=list)
    # the load around the fault (slo/load_timeline.py): [t, offered/s, goodput/s, p99 ms]
    # buckets, goodput before / during the fault, and seconds after the fault ended until
    # goodput was back to 95 % of before (None: never, within the evidence)
    load: list[tuple[float, float, float, float | None]] = Field(default_factory=list)
    goodput_before: float | None = None
    goodput_during: float | None = None
    goodput_recovery_seconds: float | None = None
    # every invariant the experiment is judged by (objective's + the experiment's own)
    invariant_names: list[str] = Field(default_factory=list)
    failed_activities: list[str] = Field(default_factory=list)  # method activities that raised
    findings: list[str] = Field(default_factory=list)


BaselineResult = Literal["better", "same", "regressed", "no baseline", "not measured"]


class ObjectiveComparison(_M):
    """One objective of this run next to the same objective in the baseline run
    (slo/baseline.py). `current`/`baseline` are None when there is nothing to compare."""

    id: str
    experiment: str | None
    objective: str
    kind: str  # duration / ratio / count / outcome: what "worse" means (slo/baseline.py)
    baseline: float | None
    current: float | None
    change: str
    result: BaselineResult
    # the objective's status in each run (what an outcome objective compares)
    baseline_status: str | None = None
    current_status: str | None = None


class BaselineComparison(_M):
    """The run compared with the last passing archived run of the same suite and environment.
    `run_id` is None when there was none; every objective then says "no baseline"."""

    archive: str
    run_id: str | None  # the newest baseline run
    # every baseline run, newest first: each objective is compared with the worst of them
    # (slo/baseline.py worst_of). [run_id] in verdicts written before it
    run_ids: list[str] = Field(default_factory=list)
    started_at: float | None = None
    note: str
    tolerance_percent: float
    tolerance_points: float
    tolerance_seconds: float = 0.0  # 0 in verdicts written before it
    objectives: list[ObjectiveComparison] = Field(default_factory=list)

    def ids(self, result: BaselineResult) -> list[str]:
        return [o.id for o in self.objectives if o.result == result]


class Verdict(_M):
    schema_: str = Field(default=SCHEMA, alias="schema")
    run_id: str
    env: str
    suite: str
    platform: str
    started_at: float
    ended_at: float
    result: ResultName
    score: float | None
    # checks the score is taken over (pass, warning, fail); the rest are reported only
    scored_checks: int = 0
    key_failed: bool
    exit_code: int
    reason: str
    slis: list[SliSummary]
    experiments: list[ExperimentResult]
    checks: list[Check]
    findings: list[str]
    baseline_runs: list[str] = Field(default_factory=list)
    not_applicable: dict[str, str] = Field(default_factory=dict)
    # events agents report they dropped before delivery (slo/dropped.py); None in old verdicts
    evidence_dropped: int | None = None
    evidence_dropped_by_agent: dict[str, int] = Field(default_factory=dict)
    # the last passing archived run of the same suite and env (`gameday gate`, `--baseline-from`)
    baseline: BaselineComparison | None = None
    # the budget check before the run (`--budget-check`; budget-check.json), forced or not
    budget_check: BudgetCheck | None = None
    # cost of the run's attempts at declared prices (slo/cost.py, docs/cost.md); never affects
    # the gate. None in old verdicts, or when it could not be computed (cost_error says why)
    cost: CostSummary | None = None
    cost_error: str | None = None

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _from_v1(cls, data: Any) -> Any:
        """v1 verdicts could say "pass" above a non-zero exit code and had no scored count;
        read back (baselines, re-rendered reports), they say what their exit code meant."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        code = data.get("exit_code")
        if isinstance(code, int) and code != 0 and data.get("result") in ("pass", "warning"):
            data["result"] = "error" if code == 3 else "fail"
        if "scored_checks" not in data:
            data["scored_checks"] = sum(
                1 for c in data.get("checks") or []
                if isinstance(c, dict) and c.get("status") in ("pass", "warning", "fail"))
        return data

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True)
