"""`evaluate_run(run_dir, env)`: raw evidence + specs -> Verdict (I/O and orchestration only;
the math is in sli.py, budget.py and scoring.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from slo import budget, sli
from slo.evidence import Event, Evidence, EvidenceError, ExperimentEvidence, load_evidence
from slo.scoring import Criterion, Scored, Status, check_status, gate_outcome
from slo.sli import Outcome, ts
from slo.specs import Slo, Specs, load_specs
from slo.verdict import AlertResult, Check, ExperimentResult, SliSummary, SliWindow, Verdict

EXIT_PASS = 0
EXIT_EXPERIMENT = 1
EXIT_OBJECTIVE = 2
EXIT_EVIDENCE = 3

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


# losses on these boundaries never "recover": they are judged by the RPO checks, not the RTO
RPO_SLIS = frozenset({"submission-durability", "terminal-state-consistency"})


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


def _fault_window(run: _Run, exp: ExperimentEvidence) -> tuple[str | None, float, float, str]:
    j = exp.journal
    start, end = ts(j.start), ts(j.end)
    for f in run.evidence.faults:
        t = ts(f.time)
        if f.event == "fault_start" and start <= t <= end:
            stop = next(
                (
                    ts(g.time)
                    for g in run.evidence.faults
                    if g.event == "fault_end" and g.fault == f.fault and ts(g.time) >= t
                ),
                end,
            )
            return f.fault, t, stop, "faults.jsonl"
    for act in j.activities:
        if act.type == "action" and act.start is not None:
            return (
                act.name,
                ts(act.start),
                ts(act.end or j.end),
                "journal method (no fault_start in faults.jsonl)",
            )
    return None, start, end, "journal start (no fault recorded)"


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
    fault_name, f_start, f_end, f_source = _fault_window(run, exp)
    start, end = ts(j.start), ts(j.end)
    horizon = min(end + specs.evaluation.alert_grace_seconds, max(run.snapshot, end),
                  max(next_start, end))
    findings: list[str] = []
    if f_source != "faults.jsonl":
        findings.append(f"{exp.name}: fault start taken from {f_source}")

    cfg = specs.evaluation
    times = sli.sample_times(start, horizon, cfg.sample_interval_seconds)
    windows: list[SliWindow] = []
    breaches: list[float] = []
    recoveries: list[float | None] = []
    for name in slo_names:
        slo = specs.slo(name)
        series = sli.rolling_ratio(outcomes[name], times, cfg.sample_window_seconds)
        target = slo.objective.target
        # a breach that starts after the fault is over (plus one sample window) is not its doing
        until = f_end + cfg.sample_window_seconds
        breach = sli.first_breach(times, series, target, f_start, until)
        rec = sli.recovery_time(times, series, target, f_start, cfg.recovery_hold_samples, until)
        in_exp = sli.in_window(outcomes[name], start, end)
        good, total = sli.count(in_exp)
        value = budget.sli_value(good, total)
        rate, consumed = _burn(slo, value, max(end - start, 1e-9))
        if breach is not None:
            breaches.append(breach)
        if name not in RPO_SLIS:
            recoveries.append(rec)
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
                series=list(zip(times, series)),
            )
        )
    recovery = None if any(r is None for r in recoveries) else max(recoveries, default=0.0)

    alert_names = list(dict.fromkeys([*ext.expected_alerts, *ro.expected_alerts]))
    if alert_names and "alerts" not in ev.prometheus:
        raise EvidenceError(
            f"prometheus/alerts.json: missing, but experiment {exp.name} expects {', '.join(alert_names)} "
            "(keep a query_range of ALERTS in the evidence)"
        )
    alerts = []
    guarded = {specs.slo(n).alert_name: n for n in specs.slo_names}
    breached_at = {w.name: w.breached_at for w in windows}
    for name in alert_names:
        fired = _alert_fired(run, name, f_start, horizon)
        slo_name = guarded.get(name)
        required, note = True, None
        if fired is None and slo_name is not None:
            if slo_name not in breached_at:  # guarded SLO not among this experiment's SLIs
                slo = specs.slo(slo_name)
                series = sli.rolling_ratio(outcomes[slo_name], times, cfg.sample_window_seconds)
                breached_at[slo_name] = sli.first_breach(
                    times, series, slo.objective.target, f_start, f_end + cfg.sample_window_seconds)
            if breached_at[slo_name] is None:
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
    if not j.experiment_ok:
        findings.append(
            f"{exp.name}: experiment {j.status}"
            + (", deviated" if j.deviated else "")
            + (
                ", steady state not met before the method"
                if j.steady_state_before_met is False
                else ""
            )
        )
    return ExperimentResult(
        name=exp.name,
        title=j.title,
        failure_class=ro.failure_class,
        runbook=ext.runbook or ro.runbook,
        journal_status=j.status,
        deviated=j.deviated,
        steady_state_before_met=j.steady_state_before_met,
        experiment_ok=j.experiment_ok,
        blast_radius=ext.blast_radius,
        start=start,
        end=end,
        fault_name=fault_name,
        fault_start=f_start,
        fault_end=f_end,
        fault_source=f_source,
        rto_seconds=ro.rto_seconds,
        detection_seconds=None if detected_at is None else detected_at - f_start,
        detected_by=detected_by,
        recovery_seconds=recovery,
        requests=len(reqs),
        failed_requests=len(failed),
        slow_requests=len(slow),
        automation=automation,
        manual_decisions=manual,
        acknowledged_lost=len(audit.missing),
        acknowledged_duplicated=len(audit.duplicated),
        checkpoint_steps_recomputed=sum(loss.lost_steps for loss in losses),
        checkpoint_intervals_lost=max(intervals) if intervals else (0.0 if not losses else None),
        torn_checkpoints_used=torn,
        artifacts_missing=len(bad_writes | bad_results),
        time_to_accepted_result_seconds=ttar,
        accepted_result_basis=basis,
        slis=windows,
        alerts=alerts,
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


def _check(
    id_: str,
    experiment: str | None,
    objective: str,
    measured: float | None,
    passing: list[str],
    warning: list[str],
    weight: float,
    key: bool,
    baseline: dict[str, float],
    message: str,
    missing: Status | None = None,
) -> Check:
    base = baseline.get(id_)
    status = check_status(
        measured, [Criterion.parse(c) for c in passing], [Criterion.parse(c) for c in warning], base
    )
    if measured is None:
        status = missing
    return Check(
        id=id_,
        experiment=experiment,
        objective=objective,
        measured=measured,
        expected=" and ".join(passing),
        status=status.value if status else None,
        weight=weight,
        key=key,
        message=message,
        baseline=base,
    )


def build_checks(
    specs: Specs,
    slis: list[SliSummary],
    experiments: list[ExperimentResult],
    baseline: dict[str, float],
) -> list[Check]:
    g = specs.gate
    rel = f"<=+{g.relative_tolerance_percent:g}%"
    checks: list[Check] = []
    for s in slis:
        # non-key SLIs may miss the run objective as a warning while the window budget holds
        checks.append(
            _check(
                f"sli.{s.name}",
                None,
                f"{s.display_name} >= {s.target:g}",
                s.value,
                [f">={s.target!r}"],
                []
                if s.key
                else [
                    f">={budget.value_at_full_budget(s.target, s.duration_seconds, s.window_seconds)!r}"
                ],
                g.weight_sli,
                s.key,
                baseline,
                f"{s.good}/{s.total} good"
                + (f", burn rate {s.burn_rate:.2f}x" if s.burn_rate is not None else ""),
            )
        )
    for e in experiments:
        x = e.name
        checks.append(
            _check(
                f"{x}.rto",
                x,
                f"recovered within RTO {e.rto_seconds:g}s",
                e.recovery_seconds,
                [f"<={e.rto_seconds!r}", rel],
                [f"<={e.rto_seconds!r}"],
                g.weight_rto,
                True,
                baseline,
                "never recovered within the evidence"
                if e.recovery_seconds is None
                else f"recovered {e.recovery_seconds:.1f}s after fault start",
                missing=Status.FAIL,
            )
        )
        ro = specs.recovery_objectives[e.failure_class]
        checks.append(
            _check(
                f"{x}.rpo.acknowledged_submissions",
                x,
                f"acknowledged submissions lost <= {ro.rpo.acknowledged_submissions}",
                float(e.acknowledged_lost + e.acknowledged_duplicated),
                [f"<={ro.rpo.acknowledged_submissions}"],
                [],
                g.weight_rpo,
                True,
                baseline,
                f"{e.acknowledged_lost} lost, {e.acknowledged_duplicated} duplicated",
            )
        )
        lost_intervals = e.checkpoint_intervals_lost
        if e.torn_checkpoints_used:
            lost_intervals = float("inf")  # a torn checkpoint used is unbounded loss
        checks.append(
            _check(
                f"{x}.rpo.checkpoint_progress",
                x,
                f"checkpoint intervals lost <= {ro.rpo.checkpoint_progress_intervals:g}",
                lost_intervals,
                [f"<={ro.rpo.checkpoint_progress_intervals!r}"],
                [],
                g.weight_rpo,
                True,
                baseline,
                f"{e.checkpoint_steps_recomputed:g} steps recomputed, {e.torn_checkpoints_used} torn checkpoint(s) used",
            )
        )
        checks.append(
            _check(
                f"{x}.rpo.artifacts",
                x,
                f"artifacts lost <= {ro.rpo.artifacts}",
                float(e.artifacts_missing),
                [f"<={ro.rpo.artifacts}"],
                [],
                g.weight_rpo,
                True,
                baseline,
                f"{e.artifacts_missing} reported writes or results not complete in the store",
            )
        )
        for a in e.alerts:
            checks.append(
                _check(
                    f"{x}.alert.{a.name}",
                    x,
                    f"alert {a.name} fires when the SLO it guards is breached",
                    a.fired_after_seconds,
                    [">=0", rel],
                    [">=0"],
                    g.weight_alert,
                    False,
                    baseline,
                    f"fired {a.fired_after_seconds:.1f}s after fault start"
                    if a.fired
                    else "silent: never fired" if a.required
                    else f"silent, correctly: {a.note}",
                    missing=Status.FAIL if a.required else Status.PASS,
                )
            )
    return checks


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
    experiments = [
        evaluate_experiment(run, e, outcomes, owners[e.name], nxt)
        for e, nxt in zip(ordered, next_starts)
    ]
    baseline, baseline_runs = _baselines(baseline_dirs, relative_last)
    checks = build_checks(specs, slis, experiments, baseline)
    gate = gate_outcome(
        [Scored(Status(c.status) if c.status else None, c.weight, c.key) for c in checks],
        specs.gate.pass_score,
        specs.gate.warning_score,
    )
    failed_keys = [c.id for c in checks if c.key and c.status == "fail"]
    bad_experiments = [e.name for e in experiments if not e.experiment_ok]
    if gate.status is Status.FAIL:
        code = EXIT_OBJECTIVE
        reason = (
            ("key objective(s) missed: " + ", ".join(failed_keys))
            if failed_keys
            else (
                f"score {gate.score:.1f} below warning threshold {specs.gate.warning_score:g}"
                if gate.score is not None
                else "no measurable objective"
            )
        )
    elif bad_experiments:
        code, reason = (
            EXIT_EXPERIMENT,
            "experiment(s) failed or deviated: " + ", ".join(bad_experiments),
        )
    else:
        code = EXIT_PASS
        missed = [c.id for c in checks if c.status == "fail"]
        reason = (
            "all objectives met"
            if not missed
            else f"gate {gate.status.value}; non-key objective(s) missed: " + ", ".join(missed)
        )
    findings = [f for e in experiments for f in e.findings]
    findings += [
        f"SLI {s.name} missed its objective ({s.value:.5f} < {s.target:g})"
        for s in slis
        if s.objective_met is False
    ]
    return Verdict(
        run_id=evidence.run.run_id,
        env=evidence.run.env,
        suite=evidence.run.suite,
        platform=evidence.run.platform,
        started_at=run.start,
        ended_at=ts(evidence.run.ended_at),
        result=gate.status.value,
        score=gate.score,
        key_failed=gate.key_failed,
        exit_code=code,
        reason=reason,
        slis=slis,
        experiments=experiments,
        checks=checks,
        findings=findings,
        baseline_runs=baseline_runs,
        not_applicable=dict(evidence.run.not_applicable),
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
