"""One experiment judged from the run's evidence, step by step (pure: evidence in, result out).

Each step computes one thing over the experiment's fault window and returns it typed: the
declared objectives, the fault window, the SLIs (breach, recovery), the alerts, detection,
requests, automation, the RPO (acknowledged submissions, checkpoint progress, artifacts), the
invariants and the time to an accepted result. `evaluate_experiment` only composes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slo import budget, sli
from slo.checks import RPO_SLIS
from slo.evidence import Event, EvidenceError, ExperimentEvidence, FaultRecord, Journal
from slo.invariants import KNOWN_INVARIANTS, check_invariant
from slo.load_timeline import goodput_recovery, load_points
from slo.pipelines import PIPELINE_INVARIANTS, usable_result_seconds
from slo.run_index import RunIndex, burn, observation_seconds
from slo.sli import Outcome, ts
from slo.specs import Specs
from slo.specs.model import RecoveryObjective
from slo.telemetry import TelemetryLoss, telemetry_loss
from slo.verdict import AlertResult, ExperimentResult, InvariantOutcome, SliWindow

# how long before the fault the load timeline starts (the goodput the fault is compared with)
LOAD_BEFORE_SECONDS = 20.0

# generic event kinds -> the automation they show (docs/EVIDENCE.md, "events.jsonl")
AUTOMATION: dict[str, Callable[[Event], bool]] = {
    "retries": lambda e: e.to_state == "retrying" or e.kind == "retry_scheduled",
    "reroutes": lambda e: e.kind in ("rerouted", "reroute"),
    "lease_expiries": lambda e: e.kind == "lease_expired",
    "stale_reports_rejected": lambda e: e.kind in ("stale_report_refused", "stale_report_rejected"),
    "failovers": lambda e: e.kind == "failover",
    "resumes": lambda e: e.kind == "resumed",
    "torn_checkpoints_skipped": lambda e: e.kind == "checkpoint_skipped_torn",
}


@dataclass(frozen=True)
class FaultWindow:
    name: str
    start: float
    end: float


def fault_window(
    faults: Sequence[FaultRecord], journal_start: float, journal_end: float
) -> FaultWindow | None:
    """Span of every fault the experiment injected: from the first `fault_start` inside the
    journal's [start, end] to the last matching `fault_end` (a fault never ended lasts until
    the journal end). None when no fault was recorded: there is then no fault start to measure
    from, and none is invented from the journal."""
    starts = [
        f for f in faults if f.event == "fault_start" and journal_start <= ts(f.time) <= journal_end
    ]
    if not starts:
        return None
    ends = []
    for f in starts:
        t = ts(f.time)
        matching = [
            ts(g.time) for g in faults
            if g.event == "fault_end" and g.fault == f.fault and ts(g.time) >= t
        ]
        ends.append(min(matching, default=journal_end))
    return FaultWindow(
        ", ".join(dict.fromkeys(f.fault for f in starts)),
        min(ts(f.time) for f in starts),
        max(ends),
    )


def not_measured_reason(journal: Journal, window: FaultWindow | None) -> str | None:
    """Why a journal that exists still measured nothing, or None when it is measured."""
    if journal.steady_state_before_met is False:
        return "steady state not met before the method"
    if journal.steady_state_before_met is None:
        return "no steady-state result before the method in the journal"
    if window is None:
        return "no fault recorded: no fault_start in faults.jsonl during the journal"
    return None


def missing_experiment(run: RunIndex, name: str) -> ExperimentResult:
    """An expected experiment without a journal: reported, never measured (exit 3)."""
    status = run.evidence.run.experiment_status.get(name)
    runner = (
        f"; runner: {status.status}" + (f", {status.detail}" if status.detail else "")
        if status is not None else "; no runner status in run.json"
    )
    ro = run.specs.recovery_objectives.get(name)
    return ExperimentResult(
        name=name,
        measured=False,
        journal_present=False,
        not_measured_reason=f"no journal{runner}",
        runner_status=status.status if status else None,
        runner_detail=(status.detail or None) if status else None,
        title=ro.display_name if ro else None,
        failure_class=ro.failure_class if ro else None,
        runbook=ro.runbook if ro else None,
        rto_seconds=ro.rto_seconds if ro else None,
        expected_alerts=list(ro.expected_alerts) if ro else [],
        invariant_names=list(ro.invariants) if ro else [],
        findings=[f"{name}: missing from the evidence: no journal{runner}"],
    )


def _alert_fired(run: RunIndex, name: str, lo: float, hi: float) -> float | None:
    query = run.evidence.prometheus.get("alerts")
    if query is None:
        return None
    times = [
        t
        for s in query.series
        if s.metric.get("alertname") == name and s.metric.get("alertstate", "firing") == "firing"
        for t, v in s.values
        if v > 0 and lo <= t <= hi
    ]
    return min(times) if times else None


def owner_windows(
    experiments: Sequence[ExperimentEvidence], run_end: float
) -> dict[str, tuple[float, float]]:
    """Each experiment owns what happened since the previous one ended (lost acks, writes):
    loss caused by a fault often surfaces as an ack made just before it."""
    ordered = sorted(experiments, key=lambda e: e.journal.start)
    out, prev = {}, float("-inf")
    for i, exp in enumerate(ordered):
        end = ts(exp.journal.end) if i < len(ordered) - 1 else max(run_end, ts(exp.journal.end))
        out[exp.name] = (prev, end)
        prev = end
    return out


def _time_to_accepted_result(
    run: RunIndex, fault_start: float, until: float
) -> tuple[float | None, str]:
    in_flight, done = [], []
    for op in run.evidence.operations:
        events = run.events_by_op.get(op.id, [])
        finished = sli.success_time(op, events)
        terminal_before = any(
            e.to_state in sli.TERMINAL_OPERATION_STATES and ts(e.time) <= fault_start
            for e in events
        )
        if ts(op.created_at) < fault_start and not terminal_before and op.state != "canceled":
            in_flight.append(op.id)
            done.append(finished)
    if in_flight:
        if any(d is None for d in done):
            missing = sum(d is None for d in done)
            return (
                None,
                f"{missing} of {len(in_flight)} operations in flight at fault start never succeeded",
            )
        return max(
            d for d in done if d is not None
        ) - fault_start, f"last of {len(in_flight)} in-flight operations succeeded"
    later = [
        sli.success_time(op, run.events_by_op.get(op.id, []))
        for op in run.evidence.operations
        if fault_start <= ts(op.created_at) <= until
    ]
    first = min((d for d in later if d is not None), default=None)
    if first is None:
        return None, "no operation in flight at fault start, none submitted after it succeeded"
    return first - fault_start, "first operation submitted after the fault succeeded"


# --------------------------------------------------------------------------- the steps


@dataclass(frozen=True)
class Declared:
    """What the experiment is judged against: its recovery objective and the SLOs, alerts and
    invariants it and the objective name (each name checked against the specs)."""

    objective: RecoveryObjective
    slos: list[str]
    alerts: list[str]
    invariants: list[str]


def declared(specs: Specs, exp: ExperimentEvidence) -> Declared:
    ext = exp.journal.gameday
    ro = specs.recovery_objectives.get(ext.recovery_objective)
    where = f"experiments/{exp.name}/journal.json: field experiment.x-gameday"
    if ro is None:
        raise EvidenceError(
            f"{where}.recovery_objective: "
            f"unknown {ext.recovery_objective!r} (known: {', '.join(specs.recovery_objectives)})"
        )
    slos = ro.judged_slos(ext.slos)
    for name in slos:
        if name not in specs.slo_names:
            raise EvidenceError(f"{where}.slos: unknown SLO {name!r}")
    invariants = list(dict.fromkeys([*ro.invariants, *ext.invariants]))
    for name in invariants:
        if name not in KNOWN_INVARIANTS:
            raise EvidenceError(
                f"{where}.invariants: unknown invariant {name!r} "
                f"(known: {', '.join(KNOWN_INVARIANTS)})"
            )
    alerts = list(dict.fromkeys([*ext.expected_alerts, *ro.expected_alerts]))
    return Declared(ro, slos, alerts, invariants)


def _about(run: RunIndex, exp: ExperimentEvidence, d: Declared) -> dict[str, object]:
    """The fields every result carries, measured or not."""
    j, ext = exp.journal, exp.journal.gameday
    status = run.evidence.run.experiment_status.get(exp.name)
    return {
        "name": exp.name,
        "title": j.title,
        "failure_class": d.objective.failure_class,
        "runbook": ext.runbook or d.objective.runbook,
        "journal_status": j.status,
        "deviated": j.deviated,
        "steady_state_before_met": j.steady_state_before_met,
        "experiment_ok": j.experiment_ok,
        "blast_radius": ext.blast_radius,
        "start": ts(j.start),
        "end": ts(j.end),
        "rto_seconds": d.objective.rto_seconds,
        "expected_alerts": d.alerts,
        "invariant_names": d.invariants,
        "failed_activities": j.failed_activities,
        "runner_status": status.status if status else None,
        "runner_detail": (status.detail or None) if status else None,
    }


@dataclass(frozen=True)
class Span:
    """The stretch of evidence an experiment is judged over."""

    start: float  # journal start
    end: float  # journal end
    fault: FaultWindow
    horizon: float  # how far after the fault its effects still count
    times: list[float]  # the SLI sampling grid, start .. horizon

    @property
    def fault_start(self) -> float:
        return self.fault.start


def span(run: RunIndex, d: Declared, start: float, end: float, window: FaultWindow,
         next_start: float) -> Span:
    """Up to the observation time after the journal ends, never past the snapshot, and never
    into the next experiment (its fault's effects must not count against this one)."""
    cfg = run.specs.evaluation
    look = max(cfg.alert_grace_seconds, observation_seconds(run.specs, d.slos))
    horizon = min(end + look, max(run.snapshot, end), max(next_start, end))
    return Span(start, end, window, horizon,
                sli.sample_times(start, horizon, cfg.sample_interval_seconds))


def sli_window(run: RunIndex, name: str, outcomes: list[Outcome], s: Span) -> SliWindow:
    """One SLI over the experiment: its value and burn in the journal's window, its first
    breach and its recovery after the fault start."""
    cfg, slo = run.specs.evaluation, run.specs.slo(name)
    series = sli.rolling_ratio(outcomes, s.times, cfg.sample_window_seconds)
    target = slo.objective.target
    # every breach that starts before the horizon counts: an SLI stuck after the fault
    # ended has not recovered, however long after the fault it broke
    breach = sli.first_breach(s.times, series, target, s.fault_start, s.horizon)
    has_data = any(v is not None for t, v in zip(s.times, series)
                   if s.fault_start <= t <= s.horizon)
    rec = (sli.recovery_time(s.times, series, target, s.fault_start, cfg.recovery_hold_samples,
                             s.horizon) if has_data else None)
    good, total = sli.count(sli.in_window(outcomes, s.start, s.end))
    value = budget.sli_value(good, total)
    rate, consumed = burn(slo, value, max(s.end - s.start, 1e-9))
    return SliWindow(
        name=name, display_name=slo.display_name, target=target, good=good, total=total,
        value=value, burn_rate=rate, budget_consumed=consumed, breached_at=breach,
        recovery_seconds=rec, has_data=has_data, series=list(zip(s.times, series)),
    )


@dataclass(frozen=True)
class Recovery:
    seconds: float | None  # slowest recovery SLI; None: one never recovered, or none had data
    no_data: list[str]  # recovery SLIs without data after the fault


def recovery(windows: Sequence[SliWindow]) -> Recovery:
    """The experiment recovered when every recovery SLI with data did (RPO SLIs never
    "recover": their losses are judged by the RPO checks)."""
    judged = [w for w in windows if w.name not in RPO_SLIS]
    times = [w.recovery_seconds for w in judged if w.has_data]
    no_data = [w.name for w in judged if not w.has_data]
    # no recovery SLI with data at all: there is no recovery to report (the RTO check fails)
    seconds = None if not times or any(r is None for r in times) else max(times, default=0.0)
    return Recovery(seconds, no_data)


def alerts(run: RunIndex, exp: ExperimentEvidence, names: Sequence[str],
           outcomes: dict[str, list[Outcome]], s: Span,
           lost: TelemetryLoss | None = None) -> list[AlertResult]:
    """Each expected alert: when it fired, and whether it had to (it is required when the SLO
    it guards breached while the fault lasted). With the window's Prometheus evidence lost,
    nothing is known about any of them: no data, never "silent, correctly"."""
    specs, cfg = run.specs, run.specs.evaluation
    if names and "alerts" not in run.evidence.prometheus:
        raise EvidenceError(
            f"prometheus/alerts.json: missing, but experiment {exp.name} expects "
            f"{', '.join(names)} (keep a query_range of ALERTS in the evidence)"
        )
    if lost is not None:
        return [AlertResult(name=name, fired=False, fired_at=None, fired_after_seconds=None,
                            no_data=lost.reason) for name in names]
    guarded = {specs.slo(n).alert_name: n for n in specs.slo_names}
    during_fault: dict[str, float | None] = {}
    out = []
    for name in names:
        fired = _alert_fired(run, name, s.fault_start, s.horizon)
        slo_name = guarded.get(name)
        required, note = True, None
        if fired is None and slo_name is not None:
            if slo_name not in during_fault:
                series = sli.rolling_ratio(outcomes[slo_name], s.times, cfg.sample_window_seconds)
                during_fault[slo_name] = sli.first_breach(
                    s.times, series, specs.slo(slo_name).objective.target, s.fault_start,
                    s.fault.end + cfg.sample_window_seconds)
            if during_fault[slo_name] is None:
                required = False
                note = f"{slo_name} stayed within its objective during the fault: nothing to page on"
        out.append(AlertResult(
            name=name, fired=fired is not None, fired_at=fired,
            fired_after_seconds=None if fired is None else fired - s.fault_start,
            required=required, note=note,
        ))
    return out


def detection(windows: Sequence[SliWindow], fired: Sequence[AlertResult], fault_start: float
              ) -> tuple[float | None, str | None]:
    """(seconds from fault start to the first SLI breach or alert, what it was)."""
    found = [(w.breached_at, "SLI breach") for w in windows if w.breached_at is not None] + [
        (a.fired_at, f"alert {a.name}") for a in fired if a.fired_at
    ]
    at, by = min(found, default=(None, None))
    return (None if at is None else at - fault_start), by


@dataclass(frozen=True)
class Requests:
    total: int
    failed: int
    slow: int


def requests(run: RunIndex, s: Span) -> Requests:
    """API requests from the fault start to the journal end."""
    cfg = run.specs.evaluation
    reqs = [r for r in run.evidence.requests if s.fault_start <= ts(r.time) <= s.end]
    ok = [r for r in reqs if sli.request_ok(r)]
    return Requests(len(reqs), len(reqs) - len(ok),
                    sum(1 for r in ok if r.latency_ms / 1000.0 > cfg.slow_request_seconds))


def automation(run: RunIndex, s: Span) -> tuple[dict[str, int], list[str]]:
    """(what the platform's automation did after the fault, by kind; manual decisions taken)."""
    ev = run.evidence
    in_horizon = [e for e in ev.events if s.fault_start <= ts(e.time) <= s.horizon]
    counts = {k: sum(1 for e in in_horizon if pred(e)) for k, pred in AUTOMATION.items()}
    counts["failovers"] += sum(
        1 for f in ev.faults
        if f.event == "note" and f.details.get("automation") == "failover"
        and s.fault_start <= ts(f.time) <= s.horizon
    )
    manual = [
        str(f.details.get("decision") or f.fault) for f in ev.faults
        if f.event == "note" and f.details.get("manual") and s.start <= ts(f.time) <= s.horizon
    ]
    return counts, manual


@dataclass(frozen=True)
class Rpo:
    """What the fault cost in work: acknowledged submissions, checkpoint progress, artifacts."""

    acknowledged: sli.DurabilityAudit
    losses: list[sli.ProgressLoss] = field(default_factory=list)
    artifacts_missing: int = 0

    @property
    def torn(self) -> int:
        return sum(loss.torn_checkpoint_used for loss in self.losses)

    @property
    def intervals_lost(self) -> float | None:
        intervals = [loss.intervals for loss in self.losses if loss.intervals is not None]
        return max(intervals) if intervals else (0.0 if not self.losses else None)


def rpo(run: RunIndex, outcomes: dict[str, list[Outcome]], owner: tuple[float, float],
        s: Span) -> Rpo:
    """Acknowledgements and writes in the experiment's owner window (loss caused by a fault
    often surfaces as an ack made just before it); checkpoint losses of attempts created
    between the fault start and the horizon."""
    ev = run.evidence
    lo, hi = owner
    audit = sli.submission_durability(
        [e for e in ev.ledger if lo < ts(e.acked_at) <= hi], ev.operations
    )
    losses = []
    for op_id, attempts in sli.group_by(ev.attempts, "operation_id").items():
        op = next((o for o in ev.operations if o.id == op_id), None)
        for loss in sli.checkpoint_progress_loss(
            attempts, run.events_by_op.get(op_id, []), op.checkpoint_every if op else None,
            run.index,
        ):
            created = next(a.created_at for a in attempts if a.id == loss.attempt_id)
            if s.fault_start <= ts(created) <= s.horizon:
                losses.append(loss)
    bad_writes = {
        o.subject for o in outcomes["artifact-write-success"] if not o.good and lo < o.time <= hi
    }
    bad_results = {
        o.subject for o in outcomes["terminal-state-consistency"]
        if not o.good and lo < o.time <= hi and "COMPLETE.json" in o.subject
    }
    return Rpo(audit, losses, len(bad_writes | bad_results))


def invariants(run: RunIndex, names: Sequence[str], s: Span,
               rto: float | None = None) -> list[InvariantOutcome]:
    grace = run.specs.evaluation.detection_grace_seconds
    out = []
    for name in names:
        result = check_invariant(name, run.evidence, s.fault_start, s.horizon, grace, rto)
        out.append(InvariantOutcome(name=name, judged=result.judged,
                                    violations=list(result.violations), no_data=result.no_data,
                                    measured=result.measured))
    return out


def findings(name: str, j: Journal, fired: Sequence[AlertResult], r: Rpo,
             held: Sequence[InvariantOutcome]) -> list[str]:
    """One line per thing a reader of the verdict must look at."""
    out = [f"{name}: expected alert {a.name} stayed silent"
           for a in fired if not a.fired and a.required and a.no_data is None]
    if r.torn:
        out.append(f"{name}: resumed from {r.torn} torn (incomplete) checkpoint(s)")
    if r.acknowledged.matched_by_key_only:
        out.append(
            f"{name}: {len(r.acknowledged.matched_by_key_only)} acknowledged submission(s) "
            "answer under a new operation id (found by idempotency key only)"
        )
    out += [f"{name}: invariant {i.name} violated {len(i.violations)}x"
            for i in held if i.violations]
    if not j.experiment_ok:
        out.append(
            f"{name}: experiment {j.status}" + (", deviated" if j.deviated else "")
            + (f", method activity {', '.join(j.failed_activities)} failed"
               if j.failed_activities else "")
        )
    return out


# --------------------------------------------------------------------------- composed


def evaluate_experiment(
    run: RunIndex,
    exp: ExperimentEvidence,
    outcomes: dict[str, list[Outcome]],
    owner: tuple[float, float],
    next_start: float = float("inf"),
) -> ExperimentResult:
    d = declared(run.specs, exp)
    about = _about(run, exp, d)
    start, end = ts(exp.journal.start), ts(exp.journal.end)
    window = fault_window(run.evidence.faults, start, end)
    why_not = not_measured_reason(exp.journal, window)
    if why_not is not None:
        return ExperimentResult(**about, measured=False, not_measured_reason=why_not,
                                findings=[f"{exp.name}: not measured: {why_not}"])
    assert window is not None  # no window always has a reason
    s = span(run, d, start, end, window, next_start)
    windows = [sli_window(run, name, outcomes[name], s) for name in d.slos]
    rec = recovery(windows)
    # Prometheus evidence over the window the alerts are looked for in (slo/telemetry.py)
    lost_telemetry = telemetry_loss(run.evidence.prometheus, s.fault_start, s.horizon)
    fired = alerts(run, exp, d.alerts, outcomes, s, lost_telemetry)
    detected_after, detected_by = detection(windows, fired, s.fault_start)
    reqs = requests(run, s)
    counts, manual = automation(run, s)
    lost = rpo(run, outcomes, owner, s)
    held = invariants(run, d.invariants, s, d.objective.rto_seconds)
    ttar, basis = _time_to_accepted_result(run, s.fault_start, s.horizon)
    audit = lost.acknowledged
    # from a while before the fault (goodput before it) to the horizon (after it)
    points = load_points(run.evidence.requests, s.fault_start - LOAD_BEFORE_SECONDS, s.horizon)
    goodput = goodput_recovery(points, s.fault_start, s.fault.end)
    if d.objective.recovered_by == "goodput":
        rec = Recovery(goodput.seconds_after_trigger,
                       [] if goodput.before else ["goodput (none before the fault)"])
    return ExperimentResult(
        **about,
        fault_name=window.name,
        fault_start=window.start,
        fault_end=window.end,
        fault_source="faults.jsonl",
        detection_seconds=detected_after,
        detected_by=detected_by,
        recovery_seconds=rec.seconds,
        recovery_no_data=rec.no_data,
        recovered_by=d.objective.recovered_by,
        requests=reqs.total,
        failed_requests=reqs.failed,
        slow_requests=reqs.slow,
        automation=counts,
        manual_decisions=manual,
        acknowledged_lost=len(audit.missing),
        acknowledged_duplicated=len(audit.duplicated),
        acknowledged_matched_by_key_only=len(audit.matched_by_key_only),
        checkpoint_steps_recomputed=sum(loss.lost_steps for loss in lost.losses),
        checkpoint_intervals_lost=lost.intervals_lost,
        torn_checkpoints_used=lost.torn,
        artifacts_missing=lost.artifacts_missing,
        time_to_accepted_result_seconds=ttar,
        accepted_result_basis=basis,
        pipeline_usable_result_seconds=usable_result_seconds(
            run.evidence.pipelines, run.evidence.pipeline_steps, s.fault_start, s.horizon)
        if set(d.invariants) & set(PIPELINE_INVARIANTS) else None,
        slis=windows,
        alerts=fired,
        telemetry_lost=lost_telemetry.reason if lost_telemetry else None,
        invariants=held,
        load=[(round(p.t, 3), p.offered, p.goodput, p.p99_ms) for p in points],
        goodput_before=goodput.before,
        goodput_during=goodput.during,
        goodput_recovery_seconds=goodput.seconds_after_trigger,
        findings=findings(exp.name, exp.journal, fired, lost, held) + (
            [(f"{exp.name}: Prometheus evidence lost ({lost_telemetry.reason}): alert "
              "objectives are no data; durability is still decided by the ledger and the store "
              "snapshot")]
            if lost_telemetry else []),
    )
