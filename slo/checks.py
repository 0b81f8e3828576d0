"""Checks: every objective compared with its measurement, one row in every output (pure).

Statuses (slo/scoring.py): pass / warning / fail are scored; `not_measured` marks every
objective of an experiment that did not run as designed (never a number, never a pass);
`no_data` marks a non-key SLI without events, or a non-key objective whose Prometheus evidence
was lost (slo/telemetry.py). A key one without data fails ("no data").

An event-ratio SLI's check carries what its events demonstrate (slo/confidence.py): shown,
not scored.
"""

from __future__ import annotations

from slo import budget
from slo.dropped import DroppedEvidence
from slo.scoring import Criterion, Status, check_status, criteria_text
from slo.specs import Specs
from slo.verdict import Check, ExperimentResult, SliSummary

MAX_EXAMPLES = 5
NO_DATA = "no data"
# losses on these boundaries never "recover": they are judged by the RPO checks, not the RTO
RPO_SLIS = frozenset({"submission-durability", "terminal-state-consistency"})
NONE = Criterion.at_most(0)  # violations, drops: none allowed
FIRED = Criterion.at_least(0)  # an alert's delay after the fault start: any, once it fired


def _check(
    id_: str,
    experiment: str | None,
    objective: str,
    measured: float | None,
    passing: list[Criterion],
    warning: list[Criterion],
    weight: float,
    key: bool,
    baseline: dict[str, float],
    message: str,
    missing: Status = Status.FAIL,
) -> Check:
    """`missing` is the status when nothing was measured; it is never a pass for a key check."""
    base = baseline.get(id_)
    status = check_status(measured, passing, warning, base)
    if status is None:
        status = missing
    return Check(
        id=id_,
        experiment=experiment,
        objective=objective,
        measured=measured,
        expected=criteria_text(passing),
        status=status.value,
        weight=weight,
        key=key,
        message=message,
        baseline=base,
    )


def _not_measured(id_: str, e: ExperimentResult, objective: str, expected: str, weight: float,
                  key: bool) -> Check:
    return Check(id=id_, experiment=e.name, objective=objective, measured=None, expected=expected,
                 status=Status.NOT_MEASURED.value, weight=weight, key=key,
                 message=f"not measured: {e.not_measured_reason}")


def excused_text(s: SliSummary) -> str:
    """What the run-wide count leaves to the experiments (slo/fault_impact.py)."""
    if not s.excused:
        return ""
    by = ", ".join(f"{name} {n}" for name, n in s.excused_by.items())
    return (f"; {s.excused} more inside the faults' impact windows ({s.excused_bad} bad), "
            f"judged by their experiments' RTO: {by}")


def sli_checks(specs: Specs, slis: list[SliSummary], baseline: dict[str, float]) -> list[Check]:
    g = specs.gate
    out = []
    for s in slis:
        # non-key SLIs may miss the run objective as a warning while the window budget holds
        warning = [] if s.key else [Criterion.at_least(
            budget.value_at_full_budget(s.target, s.duration_seconds, s.window_seconds))]
        message = (NO_DATA if s.total == 0 else f"{s.good}/{s.total} good"
                   + (f", burn rate {s.burn_rate:.2f}x" if s.burn_rate is not None else "")
                   ) + excused_text(s)
        check = _check(
            f"sli.{s.name}", None, f"{s.display_name} >= {s.target:g}", s.value,
            [Criterion.at_least(s.target)], warning, g.weight_sli, s.key, baseline, message,
            # missing data is not healthy where it matters; elsewhere it is reported, not scored
            missing=Status.FAIL if s.key else Status.NO_DATA,
        )
        # shown with the status, never scored: a run too small to demonstrate its targets is
        # still the pass its point estimates earn (slo/confidence.py)
        out.append(check.model_copy(update={"demonstration": s.demonstration}))
    return out


