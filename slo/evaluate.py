"""`evaluate_run(run_dir, env)`: raw evidence + specs -> Verdict (I/O and orchestration only;
the math is in sli.py, budget.py and scoring.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean

from pydantic import ValidationError

from slo import budget, confidence, sli
from slo.archive import Archive, ArchiveError
from slo.baseline import IndexEntry, Tolerances, compare, recent_passing
from slo.budget_gate import BUDGET_CHECK_FILE, BudgetCheck
from slo.checks import build_checks
from slo.cost import CostSummary, inputs_from_evidence, summarize
from slo.decision import EXIT_EVIDENCE, EXIT_EXPERIMENT, EXIT_OBJECTIVE, EXIT_PASS, decide
from slo.dropped import PROM_QUERY as DROPPED_QUERY
from slo.dropped import dropped_evidence
from slo.evidence import Evidence, EvidenceError, load_evidence
from slo.experiment import evaluate_experiment, missing_experiment, owner_windows
from slo.fault_impact import ImpactWindow, Judged, excuse, impact_windows
from slo.prices import PriceError, PriceTable, load_prices
from slo.run_index import RunIndex, burn, slice_width
from slo.scoring import Scored, Status, gate_outcome
from slo.sli import Outcome, ts
from slo.specs import Budgeting, Slo, Specs, load_specs
from slo.verdict import BaselineComparison, Demonstration, ExperimentResult, SliSummary, Verdict

__all__ = [
    "EXIT_EVIDENCE",
    "EXIT_EXPERIMENT",
    "EXIT_OBJECTIVE",
    "EXIT_PASS",
    "evaluate_evidence",
    "evaluate_run",
]


def compute_outcomes(run: RunIndex) -> dict[str, list[Outcome]]:
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
            slice_width(specs.slo("queue-age"), specs),
            queue_value,
            queue_op,
        ),
        "scheduling-delay": sli.scheduling_delay(ev.attempts, delay_value, delay_op, run.snapshot),
        "startup-success": sli.startup_success(ev.attempts),
        "active-progress": sli.active_progress(
            sli.stale_intervals(ev.attempts, signals, bound, run.snapshot),
            run.start,
            run.snapshot,
            slice_width(specs.slo("active-progress"), specs),
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


def _baseline_label(comparison: BaselineComparison | None) -> str | None:
    """How the reason names the baseline: one run, or the newest of several (worst of)."""
    if comparison is None or comparison.run_id is None:
        return None
    n = len(comparison.run_ids)
    return comparison.run_id if n <= 1 else (
        f"{comparison.run_id} (each objective against the worst of the last {n} passing runs)")


def _judged(e: ExperimentResult) -> Judged:
    return Judged(e.name, e.fault_start if e.measured else None, e.rto_seconds,
                  tuple(w.name for w in e.slis),
                  e.fault_end if e.recovered_by == "goodput" else None)


def _bad_subjects(outcomes: Iterable[Outcome], limit: int = 10) -> list[str]:
    return [o.subject for o in outcomes if not o.good][:limit]


def demonstration(slo: Slo, good: int, total: int) -> Demonstration | None:
    """What an event ratio's events show about its target (slo/confidence.py). None for time
    slices (consecutive slices of one timeline are not independent trials) and without events."""
    if slo.budgeting is not Budgeting.OCCURRENCES or total == 0:
        return None
    return Demonstration(**asdict(confidence.demonstrate(good, total, slo.objective.target)))


def summarize_slis(run: RunIndex, outcomes: dict[str, list[Outcome]],
                   windows: Sequence[ImpactWindow] = ()) -> list[SliSummary]:
    """Each SLI over the run, outside the faults' impact windows (slo/fault_impact.py)."""
    duration = max(run.snapshot - run.start, 1e-9)
    out = []
    for slo in run.specs.slos:
        excused = excuse(slo.name, outcomes[slo.name], windows)
        good, total = sli.count(excused.kept)
        value = budget.sli_value(good, total)
        rate, consumed = burn(slo, value, duration)
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
                details={"bad_examples": _bad_subjects(excused.kept)},
                demonstration=demonstration(slo, good, total),
                excused=excused.count,
                excused_bad=excused.bad,
                excused_by=excused.by_experiment,
            )
        )
    return out


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


@dataclass(frozen=True)
class BaselineSource:
    """Where the baseline was looked for, the runs found (newest first; none: no passing run)
    and why."""

    archive: str
    runs: tuple[IndexEntry, ...]
    note: str


def _report_order(evidence: Evidence, present: list[str]) -> list[str]:
    """Expected experiments in run order, then any journal the suite did not name."""
    return list(dict.fromkeys([*evidence.expected, *present]))


