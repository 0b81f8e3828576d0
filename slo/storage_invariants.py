"""Invariants of the database storage classes (pure; registered in slo/invariants.py).

* ``bounded-latency``: a slow disk makes the API slow, not unusable: the p99 of API request
  latency while the fault lasts stays within ``MAX_P99_SECONDS``.
* ``no-failover`` / ``at-most-one-failover``: database promotions while a storage fault lasts
  (and until the records that follow it: ``clear_disk`` records the cluster once it settled),
  counted as increments of the Patroni timeline that the fault's records carry
  (``details.cluster.timeline``, environments/local/disk_faults.py). A slow disk is not a dead one:
  failing over from it, or back and forth (flapping), is a failure of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from slo.evidence import FaultRecord, RequestRecord
from slo.invariant_result import InvariantResult, fault_spans
from slo.sli import NON_API_ROUTE_PREFIXES, ts

# the API's p99 while a disk is slow: a commit waits for the WAL write and flush (hundreds of
# ms on a slow disk), and must still be answered well inside a client's 5 s request timeout
MAX_P99_SECONDS = 2.0


def p99(values: Sequence[float]) -> float:
    """Nearest-rank 99th percentile of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def bounded_latency(requests: Iterable[RequestRecord], faults: Iterable[FaultRecord],
                    start: float, end: float,
                    limit: float = MAX_P99_SECONDS) -> InvariantResult:
    """p99 of the latency of every API request that started while a fault of the window
    lasted is at most ``limit`` seconds (failed requests count with the time they took)."""
    spans = fault_spans(faults, start, end)
    if not spans:
        return InvariantResult("bounded-latency", 0, no_data="no fault_start in the window")
    seconds = [r.latency_ms / 1000.0 for r in requests
               if not r.route.startswith(NON_API_ROUTE_PREFIXES)
               and any(lo <= ts(r.time) <= hi for _, lo, hi in spans)]
    names = ", ".join(n for n, _, _ in spans)
    if not seconds:
        return InvariantResult("bounded-latency", 0,
                               no_data=f"no API request while the fault lasted ({names})")
    value = p99(seconds)
    measured = f"p99 {value:.2f} s over {len(seconds)} requests (at most {limit:g} s)"
    text = f"API p99 {value:.2f} s over {len(seconds)} requests during {names}"
    violations = (f"{text} (at most {limit:g} s)",) if value > limit else ()
    return InvariantResult("bounded-latency", len(seconds), violations, measured=measured)


def _cluster(record: FaultRecord) -> tuple[int | None, str | None]:
    cluster = record.details.get("cluster")
    if not isinstance(cluster, dict):
        return None, None
    timeline, leader = cluster.get("timeline"), cluster.get("leader")
    return (timeline if isinstance(timeline, int) and not isinstance(timeline, bool) else None,
            leader if isinstance(leader, str) else None)


def promotions(faults: Iterable[FaultRecord], start: float, end: float, limit: int,
               name: str) -> InvariantResult:
    """At most ``limit`` database promotions for each fault started in [start, end] whose
    records carry the cluster: timeline at its start against the highest timeline of its
    later records up to ``end`` (or up to the same fault's next start)."""
    ordered = sorted(faults, key=lambda f: ts(f.time))
    judged, violations, measured, why = 0, [], [], []
    for i, f in enumerate(ordered):
        if f.event != "fault_start" or not start <= ts(f.time) <= end or "cluster" not in f.details:
            continue
        first, leader = _cluster(f)
        when = f.time.strftime("%H:%M:%S")
        later = []
        for g in ordered[i + 1:]:
            if ts(g.time) > end or (g.fault, g.target) == (f.fault, f.target) and \
                    g.event == "fault_start":
                break
            if (g.fault, g.target) == (f.fault, f.target):
                later.append(_cluster(g))
        timelines = [t for t, _ in later if t is not None]
        if first is None or not timelines:
            why.append(f"{f.fault} on {f.target} at {when}: no database timeline recorded "
                       f"{'at its start' if first is None else 'after it'}")
            continue
        judged += 1
        leaders = [x for x in [leader, *(lead for _, lead in later)] if x]
        path = " -> ".join(x for j, x in enumerate(leaders) if j == 0 or x != leaders[j - 1])
        count = max(timelines) - first
        text = (f"{f.fault} on {f.target} at {when}: {count} promotion(s) (timeline {first} -> "
                f"{max(timelines)}; leader {path or 'unknown'})")
        measured.append(text)
        if count > limit:
            violations.append(f"{text}, at most {limit} allowed")
    if not judged:
        return InvariantResult(name, 0, no_data="; ".join(why) or (
            "no fault in the window recorded the database cluster (storage faults do)"))
    return InvariantResult(name, judged, tuple(violations), measured="; ".join(measured))