def dropped_check(specs: Specs, dropped: DroppedEvidence) -> Check:
    by_agent = ", ".join(f"{a} {n}" for a, n in dropped.by_agent.items())
    sources = f"{dropped.from_events} in evidence_dropped events" + (
        f", {dropped.from_prometheus} by the agents' drop counter"
        if dropped.from_prometheus is not None else "")
    return _check(
        "evidence.dropped", None, "no evidence dropped before delivery", float(dropped.total),
        [NONE], [Criterion.at_least(0)], specs.gate.weight_sli, False, {},
        f"{dropped.total} events dropped ({sources})" + (f": {by_agent}" if by_agent else ""),
    )


def _experiment_check(specs: Specs, e: ExperimentResult) -> Check:
    objective = "experiment completed as designed (journal completed, not deviated)"
    weight = specs.gate.weight_experiment
    if not e.measured:
        return _not_measured(f"{e.name}.experiment", e, objective, "completed", weight, False)
    message = (f"journal status {e.journal_status}" + (", deviated" if e.deviated else "")
               + (f", method activity {', '.join(e.failed_activities)} failed"
                  if e.failed_activities else ""))
    return Check(
        id=f"{e.name}.experiment", experiment=e.name, objective=objective,
        measured=None, expected="completed", weight=weight, key=False,
        status=(Status.PASS if e.experiment_ok else Status.FAIL).value,
        message=message if e.experiment_ok else f"experiment failed: {message}",
    )


def _rto_message(e: ExperimentResult) -> str:
    if e.recovery_seconds is None:
        if e.recovered_by == "goodput":
            return (f"{NO_DATA}: {', '.join(e.recovery_no_data)}" if e.recovery_no_data else
                    "goodput never back to 95 % of its level before the fault")
        if not any(s.has_data for s in e.slis if s.name not in RPO_SLIS):
            # nothing to recover on: a number here would be invented, and "fine" is not known
            return (f"{NO_DATA}: {', '.join(e.recovery_no_data) or 'no recovery SLI'} "
                    "had no data in the experiment window")
        return "never recovered within the evidence"
    text = (f"goodput back {e.recovery_seconds:.1f}s after the fault ended"
            if e.recovered_by == "goodput" else
            f"recovered {e.recovery_seconds:.1f}s after fault start")
    if e.recovery_no_data:
        text += f" (no data: {', '.join(e.recovery_no_data)})"
    return text


def _invariant_message(violations: list[str], judged: int, no_data: str | None,
                       measured: str | None = None) -> str:
    if no_data is not None:
        return f"{NO_DATA}: {no_data}"
    if not violations:
        return f"0 violations in {judged} judged" + (f": {measured}" if measured else "")
    shown = "; ".join(violations[:MAX_EXAMPLES])
    more = f" (+{len(violations) - MAX_EXAMPLES} more)" if len(violations) > MAX_EXAMPLES else ""
    return f"{len(violations)} violation(s) in {judged} judged: {shown}{more}"


def _at_most(limit: float | None) -> str:
    return "" if limit is None else str(Criterion.at_most(limit))


