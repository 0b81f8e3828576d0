"""What every invariant returns, and the fault spans most of them are scoped by (pure). Its own
module so the invariant modules and their registry (slo/invariants.py) import it without
importing each other."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slo.evidence import FaultRecord
from slo.sli import ts


@dataclass(frozen=True)
class InvariantResult:
    name: str
    judged: int  # subjects judged (attempts or operations)
    violations: tuple[str, ...] = ()
    no_data: str | None = None  # why there was nothing to judge
    measured: str | None = None  # what was measured, shown beside a pass too (e.g. "0.7x")


def fault_spans(faults: Iterable[FaultRecord], start: float, end: float) -> list[
        tuple[str, float, float]]:
    """(fault, start, end) of every fault started in [start, end]; one never ended lasts
    until ``end``."""
    faults = sorted(faults, key=lambda f: ts(f.time))
    spans = []
    for f in faults:
        t = ts(f.time)
        if f.event != "fault_start" or not start <= t <= end:
            continue
        stop = next((ts(g.time) for g in faults if g.event == "fault_end" and g.fault == f.fault
                     and g.target == f.target and ts(g.time) >= t), end)
        spans.append((f"{f.fault} {f.target}".strip(), t, min(stop, end)))
    return spans
