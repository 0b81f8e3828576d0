"""Relative criteria against run history (pure): each objective of this run next to the same
objective in the last *passing* archived run of the same suite and environment.

What "worse" means depends on what the objective measures, read from its check id:

  duration  `<exp>.rto`, `<exp>.alert.*` (seconds, lower is better): regressed when more than
            `gate.relativeTolerancePercent` (default 20 %) above the baseline
  ratio     `sli.*` (a share of good events, higher is better): regressed when more than
            `gate.baselineTolerancePoints` percentage points (default 0.1) below the baseline
  count     `<exp>.rpo.*`, `<exp>.invariant.*`, `evidence.dropped` (things lost or broken,
            lower is better): regressed on any increase (nothing lost is the only good count)
  outcome   `<exp>.experiment` (no number: pass > warning > fail): regressed when the status
            is worse than the baseline's

The same tolerance decides "better": a change within it either way is "same". An objective
whose current value is missing is "not measured" and is never compared; one the baseline lacks
(no passing run, the experiment not in it, or no value there) is "no baseline", never "same".
A regression turns a passing gate into a warning (slo/decision.py); it never fails the gate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from slo.budget_gate import EXIT_SKIPPED, BudgetCheck
from slo.verdict import BaselineComparison, BaselineResult, Check, ObjectiveComparison, Verdict

ENTRY_SCHEMA = "gameday.archive/v1"
# statuses of an objective with a result, best first (outcome objectives compare these)
_RANK = {"pass": 2, "warning": 1, "fail": 0}
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Kind(str, Enum):
    DURATION = "duration"
    RATIO = "ratio"
    COUNT = "count"
    OUTCOME = "outcome"
    INTERVALS = "checkpoint intervals"


# Checkpoint progress recomputed depends on where between two checkpoints the fault lands:
# anywhere in [0, 1) interval for one kill (healthy local runs: 0 to 0.64 for zone-outage, 0.3
# to 1.0 for checkpoint-power-loss). Only a whole interval more than the baseline says that
# checkpoints were skipped or lost.
INTERVAL_SLACK = 1.0


def kind_of(check_id: str) -> Kind:
    if check_id.startswith("sli."):
        return Kind.RATIO
    if check_id.endswith(".rto") or ".alert." in check_id:
        return Kind.DURATION
    if check_id.endswith(".rpo.checkpoint_progress"):
        return Kind.INTERVALS
    if check_id.endswith(".experiment"):
        return Kind.OUTCOME
    # .rpo.*, .invariant.*, evidence.dropped and anything new that counts losses
    return Kind.COUNT


@dataclass(frozen=True)
class Tolerances:
    percent: float = 20.0  # durations: at most this much slower
    points: float = 0.1  # ratios: at most this many percentage points lower
    # durations: or at most this many seconds slower, whichever is more. A recovery measured
    # on a 5 s grid, or held back by a 30 s breaker cooldown that the fault's end may miss by
    # a fraction of a second, moves in steps no percentage of a short baseline covers
    seconds: float = 0.0


class ArchivedObjective(BaseModel):
    """One objective of an archived run, as much as a later comparison needs."""

    model_config = ConfigDict(extra="ignore")

    id: str
    experiment: str | None = None
    objective: str = ""
    measured: float | None = None
    status: str | None = None


class IndexEntry(BaseModel):
    """The index entry of one archived run (what `gameday history` lists and a baseline reads);
    the run's files are at `location`."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: str = Field(default=ENTRY_SCHEMA, alias="schema")
    run_id: str
    suite: str
    env: str
    platform: str
    started_at: float
    ended_at: float
    result: str
    exit_code: int
    score: float | None
    reason: str = ""
    archived_at: float
    location: str
    files: list[str] = Field(default_factory=list)
    baseline_run: str | None = None
    objectives: list[ArchivedObjective] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.result == "pass" and self.exit_code == 0


