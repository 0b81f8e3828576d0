"""What an injected fault may cost the run-wide SLIs, and what it may not.

A game day breaks things on purpose, and some SLIs are designed to burn while it does:
node-pool-exhausted makes work wait (queue age), registry-failure makes starts fail (startup
success), a replica cut off from the database answers a few requests with errors until the load
balancer takes it out (API availability). Each of those outcomes is already judged by its own
experiment: the SLIs an experiment declares (its `slos`) must be back within its RTO, or the
experiment fails. Counting them a second time in the run-wide objective made two healthy runs
of identical code miss queue age, startup success and API availability.

So the run-wide SLIs count what happened outside each fault's impact window: for every SLI an
experiment declares, from its fault's start until its RTO has passed (never into the next
experiment). What a fault costs after its RTO, and what it costs an SLI it does not declare,
still counts against the run. Key SLIs are never excused: no fault may lose acknowledged work,
whatever it is designed to cost. Pure functions; the verdict shows both counts."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from slo.sli import Outcome


@dataclass(frozen=True)
class ImpactWindow:
    experiment: str
    sli: str
    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t <= self.end


@dataclass(frozen=True)
class Judged:
    """The part of an experiment's result the windows need (slo.verdict.ExperimentResult)."""

    name: str
    fault_start: float | None  # None: not measured, nothing excused
    rto_seconds: float | None
    slis: tuple[str, ...]
    # where the RTO counts from: the fault's start, or its end for an objective judged on
    # goodput after the trigger (overload-metastability)
    rto_from: float | None = None


def impact_windows(experiments: Sequence[Judged], next_starts: Sequence[float],
                   key_slis: Collection[str]) -> list[ImpactWindow]:
    """One window per (experiment, declared non-key SLI): [fault start, RTO passed], cut at
    the next experiment's start (its own fault is its own business)."""
    out = []
    for e, nxt in zip(experiments, next_starts, strict=True):
        if e.fault_start is None or e.rto_seconds is None:
            continue
        origin = e.fault_start if e.rto_from is None else e.rto_from
        end = min(origin + e.rto_seconds, nxt)
        out += [ImpactWindow(e.name, name, e.fault_start, end)
                for name in dict.fromkeys(e.slis) if name not in key_slis]
    return out


@dataclass(frozen=True)
class Excused:
    kept: list[Outcome]
    by_experiment: dict[str, int]  # outcomes inside each experiment's window, good or bad
    bad: int = 0  # of those, the bad ones

    @property
    def count(self) -> int:
        return sum(self.by_experiment.values())


def excuse(name: str, outcomes: Sequence[Outcome], windows: Sequence[ImpactWindow]) -> Excused:
    """Split one SLI's outcomes: those inside a window of this SLI (attributed to the first
    experiment whose window holds them) and the rest, which the run-wide objective judges."""
    mine = [w for w in windows if w.sli == name]
    kept: list[Outcome] = []
    by: dict[str, int] = {}
    bad = 0
    for o in outcomes:
        w = next((w for w in mine if w.holds(o.time)), None)
        if w is None:
            kept.append(o)
        else:
            by[w.experiment] = by.get(w.experiment, 0) + 1
            bad += not o.good
    return Excused(kept, by, bad)
