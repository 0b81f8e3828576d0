"""Offered load, goodput and tail latency over one experiment, and how long goodput took to
come back after the fault (the trigger) was removed. Pure: request records in, figures out.

A trigger that is gone while the system stays down is a metastable failure (Bronson et al.,
HotOS 2021): the question after a gray fault is not only "did it recover" but "how long after
the trigger ended did useful work come back". Here:

* offered: every API request the load sent in a bucket (retries included), per second;
* goodput: submissions acknowledged (200/201 on ``POST /v1/operations``) per second;
* p99: of the answered requests of the bucket (ms);
* goodput before: mean goodput over ``window`` seconds before the fault started;
* recovery after the trigger: the first moment at or after the fault's end from which mean
  goodput over ``window`` seconds is at least ``share`` of the goodput before (0 when it
  never fell below); None when it never came back within the evidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slo.evidence import RequestRecord
from slo.sli import NON_API_ROUTE_PREFIXES, ts

SUBMIT_ROUTE = "/v1/operations"
RECOVERED_SHARE = 0.95


@dataclass(frozen=True)
class LoadPoint:
    t: float  # bucket start, epoch seconds
    offered: float  # requests/s
    goodput: float  # acknowledged submissions/s
    p99_ms: float | None  # of the answered requests; None when none was answered


@dataclass(frozen=True)
class GoodputRecovery:
    before: float | None  # mean goodput over the window before the trigger, per second
    during: float | None  # mean goodput while the trigger lasted
    seconds_after_trigger: float | None  # None: never back within the evidence


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def is_ack(r: RequestRecord) -> bool:
    return r.method == "POST" and r.route == SUBMIT_ROUTE and r.status in (200, 201)


def load_points(requests: Sequence[RequestRecord], start: float, end: float,
                step: float = 2.0) -> list[LoadPoint]:
    """Buckets of ``step`` seconds from ``start`` to ``end`` (by the request's send time)."""
    if end <= start or step <= 0:
        return []
    n = math.ceil((end - start) / step)
    sent = [0] * n
    acked = [0] * n
    latencies: list[list[float]] = [[] for _ in range(n)]
    for r in requests:
        if r.route.startswith(NON_API_ROUTE_PREFIXES):
            continue
        i = int((ts(r.time) - start) // step)
        if not 0 <= i < n:
            continue
        sent[i] += 1
        acked[i] += is_ack(r)
        if r.status is not None:
            latencies[i].append(r.latency_ms)
    return [LoadPoint(start + i * step, sent[i] / step, acked[i] / step, _p99(latencies[i]))
            for i in range(n)]


def _mean_goodput(points: Sequence[LoadPoint], lo: float, hi: float) -> float | None:
    inside = [p.goodput for p in points if lo <= p.t < hi]
    return sum(inside) / len(inside) if inside else None


def goodput_recovery(points: Sequence[LoadPoint], trigger_start: float, trigger_end: float,
                     window: float = 10.0, share: float = RECOVERED_SHARE) -> GoodputRecovery:
    before = _mean_goodput(points, trigger_start - window, trigger_start)
    during = _mean_goodput(points, trigger_start, max(trigger_end, trigger_start + 1e-9))
    if not before:
        return GoodputRecovery(before, during, None)
    last = points[-1].t if points else trigger_end
    for p in points:
        if p.t < trigger_end - 1e-9 or p.t + window > last + 1e-9:
            continue
        mean = _mean_goodput(points, p.t, p.t + window)
        if mean is not None and mean >= share * before:
            return GoodputRecovery(before, during, max(0.0, p.t - trigger_end))
    return GoodputRecovery(before, during, None)