def check_run_id(run_id: str) -> str:
    """A run id names a directory/key in the archive: no separators, no leading dot."""
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} cannot be archived: use letters, digits, '.', '_', "
                         "'-' only, starting with a letter or digit")
    return run_id


def entry_of(verdict: Verdict, location: str, files: Sequence[str], archived_at: float) -> IndexEntry:
    return IndexEntry(
        run_id=check_run_id(verdict.run_id), suite=verdict.suite, env=verdict.env,
        platform=verdict.platform, started_at=verdict.started_at, ended_at=verdict.ended_at,
        result=verdict.result, exit_code=verdict.exit_code, score=verdict.score,
        reason=verdict.reason, archived_at=archived_at, location=location, files=list(files),
        baseline_run=verdict.baseline.run_id if verdict.baseline else None,
        objectives=[ArchivedObjective(id=c.id, experiment=c.experiment, objective=c.objective,
                                      measured=c.measured, status=c.status)
                    for c in verdict.checks],
    )


def skipped_entry(check: BudgetCheck, run_id: str, platform: str, location: str,
                  files: Sequence[str], archived_at: float) -> IndexEntry:
    """The index entry of a game day the budget check skipped: no verdict, no objectives
    (never a baseline), result `skipped` with the skip's exit code and reason."""
    return IndexEntry(
        run_id=check_run_id(run_id), suite=check.suite, env=check.env, platform=platform,
        started_at=check.checked_at, ended_at=check.checked_at, result="skipped",
        exit_code=EXIT_SKIPPED, score=None, reason=check.reason, archived_at=archived_at,
        location=location, files=list(files))


def newest_first(entries: Iterable[IndexEntry]) -> list[IndexEntry]:
    return sorted(entries, key=lambda e: (e.started_at, e.run_id), reverse=True)


def select(entries: Iterable[IndexEntry], suite: str | None = None, env: str | None = None,
           limit: int | None = None) -> list[IndexEntry]:
    out = [e for e in newest_first(entries)
           if (suite is None or e.suite == suite) and (env is None or e.env == env)]
    return out if limit is None else out[:limit]


def last_passing(entries: Iterable[IndexEntry], suite: str, env: str, run_id: str,
                 started_at: float) -> IndexEntry | None:
    """The newest passing run of `suite` in `env` that started before this one (never the run
    itself, never a later run: re-evaluating an old run compares it with what came before)."""
    runs = recent_passing(entries, suite, env, run_id, started_at, 1)
    return runs[0] if runs else None


def recent_passing(entries: Iterable[IndexEntry], suite: str, env: str, run_id: str,
                   started_at: float, n: int) -> list[IndexEntry]:
    """Up to ``n`` passing runs of `suite` in `env` that started before this one, newest
    first (the same rules as last_passing)."""
    return [e for e in select(entries, suite, env)
            if e.passed and e.run_id != run_id and e.started_at < started_at][:max(n, 0)]


def worst_of(check_id: str, past: Sequence[ArchivedObjective]) -> ArchivedObjective | None:
    """One objective over several baseline runs, as the worst any of them measured (Keptn's
    several_results with a max/min aggregate): a run regresses only when it is worse than
    every recent passing run, so one run that happened to be fast is not the bar. Durations,
    counts and intervals: the largest; ratios: the smallest; outcomes: the worst status."""
    if not past:
        return None
    kind = kind_of(check_id)
    values = [p.measured for p in past if p.measured is not None]
    measured = None
    if values:
        measured = min(values) if kind is Kind.RATIO else max(values)
    ranked = [p.status for p in past if p.status in _RANK]
    status = min(ranked, key=_RANK.__getitem__) if ranked else past[0].status
    return ArchivedObjective(id=check_id, experiment=past[0].experiment,
                             objective=past[0].objective, measured=measured, status=status)


# --------------------------------------------------------------------------- the comparison