def experiment_checks(
    specs: Specs, e: ExperimentResult, baseline: dict[str, float]
) -> list[Check]:
    g = specs.gate
    rel = Criterion.relative_at_most(g.relative_tolerance_percent)
    x = e.name
    ro = specs.recovery_objectives.get(e.failure_class or x)
    checks = [_experiment_check(specs, e)]
    rto = f"recovered within RTO {e.rto_seconds:g}s" if e.rto_seconds else "recovered within RTO"
    rpo = [
        ("acknowledged_submissions", "acknowledged submissions lost",
         ro.rpo.acknowledged_submissions if ro else None),
        ("checkpoint_progress", "checkpoint intervals lost",
         ro.rpo.checkpoint_progress_intervals if ro else None),
        ("artifacts", "artifacts lost", ro.rpo.artifacts if ro else None),
    ]
    invariants = e.invariant_names or (ro.invariants if ro else [])
    if not e.measured:
        checks.append(_not_measured(f"{x}.rto", e, rto, _at_most(e.rto_seconds), g.weight_rto,
                                    True))
        for field, text, limit in rpo:
            objective = f"{text} <= {limit:g}" if limit is not None else text
            checks.append(_not_measured(f"{x}.rpo.{field}", e, objective, _at_most(limit),
                                        g.weight_rpo, True))
        for name in e.expected_alerts:
            checks.append(_not_measured(
                f"{x}.alert.{name}", e, f"alert {name} fires when the SLO it guards is breached",
                str(FIRED), g.weight_alert, name in g.key_alerts))
        for name in invariants:
            checks.append(_not_measured(f"{x}.invariant.{name}", e, f"invariant {name} holds",
                                        str(NONE), g.weight_invariant, True))
        return checks
    assert ro is not None and e.rto_seconds is not None  # a measured experiment has its objective
    checks.append(_check(
        f"{x}.rto", x, rto, e.recovery_seconds, [Criterion.at_most(e.rto_seconds), rel],
        [Criterion.at_most(e.rto_seconds)], g.weight_rto, True, baseline, _rto_message(e),
    ))
    checks.append(_check(
        f"{x}.rpo.acknowledged_submissions", x,
        f"acknowledged submissions lost <= {ro.rpo.acknowledged_submissions}",
        float((e.acknowledged_lost or 0) + (e.acknowledged_duplicated or 0)),
        [Criterion.at_most(ro.rpo.acknowledged_submissions)], [], g.weight_rpo, True, baseline,
        f"{e.acknowledged_lost} lost, {e.acknowledged_duplicated} duplicated"
        + (f", {e.acknowledged_matched_by_key_only} answer under a new operation id"
           if e.acknowledged_matched_by_key_only else ""),
    ))
    lost_intervals = e.checkpoint_intervals_lost
    if e.torn_checkpoints_used:
        lost_intervals = float("inf")  # a torn checkpoint used is unbounded loss
    checks.append(_check(
        f"{x}.rpo.checkpoint_progress", x,
        f"checkpoint intervals lost <= {ro.rpo.checkpoint_progress_intervals:g}", lost_intervals,
        [Criterion.at_most(ro.rpo.checkpoint_progress_intervals)], [], g.weight_rpo, True, baseline,
        f"{e.checkpoint_steps_recomputed:g} steps recomputed, "
        f"{e.torn_checkpoints_used} torn checkpoint(s) used",
    ))
    checks.append(_check(
        f"{x}.rpo.artifacts", x, f"artifacts lost <= {ro.rpo.artifacts}",
        float(e.artifacts_missing or 0), [Criterion.at_most(ro.rpo.artifacts)], [], g.weight_rpo, True,
        baseline, f"{e.artifacts_missing} reported writes or results not complete in the store",
    ))
    for a in e.alerts:
        key = a.name in g.key_alerts
        if a.no_data is not None:
            # Prometheus evidence lost (slo/telemetry.py): never a pass, never a number
            checks.append(_check(
                f"{x}.alert.{a.name}", x,
                f"alert {a.name} fires when the SLO it guards is breached", None, [FIRED, rel],
                [FIRED], g.weight_alert, key, {}, f"{NO_DATA}: {a.no_data}",
                missing=Status.FAIL if key else Status.NO_DATA,
            ))
            continue
        checks.append(_check(
            f"{x}.alert.{a.name}", x, f"alert {a.name} fires when the SLO it guards is breached",
            a.fired_after_seconds, [FIRED, rel], [FIRED], g.weight_alert, key, baseline,
            f"fired {a.fired_after_seconds:.1f}s after fault start" if a.fired
            else "silent: never fired" if a.required else f"silent, correctly: {a.note}",
            missing=Status.FAIL if a.required else Status.PASS,
        ))
    for inv in e.invariants:
        checks.append(_check(
            f"{x}.invariant.{inv.name}", x, f"invariant {inv.name} holds",
            None if inv.no_data is not None else float(len(inv.violations)), [NONE], [],
            g.weight_invariant, True, {},
            _invariant_message(inv.violations, inv.judged, inv.no_data, inv.measured),
        ))
    return checks


def build_checks(
    specs: Specs,
    slis: list[SliSummary],
    experiments: list[ExperimentResult],
    baseline: dict[str, float],
    dropped: DroppedEvidence | None = None,
) -> list[Check]:
    checks = sli_checks(specs, slis, baseline)
    if dropped is not None:
        checks.append(dropped_check(specs, dropped))
    for e in experiments:
        checks += experiment_checks(specs, e, baseline)
    return checks
