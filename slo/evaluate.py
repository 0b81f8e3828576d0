"""`evaluate_run(run_dir, env)`: raw evidence + specs -> Verdict (I/O and orchestration only;
the math is in sli.py, budget.py and scoring.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from slo import budget, sli
from slo.checks import RPO_SLIS, build_checks
from slo.decision import EXIT_EVIDENCE, EXIT_EXPERIMENT, EXIT_OBJECTIVE, EXIT_PASS, decide
from slo.dropped import PROM_QUERY as DROPPED_QUERY
from slo.dropped import dropped_evidence
from slo.evidence import (
    Event,
    Evidence,
    EvidenceError,
    ExperimentEvidence,
    FaultRecord,
    Journal,
    load_evidence,
)
from slo.invariants import KNOWN_INVARIANTS, check_invariant
from slo.scoring import Scored, Status, gate_outcome
from slo.sli import Outcome, ts
from slo.specs import Slo, Specs, load_specs
from slo.specs.model import Budgeting
from slo.verdict import (
    AlertResult,
    ExperimentResult,
    InvariantOutcome,
    SliSummary,
    SliWindow,
    Verdict,
)

__all__ = [
    "EXIT_EVIDENCE",
    "EXIT_EXPERIMENT",
    "EXIT_OBJECTIVE",
    "EXIT_PASS",
    "evaluate_evidence",
    "evaluate_run",
]

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




@dataclass
class _Run:
    """Evidence indexed once for all computations."""

    evidence: Evidence
    specs: Specs
    start: float
    snapshot: float
    events_by_op: dict[str, list[Event]]
    index: sli.ObjectIndex
    attempt_numbers: dict[str, int]

    @classmethod
    def of(cls, evidence: Evidence, specs: Specs) -> _Run:
        events = sorted(evidence.events, key=lambda e: e.time)
        return cls(
            evidence=evidence,
            specs=specs,
            start=ts(evidence.run.started_at),
            snapshot=ts(evidence.snapshot_time),
            events_by_op=sli.group_by(events, "operation_id"),
            index=sli.ObjectIndex.of(evidence.objects),
            attempt_numbers={a.id: a.number for a in evidence.attempts},
        )


def _slice_width(slo: Slo, specs: Specs) -> float:
    return slo.objective.time_slice_window_seconds or specs.evaluation.time_slice_seconds


def observation_seconds(specs: Specs, slo_names: Iterable[str]) -> float:
    """How long after an experiment's work has drained its SLIs need to show a recovery that
    holds: a time-slice SLI's last bad outcome can land one slice later, the ratio needs one
    sample window to clear, then ``recoveryHoldSamples`` samples on the sampling grid must hold.
    The runner waits this long after each experiment; the evaluator looks at least this far."""
    ev = specs.evaluation
    slices = [_slice_width(specs.slo(n), specs) for n in slo_names
              if specs.slo(n).budgeting is Budgeting.TIMESLICES]
    return (max(slices, default=0.0) + ev.sample_window_seconds
            + ev.recovery_hold_samples * ev.sample_interval_seconds)


def compute_outcomes(run: _Run) -> dict[str, list[Outcome]]:
    """Outcomes per SLI over the whole run (keys are SLI names, see slo.specs.KNOWN_SLIS)."""
    ev, specs = run.evidence, run.specs

    def threshold(name: str) -> tuple[float, str]:
        obj = specs.slo(name).objective
        assert obj.value is not None and obj.op is not None  # loader checks threshold SLIs
        return obj.value, obj.op

    signals: dict[str, list[float]] = {}
    for e in ev.events:
        if e.attempt_id and e.kind in sli.PROGRESS_KINDS:
            signals.setdefault(e.attempt_id, []).append(ts(e.time))
    bound, _ = threshold("active-progress")
    queue_value, queue_op = threshold("queue-age")
    delay_value, delay_op = threshold("scheduling-delay")
    result_value, result_op = threshold("time-to-usable-result")
    return {
        "api-availability": sli.api_availability(ev.requests),
        "submission-durability": list(sli.submission_durability(ev.ledger, ev.operations).outcomes),
        "queue-age": sli.queue_age(
            sli.queued_intervals(run.events_by_op, run.snapshot),
            run.start,
            run.snapshot,
            _slice_width(specs.slo("queue-age"), specs),
            queue_value,
            queue_op,
        ),
        "scheduling-delay": sli.scheduling_delay(ev.attempts, delay_value, delay_op, run.snapshot),
        "startup-success": sli.startup_success(ev.attempts),
        "active-progress": sli.active_progress(
            sli.stale_intervals(ev.attempts, signals, bound, run.snapshot),
            run.start,
            run.snapshot,
            _slice_width(specs.slo("active-progress"), specs),
        ),
        "artifact-write-success": sli.artifact_write_success(
            ev.events, run.attempt_numbers, run.index
        ),
        "terminal-state-consistency": sli.terminal_state_consistency(
            ev.operations, sli.group_by(ev.attempts, "operation_id"), run.events_by_op, run.index
        ),
        "time-to-usable-result": sli.time_to_usable_result(
            ev.operations, run.events_by_op, result_value, result_op, run.snapshot
        ),
    }


def _burn(slo: Slo, value: float | None, duration: float) -> tuple[float | None, float | None]:
    if value is None:
        return None, None
    rate = budget.burn_rate(1.0 - value, slo.objective.target)
    return rate, budget.budget_consumed(rate, duration, slo.window_seconds)


def _bad_subjects(outcomes: Iterable[Outcome], limit: int = 10) -> list[str]:
    return [o.subject for o in outcomes if not o.good][:limit]


def summarize_slis(run: _Run, outcomes: dict[str, list[Outcome]]) -> list[SliSummary]:
    duration = max(run.snapshot - run.start, 1e-9)
    out = []
    for slo in run.specs.slos:
        good, total = sli.count(outcomes[slo.name])
        value = budget.sli_value(good, total)
        rate, consumed = _burn(slo, value, duration)
        out.append(
            SliSummary(
                name=slo.name,
                display_name=slo.display_name,
                kind=slo.indicator.kind.value,
                budgeting=slo.budgeting.value,
                target=slo.objective.target,
                op=slo.objective.op,
                threshold=slo.objective.value,
                window_seconds=slo.window_seconds,
                duration_seconds=duration,
                good=good,
                total=total,
                value=value,
                burn_rate=rate,
                budget_consumed=consumed,
                objective_met=budget.objective_met(value, slo.objective.target),
                key=slo.name in run.specs.gate.key_slis,
                details={"bad_examples": _bad_subjects(outcomes[slo.name])},
            )
        )
    return out


# --------------------------------------------------------------------------- experiments


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


def missing_experiment(run: _Run, name: str) -> ExperimentResult:
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


def _alert_fired(run: _Run, name: str, lo: float, hi: float) -> float | None:
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


def _owner_windows(
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
    run: _Run, fault_start: float, until: float
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


def evaluate_experiment(
    run: _Run,
    exp: ExperimentEvidence,
    outcomes: dict[str, list[Outcome]],
    owner: tuple[float, float],
    next_start: float = float("inf"),
) -> ExperimentResult:
    specs, ev, j = run.specs, run.evidence, exp.journal
    ext = j.gameday
    ro = specs.recovery_objectives.get(ext.recovery_objective)
    if ro is None:
        raise EvidenceError(
            f"experiments/{exp.name}/journal.json: field experiment.x-gameday.recovery_objective: "
            f"unknown {ext.recovery_objective!r} (known: {', '.join(specs.recovery_objectives)})"
        )
    slo_names = list(dict.fromkeys([*ext.slos, *ro.slos]))
    for name in slo_names:
        if name not in specs.slo_names:
            raise EvidenceError(
                f"experiments/{exp.name}/journal.json: field experiment.x-gameday.slos: unknown SLO {name!r}"
            )
    alert_names = list(dict.fromkeys([*ext.expected_alerts, *ro.expected_alerts]))
    invariant_names = list(dict.fromkeys([*ro.invariants, *ext.invariants]))
    for name in invariant_names:
        if name not in KNOWN_INVARIANTS:
            raise EvidenceError(
                f"experiments/{exp.name}/journal.json: field experiment.x-gameday.invariants: "
                f"unknown invariant {name!r} (known: {', '.join(KNOWN_INVARIANTS)})"
            )
    start, end = ts(j.start), ts(j.end)
    status = ev.run.experiment_status.get(exp.name)
    about = {
        "name": exp.name,
        "title": j.title,
        "failure_class": ro.failure_class,
        "runbook": ext.runbook or ro.runbook,
        "journal_status": j.status,
        "deviated": j.deviated,
        "steady_state_before_met": j.steady_state_before_met,
        "experiment_ok": j.experiment_ok,
        "blast_radius": ext.blast_radius,
        "start": start,
        "end": end,
        "rto_seconds": ro.rto_seconds,
        "expected_alerts": alert_names,
        "invariant_names": invariant_names,
        "failed_activities": j.failed_activities,
        "runner_status": status.status if status else None,
        "runner_detail": (status.detail or None) if status else None,
    }
    window = fault_window(ev.faults, start, end)
    why_not = not_measured_reason(j, window)
    if why_not is not None:
        return ExperimentResult(
            **about,
            measured=False,
            not_measured_reason=why_not,
            findings=[f"{exp.name}: not measured: {why_not}"],
        )
    assert window is not None  # no window always has a reason
    f_start, f_end = window.start, window.end
    look = max(specs.evaluation.alert_grace_seconds, observation_seconds(specs, slo_names))
    horizon = min(end + look, max(run.snapshot, end), max(next_start, end))
    findings: list[str] = []

    cfg = specs.evaluation
    times = sli.sample_times(start, horizon, cfg.sample_interval_seconds)
    windows: list[SliWindow] = []
    breaches: list[float] = []
    recoveries: list[float | None] = []
    no_data: list[str] = []
    for name in slo_names:
        slo = specs.slo(name)
        series = sli.rolling_ratio(outcomes[name], times, cfg.sample_window_seconds)
        target = slo.objective.target
        # every breach that starts before the horizon counts: an SLI stuck after the fault
        # ended has not recovered, however long after the fault it broke
        breach = sli.first_breach(times, series, target, f_start, horizon)
        has_data = any(v is not None for t, v in zip(times, series) if f_start <= t <= horizon)
        rec = (sli.recovery_time(times, series, target, f_start, cfg.recovery_hold_samples,
                                 horizon) if has_data else None)
        in_exp = sli.in_window(outcomes[name], start, end)
        good, total = sli.count(in_exp)
        value = budget.sli_value(good, total)
        rate, consumed = _burn(slo, value, max(end - start, 1e-9))
        if breach is not None:
            breaches.append(breach)
        if name not in RPO_SLIS:
            if has_data:
                recoveries.append(rec)
            else:
                no_data.append(name)
        windows.append(
            SliWindow(
                name=name,
                display_name=slo.display_name,
                target=target,
                good=good,
                total=total,
                value=value,
                burn_rate=rate,
                budget_consumed=consumed,
                breached_at=breach,
                recovery_seconds=rec,
                has_data=has_data,
                series=list(zip(times, series)),
            )
        )
    # no recovery SLI with data at all: there is no recovery to report (the RTO check fails)
    recovery = (None if not recoveries or any(r is None for r in recoveries)
                else max(recoveries, default=0.0))

    if alert_names and "alerts" not in ev.prometheus:
        raise EvidenceError(
            f"prometheus/alerts.json: missing, but experiment {exp.name} expects {', '.join(alert_names)} "
            "(keep a query_range of ALERTS in the evidence)"
        )
    alerts = []
    guarded = {specs.slo(n).alert_name: n for n in specs.slo_names}
    # an alert is required when the SLO it guards breached while the fault lasted
    during_fault: dict[str, float | None] = {}
    for name in alert_names:
        fired = _alert_fired(run, name, f_start, horizon)
        slo_name = guarded.get(name)
        required, note = True, None
        if fired is None and slo_name is not None:
            if slo_name not in during_fault:
                slo = specs.slo(slo_name)
                series = sli.rolling_ratio(outcomes[slo_name], times, cfg.sample_window_seconds)
                during_fault[slo_name] = sli.first_breach(
                    times, series, slo.objective.target, f_start, f_end + cfg.sample_window_seconds)
            if during_fault[slo_name] is None:
                required = False
                note = f"{slo_name} stayed within its objective during the fault: nothing to page on"
        alerts.append(
            AlertResult(
                name=name,
                fired=fired is not None,
                fired_at=fired,
                fired_after_seconds=None if fired is None else fired - f_start,
                required=required,
                note=note,
            )
        )
        if fired is None and required:
            findings.append(f"{exp.name}: expected alert {name} stayed silent")

    detections = [(t, "SLI breach") for t in breaches] + [
        (a.fired_at, f"alert {a.name}") for a in alerts if a.fired_at
    ]
    detected_at, detected_by = min(detections, default=(None, None))
    reqs = [r for r in ev.requests if f_start <= ts(r.time) <= end]
    failed = [r for r in reqs if not sli.request_ok(r)]
    slow = [
        r for r in reqs if sli.request_ok(r) and r.latency_ms / 1000.0 > cfg.slow_request_seconds
    ]

    in_horizon = [e for e in ev.events if f_start <= ts(e.time) <= horizon]
    automation = {k: sum(1 for e in in_horizon if pred(e)) for k, pred in AUTOMATION.items()}
    automation["failovers"] += sum(
        1
        for f in ev.faults
        if f.event == "note"
        and f.details.get("automation") == "failover"
        and f_start <= ts(f.time) <= horizon
    )
    manual = [
        str(f.details.get("decision") or f.fault)
        for f in ev.faults
        if f.event == "note" and f.details.get("manual") and start <= ts(f.time) <= horizon
    ]

    lo, hi = owner
    audit = sli.submission_durability(
        [e for e in ev.ledger if lo < ts(e.acked_at) <= hi], ev.operations
    )
    losses = []
    for op_id, attempts in sli.group_by(ev.attempts, "operation_id").items():
        op = next((o for o in ev.operations if o.id == op_id), None)
        for loss in sli.checkpoint_progress_loss(
            attempts,
            run.events_by_op.get(op_id, []),
            op.checkpoint_every if op else None,
            run.index,
        ):
            created = next(a.created_at for a in attempts if a.id == loss.attempt_id)
            if f_start <= ts(created) <= horizon:
                losses.append(loss)
    bad_writes = {
        o.subject for o in outcomes["artifact-write-success"] if not o.good and lo < o.time <= hi
    }
    bad_results = {
        o.subject
        for o in outcomes["terminal-state-consistency"]
        if not o.good and lo < o.time <= hi and "COMPLETE.json" in o.subject
    }
    ttar, basis = _time_to_accepted_result(run, f_start, horizon)
    intervals = [loss.intervals for loss in losses if loss.intervals is not None]
    torn = sum(loss.torn_checkpoint_used for loss in losses)
    if torn:
        findings.append(f"{exp.name}: resumed from {torn} torn (incomplete) checkpoint(s)")
    if audit.matched_by_key_only:
        findings.append(
            f"{exp.name}: {len(audit.matched_by_key_only)} acknowledged submission(s) answer "
            "under a new operation id (found by idempotency key only)"
        )
    invariants = []
    for name in invariant_names:
        result = check_invariant(name, ev, f_start, horizon,
                                 specs.evaluation.detection_grace_seconds)
        invariants.append(InvariantOutcome(name=name, judged=result.judged,
                                           violations=list(result.violations),
                                           no_data=result.no_data))
        if result.violations:
            findings.append(f"{exp.name}: invariant {name} violated {len(result.violations)}x")
    if not j.experiment_ok:
        findings.append(
            f"{exp.name}: experiment {j.status}" + (", deviated" if j.deviated else "")
            + (f", method activity {', '.join(j.failed_activities)} failed"
               if j.failed_activities else "")
        )
    return ExperimentResult(
        **about,
        fault_name=window.name,
        fault_start=f_start,
        fault_end=f_end,
        fault_source="faults.jsonl",
        detection_seconds=None if detected_at is None else detected_at - f_start,
        detected_by=detected_by,
        recovery_seconds=recovery,
        recovery_no_data=no_data,
        requests=len(reqs),
        failed_requests=len(failed),
        slow_requests=len(slow),
        automation=automation,
        manual_decisions=manual,
        acknowledged_lost=len(audit.missing),
        acknowledged_duplicated=len(audit.duplicated),
        acknowledged_matched_by_key_only=len(audit.matched_by_key_only),
        checkpoint_steps_recomputed=sum(loss.lost_steps for loss in losses),
        checkpoint_intervals_lost=max(intervals) if intervals else (0.0 if not losses else None),
        torn_checkpoints_used=torn,
        artifacts_missing=len(bad_writes | bad_results),
        time_to_accepted_result_seconds=ttar,
        accepted_result_basis=basis,
        slis=windows,
        alerts=alerts,
        invariants=invariants,
        findings=findings,
    )


# --------------------------------------------------------------------------- checks and gate


def _baselines(dirs: Sequence[Path], last: int | None) -> tuple[dict[str, float], list[str]]:
    """Mean measured value per check id over the last N passing runs (Keptn relative criteria)."""
    verdicts: list[Verdict] = []
    for d in dirs:
        path = Path(d) / "verdict.json" if Path(d).is_dir() else Path(d)
        try:
            verdicts.append(Verdict.model_validate(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            raise EvidenceError(f"{path}: baseline verdict unusable: {exc}") from None
    passing = sorted((v for v in verdicts if v.result == "pass"), key=lambda v: v.started_at)
    if last is not None:
        passing = passing[-last:] if last > 0 else []
    values: dict[str, list[float]] = {}
    for v in passing:
        for c in v.checks:
            if c.measured is not None:
                values.setdefault(c.id, []).append(c.measured)
    return {k: fmean(vs) for k, vs in values.items()}, [v.run_id for v in passing]


def _report_order(evidence: Evidence, present: list[str]) -> list[str]:
    """Expected experiments in run order, then any journal the suite did not name."""
    return list(dict.fromkeys([*evidence.expected, *present]))


def evaluate_evidence(
    evidence: Evidence,
    specs: Specs,
    baseline_dirs: Sequence[Path] = (),
    relative_last: int | None = None,
) -> Verdict:
    run = _Run.of(evidence, specs)
    outcomes = compute_outcomes(run)
    slis = summarize_slis(run, outcomes)
    owners = _owner_windows(evidence.experiments, run.snapshot)
    ordered = sorted(evidence.experiments, key=lambda e: e.journal.start)
    # an experiment is judged up to the next one's start at most: the next fault's effects
    # (breaches, alerts) must never count against the experiment before it
    next_starts = [ts(e.journal.start) for e in ordered[1:]] + [float("inf")]
    judged = {
        e.name: evaluate_experiment(run, e, outcomes, owners[e.name], nxt)
        for e, nxt in zip(ordered, next_starts)
    }
    # every expected experiment gets a result, with or without a journal
    experiments = [
        judged[name] if name in judged else missing_experiment(run, name)
        for name in _report_order(evidence, [e.name for e in ordered])
    ]
    dropped = dropped_evidence(evidence.events, evidence.prometheus.get(DROPPED_QUERY))
    baseline, baseline_runs = _baselines(baseline_dirs, relative_last)
    checks = build_checks(specs, slis, experiments, baseline, dropped)
    gate = gate_outcome(
        [Scored(Status(c.status) if c.status else None, c.weight, c.key) for c in checks],
        specs.gate.pass_score,
        specs.gate.warning_score,
    )
    decision = decide(checks, experiments, gate, specs.gate.warning_score)
    findings = [f for e in experiments for f in e.findings]
    findings += [
        f"SLI {s.name} missed its objective ({s.value:.5f} < {s.target:g})"
        for s in slis
        if s.objective_met is False
    ]
    if dropped.total:
        findings.append(f"agents dropped {dropped.total} evidence event(s) before delivery: "
                        "SLIs computed from events may look better than what happened")
    return Verdict(
        run_id=evidence.run.run_id,
        env=evidence.run.env,
        suite=evidence.run.suite,
        platform=evidence.run.platform,
        started_at=run.start,
        ended_at=ts(evidence.run.ended_at),
        result=decision.result,
        score=gate.score,
        scored_checks=gate.scored,
        key_failed=gate.key_failed,
        exit_code=decision.exit_code,
        reason=decision.reason,
        slis=slis,
        experiments=experiments,
        checks=checks,
        findings=findings,
        baseline_runs=baseline_runs,
        not_applicable=dict(evidence.run.not_applicable),
        evidence_dropped=dropped.total,
        evidence_dropped_by_agent=dropped.by_agent,
    )


def evaluate_run(
    run_dir: str | Path,
    env: str | None = None,
    baseline_dirs: Sequence[str | Path] = (),
    relative_last: int | None = None,
    spec_dir: str | Path | None = None,
) -> Verdict:
    """Recompute the verdict from a run directory. `env` defaults to run.json's env.
    Raises EvidenceError (exit 3) or slo.specs.SpecError."""
    evidence = load_evidence(run_dir)
    specs = load_specs(env or evidence.run.env, spec_dir)
    return evaluate_evidence(evidence, specs, [Path(d) for d in baseline_dirs], relative_last)