def evaluate_evidence(
    evidence: Evidence,
    specs: Specs,
    baseline_dirs: Sequence[Path] = (),
    relative_last: int | None = None,
    baseline_source: BaselineSource | None = None,
    prices: PriceTable | PriceError | None = None,
) -> Verdict:
    run = RunIndex.of(evidence, specs)
    outcomes = compute_outcomes(run)
    owners = owner_windows(evidence.experiments, run.snapshot)
    ordered = sorted(evidence.experiments, key=lambda e: e.journal.start)
    # an experiment is judged up to the next one's start at most: the next fault's effects
    # (breaches, alerts) must never count against the experiment before it
    next_starts = [ts(e.journal.start) for e in ordered[1:]] + [float("inf")]
    judged = {
        e.name: evaluate_experiment(run, e, outcomes, owners[e.name], nxt)
        for e, nxt in zip(ordered, next_starts)
    }
    windows = impact_windows([_judged(judged[e.name]) for e in ordered], next_starts,
                             specs.gate.key_slis)
    slis = summarize_slis(run, outcomes, windows)
    # every expected experiment gets a result, with or without a journal
    experiments = [
        judged[name] if name in judged else missing_experiment(run, name)
        for name in _report_order(evidence, [e.name for e in ordered])
    ]
    # a failed drop-counter query is no cross-check, not a count of zero (slo/telemetry.py)
    drop_query = evidence.prometheus.get(DROPPED_QUERY)
    dropped = dropped_evidence(evidence.events,
                               None if drop_query is None or drop_query.error else drop_query)
    baseline, baseline_runs = _baselines(baseline_dirs, relative_last)
    checks = build_checks(specs, slis, experiments, baseline, dropped)
    gate = gate_outcome(
        [Scored(Status(c.status) if c.status else None, c.weight, c.key) for c in checks],
        specs.gate.pass_score,
        specs.gate.warning_score,
    )
    comparison = None if baseline_source is None else compare(
        checks, baseline_source.runs, baseline_source.archive, baseline_source.note,
        Tolerances(specs.gate.relative_tolerance_percent, specs.gate.baseline_tolerance_points,
                   specs.gate.baseline_tolerance_seconds))
    decision = decide(checks, experiments, gate, specs.gate.warning_score,
                      comparison.ids("regressed") if comparison else (),
                      _baseline_label(comparison))
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
        baseline=comparison,
        **run_cost(evidence, prices),
    )


def run_cost(evidence: Evidence,
             prices: PriceTable | PriceError | None) -> dict[str, CostSummary | str | None]:
    """The verdict's `cost` and `cost_error`: informational, so a price table that cannot be
    read is said (cost_error), never a changed exit code. None: the packaged table."""
    if prices is None:
        try:
            prices = load_prices()
        except PriceError as exc:
            prices = exc
    if isinstance(prices, PriceError):
        return {"cost": None, "cost_error": f"cost not computed: {prices}"}
    return {"cost": summarize(inputs_from_evidence(evidence), prices), "cost_error": None}


def prices_for(spec_dir: str | Path | None) -> PriceTable | PriceError:
    """`<spec_dir>/prices.yaml` when a spec directory has one, else the packaged table."""
    path = Path(spec_dir) / "prices.yaml" if spec_dir is not None else None
    try:
        return load_prices(path if path is not None and path.is_file() else None)
    except PriceError as exc:
        return exc


def evaluate_run(
    run_dir: str | Path,
    env: str | None = None,
    baseline_dirs: Sequence[str | Path] = (),
    relative_last: int | None = None,
    spec_dir: str | Path | None = None,
    baseline_archive: Archive | None = None,
) -> Verdict:
    """Recompute the verdict from a run directory. `env` defaults to run.json's env.
    With `baseline_archive`, every objective is compared with the last passing archived run
    of the same suite and env (slo/baseline.py). Raises EvidenceError (exit 3) or
    slo.specs.SpecError."""
    evidence = load_evidence(run_dir)
    specs = load_specs(env or evidence.run.env, spec_dir)
    source = None
    if baseline_archive is not None:
        r = evidence.run
        source = find_baseline(baseline_archive, r.run_id, r.suite, r.env, ts(r.started_at),
                               specs.gate.baseline_runs)
    verdict = evaluate_evidence(evidence, specs, [Path(d) for d in baseline_dirs],
                                relative_last, source, prices_for(spec_dir))
    check = read_budget_check(Path(run_dir))
    return verdict if check is None else verdict.model_copy(update={"budget_check": check})


def read_budget_check(run_dir: Path) -> BudgetCheck | None:
    """The budget check the runner recorded before the run (`budget-check.json`), if any."""
    path = run_dir / BUDGET_CHECK_FILE
    if not path.exists():
        return None
    try:
        return BudgetCheck.model_validate_json(path.read_text(encoding="utf-8"))
    except (ValidationError, ValueError) as exc:
        raise EvidenceError(f"{BUDGET_CHECK_FILE}: unreadable: "
                            f"{str(exc).splitlines()[0]}") from None


def find_baseline(archive: Archive, run_id: str, suite: str, env: str,
                  started_at: float, runs: int = 1) -> BaselineSource:
    """The last ``runs`` passing runs of `suite` in `env` before this one. An unreadable archive
    is no baseline, said in the note: the run's own verdict must not depend on its history."""
    try:
        entries = archive.entries()
    except ArchiveError as exc:
        return BaselineSource(archive.location, (), f"no baseline: archive unreadable: {exc}")
    found = recent_passing(entries, suite, env, run_id, started_at, runs)
    if not found:
        return BaselineSource(archive.location, (),
                              f"no passing run of suite {suite} in env {env} before this one "
                              f"in {archive.location}")
    what = ("last passing run" if len(found) == 1
            else f"worst of the last {len(found)} passing runs")
    return BaselineSource(archive.location, tuple(found), f"{what} of suite {suite} in env {env}")
