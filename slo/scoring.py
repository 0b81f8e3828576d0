"""Keptn-style gate scoring (pure): typed criteria, per-check status, weighted total.

A check passes when all its pass criteria hold, else is a warning when all its warning
criteria hold, else fails. Score = weighted mean of pass 1 / warning 0.5 / fail 0, in percent,
over those three statuses only. `not_measured` (the experiment did not run as designed) and
`no_data` (a non-key SLI without events) are reported, never scored: a number for them would be
invented. A failed key check fails the gate whatever the score, and a key check without any
status counts as failed: missing data is not healthy.

A ratio objective met by its point estimate but not demonstrated by its events at 95 %
(slo/confidence.py, "consistent, not demonstrated") is scored here as the pass it is: the
statistics are shown next to the status in every output, they never move the score or the
exit code (a small run would otherwise fail for being small).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    PASS = "pass"
    WARNING = "warning"
    FAIL = "fail"
    NOT_MEASURED = "not_measured"
    NO_DATA = "no_data"

    @property
    def scored(self) -> bool:
        return self in _SCORES

    @property
    def score(self) -> float:
        return _SCORES[self]


_SCORES = {Status.PASS: 1.0, Status.WARNING: 0.5, Status.FAIL: 0.0}


_OPS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "=": lambda a, b: a == b,
}
_CRITERION = re.compile(
    r"^\s*(<=|>=|<|>|=)\s*([+-]?)(\d+(?:\.\d+)?(?:e[+-]?\d+)?)(%?)\s*$", re.IGNORECASE
)


@dataclass(frozen=True)
class Criterion:
    """`<=600` (absolute) or `<=+10%` (relative to a baseline: at most 10% above it).

    Built typed by the checks (`Criterion.at_most(rto)`); `parse` reads the same text back
    for criteria a person writes. The amount keeps its type so the text shows it as given
    (an RTO of 60.0 reads `<=60.0`, a count of 0 reads `<=0`)."""

    op: str
    amount: float  # an int stays an int, so it reads as given
    relative: bool = False

    @classmethod
    def at_most(cls, amount: float) -> Criterion:
        return cls("<=", amount)

    @classmethod
    def at_least(cls, amount: float) -> Criterion:
        return cls(">=", amount)

    @classmethod
    def relative_at_most(cls, percent: float) -> Criterion:
        """At most `percent` % above the baseline (no baseline: does not apply)."""
        return cls("<=", percent, relative=True)

    @classmethod
    def parse(cls, text: str) -> Criterion:
        match = _CRITERION.match(text)
        if not match:
            raise ValueError(f"not a criterion: {text!r} (e.g. '<=600', '>=0.999', '<=+10%')")
        op, sign, number, percent = match.groups()
        amount: float = int(number) if number.isdigit() else float(number)
        amount = -amount if sign == "-" else amount
        if bool(sign) != bool(percent):
            raise ValueError(f"relative criteria need a sign and a percent: {text!r}")
        return cls(op, amount, bool(percent))

    def holds(self, value: float, baseline: float | None) -> bool | None:
        """None when relative and there is no baseline (the criterion does not apply)."""
        if not self.relative:
            return _OPS[self.op](value, self.amount)
        if baseline is None:
            return None
        return _OPS[self.op](value, baseline + abs(baseline) * self.amount / 100.0)

    def __str__(self) -> str:
        if self.relative:
            return f"{self.op}{'+' if self.amount >= 0 else ''}{self.amount:g}%"
        return f"{self.op}{self.amount!r}"


def criteria_text(criteria: Iterable[Criterion]) -> str:
    """How a check's criteria read in every output (`<=60.0 and <=+10%`)."""
    return " and ".join(str(c) for c in criteria)


def _all_hold(criteria: Iterable[Criterion], value: float, baseline: float | None) -> bool:
    results = [c.holds(value, baseline) for c in criteria]
    return all(r is not False for r in results)


def check_status(
    value: float | None,
    pass_criteria: Iterable[Criterion],
    warning_criteria: Iterable[Criterion] = (),
    baseline: float | None = None,
) -> Status | None:
    if value is None:
        return None
    if _all_hold(pass_criteria, value, baseline):
        return Status.PASS
    warning = list(warning_criteria)
    if warning and _all_hold(warning, value, baseline):
        return Status.WARNING
    return Status.FAIL


@dataclass(frozen=True)
class Scored:
    status: Status | None
    weight: float
    key: bool


@dataclass(frozen=True)
class GateOutcome:
    status: Status
    score: float | None
    key_failed: bool
    scored: int = 0  # checks the score is taken over (pass, warning or fail)


def effective_status(check: Scored) -> Status:
    """A key check that carries no status is a failure (fail closed); a non-key one is no data."""
    if check.status is None:
        return Status.FAIL if check.key else Status.NO_DATA
    return check.status


def gate_outcome(checks: Iterable[Scored], pass_score: float, warning_score: float) -> GateOutcome:
    items = [(effective_status(c), c) for c in checks]
    items = [(s, c) for s, c in items if s.scored]
    key_failed = any(c.key and s is Status.FAIL for s, c in items)
    total_weight = sum(c.weight for _, c in items)
    if total_weight <= 0:
        # nothing measurable: a gate with no evidence must not pass
        return GateOutcome(Status.FAIL, None, key_failed, len(items))
    raw = 100.0 * sum(c.weight * s.score for s, c in items) / total_weight
    score = round(raw, 6)  # 89.9999999 must not fail a 90 threshold
    if key_failed or score < warning_score:
        status = Status.FAIL
    elif score < pass_score:
        status = Status.WARNING
    else:
        status = Status.PASS
    return GateOutcome(status, score, key_failed, len(items))
