"""The evidence of one run indexed once, and the spec arithmetic every evaluation step shares
(slice widths, how long an experiment must be observed, burn of one SLI value)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slo import budget, sli
from slo.evidence import Event, Evidence
from slo.sli import ts
from slo.specs import Slo, Specs
from slo.specs.model import Budgeting


@dataclass
class RunIndex:
    """Evidence indexed once for all computations."""

    evidence: Evidence
    specs: Specs
    start: float
    snapshot: float
    events_by_op: dict[str, list[Event]]
    index: sli.ObjectIndex
    attempt_numbers: dict[str, int]

    @classmethod
    def of(cls, evidence: Evidence, specs: Specs) -> RunIndex:
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


def slice_width(slo: Slo, specs: Specs) -> float:
    return slo.objective.time_slice_window_seconds or specs.evaluation.time_slice_seconds


def observation_seconds(specs: Specs, slo_names: Iterable[str]) -> float:
    """How long after an experiment's work has drained its SLIs need to show a recovery that
    holds: a time-slice SLI's last bad outcome can land one slice later, the ratio needs one
    sample window to clear, then ``recoveryHoldSamples`` samples on the sampling grid must hold.
    The runner waits this long after each experiment; the evaluator looks at least this far."""
    ev = specs.evaluation
    slices = [slice_width(specs.slo(n), specs) for n in slo_names
              if specs.slo(n).budgeting is Budgeting.TIMESLICES]
    return (max(slices, default=0.0) + ev.sample_window_seconds
            + ev.recovery_hold_samples * ev.sample_interval_seconds)


def burn(slo: Slo, value: float | None, duration: float) -> tuple[float | None, float | None]:
    """(burn rate, share of the SLO window's budget consumed) of `value` held for `duration`."""
    if value is None:
        return None, None
    rate = budget.burn_rate(1.0 - value, slo.objective.target)
    return rate, budget.budget_consumed(rate, duration, slo.window_seconds)