def _pct(base: float, cur: float) -> str:
    return "" if base == 0 else f" ({(cur - base) / abs(base) * 100:+.0f}%)"


def _compare_value(kind: Kind, base: float, cur: float, tol: Tolerances) -> tuple[BaselineResult, str]:
    if math.isinf(cur) or math.isinf(base):
        if cur == base:
            return "same", "unchanged (unbounded)"
        return ("regressed", "now unbounded") if cur > base else ("better", "now bounded")
    if kind is Kind.RATIO:
        points = (cur - base) * 100.0
        change = f"{points:+.3g} points"
        if points < -tol.points - 1e-9:
            return "regressed", change
        return ("better" if points > tol.points + 1e-9 else "same"), change
    if kind is Kind.DURATION:
        change = f"{cur - base:+.1f}s{_pct(base, cur)}"
        slack = max(abs(base) * tol.percent / 100.0, tol.seconds)
        if cur > base + slack:
            return "regressed", change
        return ("better" if cur < base - slack else "same"), change
    if kind is Kind.INTERVALS:
        change = f"{cur - base:+.2g} intervals"
        if cur > base + INTERVAL_SLACK + 1e-9:
            return "regressed", change
        return ("better" if cur < base - INTERVAL_SLACK - 1e-9 else "same"), change
    change = f"{cur - base:+g}"  # counts: nothing lost is the only good count
    if cur > base:
        return "regressed", change
    return ("better" if cur < base else "same"), change


def compare_objective(check: Check, past: ArchivedObjective | None,
                      tol: Tolerances) -> ObjectiveComparison:
    kind = kind_of(check.id)
    base = past.measured if past is not None else None
    current = check.measured

    def row(result: BaselineResult, change: str) -> ObjectiveComparison:
        return ObjectiveComparison(id=check.id, experiment=check.experiment,
                                   objective=check.objective, kind=kind.value, baseline=base,
                                   current=current, change=change, result=result,
                                   baseline_status=past.status if past is not None else None,
                                   current_status=check.status)

    if kind is Kind.OUTCOME:
        if check.status not in _RANK:
            return row("not measured", f"not measured this run ({check.status or 'no status'})")
        if past is None or past.status not in _RANK:
            return row("no baseline", "not in the baseline run")
        b, c = _RANK[past.status], _RANK[check.status]
        change = "unchanged" if b == c else f"{past.status} -> {check.status}"
        return row("regressed" if c < b else "better" if c > b else "same", change)
    if current is None or check.status in ("not_measured", "no_data"):
        # a value that was not measured is never compared as if it were
        status = (check.status or "no status").replace("_", " ")
        return row("not measured", f"no value to compare this run (status {status})")
    if past is None:
        return row("no baseline", "not in the baseline run")
    if base is None:
        return row("no baseline", "no value in the baseline run")
    result, change = _compare_value(kind, base, current, tol)
    return row(result, change)


def compare(checks: Sequence[Check], runs: Sequence[IndexEntry], archive: str, note: str,
            tol: Tolerances) -> BaselineComparison:
    """Every check of this run against the baseline runs, newest first (none: no passing run
    to compare with), each objective against the worst of them (worst_of)."""
    by_id: dict[str, list[ArchivedObjective]] = {}
    for entry in runs:
        for o in entry.objectives:
            by_id.setdefault(o.id, []).append(o)
    rows = [compare_objective(c, worst_of(c.id, by_id.get(c.id, [])), tol) for c in checks]
    if not runs:  # say why there is nothing to compare with
        rows = [r.model_copy(update={"change": note}) if r.result == "no baseline" else r
                for r in rows]
    newest = runs[0] if runs else None
    return BaselineComparison(
        archive=archive, run_id=newest.run_id if newest else None,
        run_ids=[e.run_id for e in runs],
        started_at=newest.started_at if newest else None, note=note,
        tolerance_percent=tol.percent, tolerance_points=tol.points,
        tolerance_seconds=tol.seconds, objectives=rows)
