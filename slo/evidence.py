"""Load and validate a run directory's raw evidence (layout and schemas: docs/EVIDENCE.md).

Everything is checked up front; a missing or unusable file raises ``EvidenceError`` (the CLI
maps it to exit code 3) with the file, line and field at fault. The loaded records are plain
typed data with no platform specifics, so SLI math (sli.py) works for any adapter.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from slo import inference_ledger
from slo import ledger as ledger_file
from slo.inference_ledger import InferenceLedgerError, InferenceRecord
from slo.ledger import LedgerEntry


class EvidenceError(Exception):
    """Evidence is missing or unusable; the verdict cannot be trusted (exit code 3)."""


def _as_utc(value: datetime) -> datetime:
    # Chaos Toolkit journals carry naive UTC timestamps; treat every naive time as UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


UtcTime = Annotated[datetime, AfterValidator(_as_utc)]


class _Record(BaseModel):
    # producers may add fields (other platforms, newer versions); we read what we need
    model_config = ConfigDict(extra="ignore", frozen=True)


class RunnerStatus(_Record):
    """What the runner saw of one experiment (run.json `experiment_status`)."""

    status: str
    seconds: float | None = None
    detail: str | None = None


class RunInfo(_Record):
    run_id: str
    env: str
    suite: str
    platform: str
    started_at: UtcTime
    ended_at: UtcTime
    snapshot_at: UtcTime | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    # experiments of the suite that do not apply to this platform, with the reason
    not_applicable: dict[str, str] = Field(default_factory=dict)
    # the suite's experiments in run order; None (older run dirs): the journals present are
    # the expected set
    experiments: tuple[str, ...] | None = None
    experiment_status: dict[str, RunnerStatus] = Field(default_factory=dict)

    @property
    def expected_experiments(self) -> tuple[str, ...] | None:
        """Experiments that must have evidence: the suite minus those not applicable."""
        if self.experiments is None:
            return None
        return tuple(n for n in dict.fromkeys(self.experiments) if n not in self.not_applicable)


class RequestRecord(_Record):
    time: UtcTime
    method: str
    route: str
    status: int | None = None
    error: str | None = None
    latency_ms: float = Field(ge=0)


class AcceleratorRequest(_Record):
    type: str | None = None
    count: int = Field(default=0, ge=0)


class ResourceRequest(_Record):
    cpu: float | None = None
    accelerator: AcceleratorRequest | None = None


class PlacementRequest(_Record):
    regions: tuple[str, ...] | None = None
    dataset: str | None = None


class Operation(_Record):
    id: str
    project: str
    state: str
    idempotency_key: str | None = None
    created_at: UtcTime
    updated_at: UtcTime | None = None
    queue: str | None = None
    workload: dict[str, Any] | None = None
    pending_reason: str | None = None
    # hard constraints and retry policy, read by the invariants (slo/invariants.py)
    max_retries: int | None = Field(default=None, ge=0)
    placement: PlacementRequest | None = None
    resources: ResourceRequest | None = None

    @property
    def checkpoint_every(self) -> float | None:
        params = (self.workload or {}).get("params") or {}
        value = params.get("checkpoint_every")
        return float(value) if isinstance(value, (int, float)) and value > 0 else None


class Attempt(_Record):
    id: str
    operation_id: str
    number: int
    state: str
    agent_name: str | None = None
    created_at: UtcTime
    started_at: UtcTime | None = None
    finished_at: UtcTime | None = None
    error: dict[str, Any] | None = None
    # what the platform tells the user about a succeeded attempt (artifacts-complete reads
    # its `files`: the result must name every file of the completion manifest)
    result: dict[str, Any] | None = None


class AgentRecord(_Record):
    """One agent (worker) of the platform: snapshot/agents.jsonl."""

    name: str
    pool: str | None = None
    zone: str | None = None
    region: str | None = None
    datasets: tuple[str, ...] = ()
    accelerator_type: str | None = None
    accelerator_count: int = Field(default=0, ge=0)
    # None: older snapshots (slo/cost.py: allocation unknown / counted from the window's start)
    cpu_slots: int | None = Field(default=None, ge=0)
    registered_at: UtcTime | None = None


class AgentHeardAgain(_Record):
    """An agent heard from after a silence longer than its liveness timeout:
    snapshot/agent_liveness.jsonl. The platform knew it dead from ``silent_since +
    timeout_seconds`` until ``time`` (its first sign of life after the silence)."""

    agent: str
    time: UtcTime
    silent_since: UtcTime
    timeout_seconds: float = Field(gt=0)


class Event(_Record):
    id: str | int | None = None
    operation_id: str | None = None
    attempt_id: str | None = None
    time: UtcTime
    actor: str | None = None
    kind: str
    from_state: str | None = None
    to_state: str | None = None
    reason: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class StoredObject(_Record):
    key: str
    size: int = Field(ge=0)
    sha256: str | None = None
    etag: str | None = None
    # parsed JSON body, present for MANIFEST.json / COMPLETE.json objects
    content: dict[str, Any] | None = None


class FaultRecord(_Record):
    time: UtcTime
    event: Literal["fault_start", "fault_end", "note"]
    fault: str
    target: str = ""
    details: dict[str, Any] = Field(default_factory=dict)


class PromSeries(_Record):
    metric: dict[str, str]
    values: tuple[tuple[float, float], ...]


class PromQuery(_Record):
    name: str
    query: str
    series: tuple[PromSeries, ...]
    # the collector's record of a failed query (Prometheus down, HTTP error): no series then
    error: str | None = None
    # the query_range the collector asked for (epoch seconds), when the file records it
    start: float | None = None
    end: float | None = None
    step: float | None = None


class GamedayExtension(_Record):
    recovery_objective: str
    slos: tuple[str, ...] = ()
    expected_alerts: tuple[str, ...] = ()
    # invariants this rehearsal adds to its recovery objective's (slo/invariants.py)
    invariants: tuple[str, ...] = ()
    runbook: str
    blast_radius: str | dict[str, Any] | None = None


class Activity(_Record):
    name: str
    type: str
    status: str
    start: UtcTime | None = None
    end: UtcTime | None = None


class Journal(_Record):
    title: str
    status: str
    deviated: bool
    start: UtcTime
    end: UtcTime
    steady_state_before_met: bool | None
    steady_state_after_met: bool | None
    activities: tuple[Activity, ...]
    gameday: GamedayExtension

    @property
    def failed_activities(self) -> list[str]:
        """Method activities that raised. Chaos Toolkit records them and carries on (the
        journal still says "completed"), but an experiment whose fault or whose check of its
        own fault failed did not do what it was designed to."""
        return [a.name for a in self.activities if a.status != "succeeded"]

    @property
    def experiment_ok(self) -> bool:
        """Chaos Toolkit exits 0 when the steady state is broken *before* the method, so the
        before-check is ours to read (docs/DESIGN.md section 8.2); a failed method activity
        fails the experiment too."""
        return (
            self.status == "completed"
            and not self.deviated
            and self.steady_state_before_met is not False
            and not self.failed_activities
        )


class ExperimentEvidence(_Record):
    name: str
    journal: Journal


class PipelineRecord(_Record):
    """One pipeline (our control plane; Prefect: platforms/prefect_pipeline_records.py):
    snapshot/pipelines.jsonl."""

    id: str
    name: str
    state: str
    state_reason: str | None = None
    report: dict[str, Any] | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    created_at: UtcTime
    updated_at: UtcTime | None = None


class PipelineStepRecord(_Record):
    """One step of a pipeline: snapshot/pipeline_steps.jsonl."""

    pipeline_id: str
    name: str
    position: int = 0
    state: str
    state_reason: str | None = None
    operation_id: str | None = None
    cache_key: str | None = None
    inputs: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    report: dict[str, Any] | None = None
    started_at: UtcTime | None = None
    finished_at: UtcTime | None = None


class PipelineEvent(_Record):
    """One event of a pipeline (cache decisions, step transitions): snapshot/pipeline_events.jsonl."""

    id: int | str | None = None
    pipeline_id: str
    time: UtcTime
    actor: str | None = None
    kind: str
    reason: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class SideEffectRecord(_Record):
    """One recorded external action (a model registration): snapshot/side_effects.jsonl."""

    operation_id: str
    action_id: str
    kind: str
    payload: dict[str, Any] = Field(default_factory=dict)
    receipt: dict[str, Any] = Field(default_factory=dict)
    created_at: UtcTime


class TrackingRun(_Record):
    """One run the tracking server holds, read back through its REST API after the game day:
    snapshot/tracking_runs.jsonl (docs/EVIDENCE.md)."""

    run_id: str
    attempt_tag: str | None = None  # the `gameday.attempt_id` tag: `<operation_id>/attempt-<n>`
    status: str  # RUNNING | FINISHED | FAILED | KILLED | SCHEDULED
    start_time: UtcTime | None = None
    end_time: UtcTime | None = None
    # distinct (step, timestamp) points held per metric key
    metric_points: dict[str, int] = Field(default_factory=dict)
    params: int = 0
    artifacts: tuple[str, ...] = ()


class Evidence(_Record):
    run_dir: Path
    run: RunInfo
    ledger: tuple[LedgerEntry, ...]
    requests: tuple[RequestRecord, ...]
    load_stats: dict[str, Any] | list[Any]
    operations: tuple[Operation, ...]
    attempts: tuple[Attempt, ...]
    events: tuple[Event, ...]
    objects: tuple[StoredObject, ...]
    faults: tuple[FaultRecord, ...]
    prometheus: dict[str, PromQuery]
    # journals present, in directory order
    experiments: tuple[ExperimentEvidence, ...]
    # experiments that must have evidence, in run order (run.json `experiments` minus those
    # not applicable; older run dirs: every directory under experiments/)
    expected: tuple[str, ...] = ()
    # None: snapshot/agents.jsonl was not collected
    agents: tuple[AgentRecord, ...] | None = None
    # None: the file was not collected (another platform, an older snapshot): no data
    pipelines: tuple[PipelineRecord, ...] | None = None
    pipeline_steps: tuple[PipelineStepRecord, ...] | None = None
    pipeline_events: tuple[PipelineEvent, ...] | None = None
    side_effects: tuple[SideEffectRecord, ...] | None = None
    # None: snapshot/agent_liveness.jsonl was not collected (the routing invariant: no data)
    agent_liveness: tuple[AgentHeardAgain, ...] | None = None
    # None: no tracking server in the environment (snapshot/tracking_runs.jsonl not collected)
    tracking_runs: tuple[TrackingRun, ...] | None = None
    # the inference ledger (docs/serving.md); empty: the run sent no prediction request
    inference: tuple[InferenceRecord, ...] = ()

    @property
    def snapshot_time(self) -> datetime:
        return self.run.snapshot_at or self.run.ended_at


# --------------------------------------------------------------------------- reading

R = TypeVar("R", bound=BaseModel)


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _field_error(where: str, exc: ValidationError) -> EvidenceError:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "?"
    return EvidenceError(f"{where}: field {field}: {err['msg']}")


def _read_json(path: Path, root: Path) -> Any:
    if not path.is_file():
        raise EvidenceError(f"{_rel(path, root)}: missing (see docs/EVIDENCE.md)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"{_rel(path, root)}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise EvidenceError(f"{_rel(path, root)}: not valid JSON: {exc}") from None


def read_jsonl(path: Path, root: Path, model: type[R], *, required: bool = True) -> tuple[R, ...]:
    name = _rel(path, root)
    if not path.is_file():
        if required:
            raise EvidenceError(f"{name}: missing (see docs/EVIDENCE.md)")
        return ()
    out: list[R] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"{name}: cannot read: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvidenceError(f"{name}: line {number}: not valid JSON: {exc.msg}") from None
        if not isinstance(raw, dict):
            raise EvidenceError(f"{name}: line {number}: must be a JSON object")
        try:
            out.append(model.model_validate(raw))
        except ValidationError as exc:
            raise _field_error(f"{name}: line {number}", exc) from None
    return tuple(out)


def _read_ledger(root: Path) -> tuple[LedgerEntry, ...]:
    path = root / "ledger.jsonl"
    if not path.is_file():
        raise EvidenceError("ledger.jsonl: missing (see docs/EVIDENCE.md)")
    try:
        return tuple(ledger_file.read([path], names={path: "ledger.jsonl"}))
    except (OSError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"ledger.jsonl: cannot read: {exc}") from None
    except ledger_file.LedgerError as exc:
        raise EvidenceError(str(exc)) from None


def _find_extension(experiment: dict[str, Any]) -> Any:
    """The x-gameday block: a top-level key, or a Chaos Toolkit `extensions` entry."""
    if "x-gameday" in experiment:
        return experiment["x-gameday"]
    for ext in experiment.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") in ("x-gameday", "gameday"):
            return {k: v for k, v in ext.items() if k != "name"}
    return None


def _parse_journal(raw: Any, where: str) -> Journal:
    if not isinstance(raw, dict) or not isinstance(raw.get("experiment"), dict):
        raise EvidenceError(f"{where}: not a Chaos Toolkit journal (no 'experiment' object)")
    experiment = raw["experiment"]
    ext = _find_extension(experiment)
    if ext is None:
        raise EvidenceError(f"{where}: field experiment.x-gameday: missing (see docs/EVIDENCE.md)")
    steady = raw.get("steady_states") or {}

    def met(phase: str) -> bool | None:
        block = steady.get(phase) if isinstance(steady, dict) else None
        return block.get("steady_state_met") if isinstance(block, dict) else None

    activities = []
    for item in raw.get("run") or []:
        act = item.get("activity") or {} if isinstance(item, dict) else {}
        activities.append(
            {
                "name": act.get("name", "?"),
                "type": act.get("type", "?"),
                "status": item.get("status", "?"),
                "start": item.get("start"),
                "end": item.get("end"),
            }
        )
    data = {
        "title": experiment.get("title", "?"),
        "status": raw.get("status"),
        "deviated": raw.get("deviated", False),
        "start": raw.get("start"),
        "end": raw.get("end"),
        "steady_state_before_met": met("before"),
        "steady_state_after_met": met("after"),
        "activities": activities,
        "gameday": ext,
    }
    try:
        return Journal.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        if loc and loc[0] == "gameday":
            loc = ["experiment", "x-gameday", *loc[1:]]
        elif loc and loc[0] == "activities":
            loc = ["run", *loc[1:]]
        raise EvidenceError(f"{where}: field {'.'.join(loc)}: {err['msg']}") from None


def _parse_prometheus(raw: Any, name: str, where: str) -> PromQuery:
    if not isinstance(raw, dict):
        raise EvidenceError(f"{where}: must be a JSON object")
    response = raw.get("response", raw)
    bounds = {k: _number(raw.get(k)) for k in ("start", "end", "step")}
    if isinstance(response, dict) and response.get("status", "success") != "success":
        # the collector keeps a failed query instead of inventing an empty result
        error = response.get("error") or response.get("errorType") or response["status"]
        return PromQuery(name=name, query=str(raw.get("query", "")), series=(),
                         error=str(error), **bounds)
    data = response.get("data") if isinstance(response, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise EvidenceError(
            f"{where}: field response.data.resultType: must be 'matrix' (query_range)"
        )
    series = []
    for i, item in enumerate(data.get("result") or []):
        try:
            values = tuple((float(t), float(v)) for t, v in item.get("values", []))
            series.append(PromSeries(metric=item.get("metric", {}), values=values))
        except (TypeError, ValueError, AttributeError, ValidationError):
            raise EvidenceError(
                f"{where}: field response.data.result[{i}]: not a matrix series"
            ) from None
    return PromQuery(name=name, query=str(raw.get("query", "")), series=tuple(series), **bounds)


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def load_evidence(run_dir: str | Path) -> Evidence:
    """Read and validate every evidence file of a run directory. Raises EvidenceError."""
    root = Path(run_dir)
    if not root.is_dir():
        raise EvidenceError(f"{root}: run directory does not exist")
    try:
        run = RunInfo.model_validate(_read_json(root / "run.json", root))
    except ValidationError as exc:
        raise _field_error("run.json", exc) from None
    if run.ended_at < run.started_at:
        raise EvidenceError("run.json: field ended_at: is before started_at")

    experiments = []
    exp_root = root / "experiments"
    exp_dirs = sorted(p for p in exp_root.iterdir() if p.is_dir()) if exp_root.is_dir() else []
    if run.experiments is None and not exp_dirs:
        raise EvidenceError("experiments/: no experiment directories (each needs journal.json)")
    for exp_dir in exp_dirs:
        path = exp_dir / "journal.json"
        if not path.exists():
            continue  # an expected experiment without a journal is judged, not a load error
        journal = _parse_journal(_read_json(path, root), _rel(path, root))
        experiments.append(ExperimentEvidence(name=exp_dir.name, journal=journal))
    expected = run.expected_experiments
    if expected is None:
        # older run dirs: every experiment directory was meant to hold a journal; run order
        ran = [e.name for e in sorted(experiments, key=lambda e: e.journal.start)]
        expected = (*ran, *(p.name for p in exp_dirs if p.name not in ran))

    prometheus: dict[str, PromQuery] = {}
    prom_dir = root / "prometheus"
    for path in sorted(prom_dir.glob("*.json")) if prom_dir.is_dir() else []:
        prometheus[path.stem] = _parse_prometheus(
            _read_json(path, root), path.stem, _rel(path, root)
        )
    if any(e.journal.gameday.expected_alerts for e in experiments) and "alerts" not in prometheus:
        raise EvidenceError(
            "prometheus/alerts.json: missing, but experiments expect alerts (query_range of ALERTS)"
        )

    load_stats = _read_json(root / "load_stats.json", root)
    if not isinstance(load_stats, (dict, list)):
        raise EvidenceError("load_stats.json: must be a JSON object or list (Locust stats)")

    try:
        inference = tuple(inference_ledger.read(root / inference_ledger.FILE))
    except InferenceLedgerError as exc:
        raise EvidenceError(str(exc).replace(f"{root}/", "")) from None

    snap = root / "snapshot"
    evidence = Evidence(
        run_dir=root,
        run=run,
        ledger=_read_ledger(root),
        requests=read_jsonl(root / "requests.jsonl", root, RequestRecord),
        load_stats=load_stats,
        operations=read_jsonl(snap / "operations.jsonl", root, Operation),
        attempts=read_jsonl(snap / "attempts.jsonl", root, Attempt),
        events=read_jsonl(snap / "events.jsonl", root, Event),
        objects=read_jsonl(snap / "objects.jsonl", root, StoredObject),
        faults=read_jsonl(root / "faults.jsonl", root, FaultRecord),
        prometheus=prometheus,
        inference=inference,
        experiments=tuple(experiments),
        expected=expected,
        agents=read_jsonl(snap / "agents.jsonl", root, AgentRecord, required=False)
        if (snap / "agents.jsonl").is_file()
        else None,
        **{name: read_jsonl(snap / f"{name}.jsonl", root, model)
           if (snap / f"{name}.jsonl").is_file() else None
           for name, model in (("pipelines", PipelineRecord),
                               ("pipeline_steps", PipelineStepRecord),
                               ("pipeline_events", PipelineEvent),
                               ("side_effects", SideEffectRecord),
                               ("agent_liveness", AgentHeardAgain),
                               ("tracking_runs", TrackingRun))},
    )
    if not evidence.requests:
        raise EvidenceError("requests.jsonl: empty; API availability cannot be computed")
    op_ids = {op.id for op in evidence.operations}
    for i, attempt in enumerate(evidence.attempts, start=1):
        if attempt.operation_id not in op_ids:
            raise EvidenceError(
                f"snapshot/attempts.jsonl: line {i}: field operation_id: "
                f"{attempt.operation_id!r} is not in snapshot/operations.jsonl"
            )
    return evidence
