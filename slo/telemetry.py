"""Which evidence each objective is computed from, and whether the Prometheus evidence of an
experiment's window was lost (pure: no I/O).

Every SLI is computed offline from files the harness writes itself (requests.jsonl,
ledger.jsonl, the store snapshot, faults.jsonl); only the alert objectives read Prometheus
(prometheus/alerts.json, a query_range of ALERTS). When Prometheus, or its scrape path, was lost
during an experiment, the objectives that depend on it are `no data` for that experiment
(never a pass, never a number) while the others keep their measured verdict: durability is
decided by the ledger and the store snapshot, which Prometheus never touches.

Offline evidence of loss (docs/EVIDENCE.md, "Telemetry loss"):
* the collector's record of a failed query (`prometheus/<query>.json` with a non-success
  status): the whole run's Prometheus evidence for that query is lost;
* `prometheus/scrapes.json` (`SCRAPES_QUERY`): one point per step while Prometheus scraped
  anything in the last minute. A stretch without points longer than `gap_tolerance` inside an
  experiment's window means Prometheus (or every scrape) was down then. Run directories without
  the file are judged by the first rule only: no gap is invented.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slo.evidence import PromQuery

# --------------------------------------------------------------------------- declared sources

PROMETHEUS = "prometheus"  # prometheus/*.json (query_range results the collector kept)
REQUESTS = "requests"  # requests.jsonl (load generator)
LEDGER = "ledger"  # ledger.jsonl (client ack ledger)
STORE = "store"  # snapshot/*.jsonl (control-plane store, object store)
FAULTS = "faults"  # faults.jsonl (fault timeline)
JOURNAL = "journal"  # experiments/<name>/journal.json (Chaos Toolkit)

# per SLI (slo.specs.KNOWN_SLIS): none reads Prometheus (slo/evaluate.py compute_outcomes)
SLI_SOURCES: dict[str, frozenset[str]] = {
    "api-availability": frozenset({REQUESTS}),
    "submission-durability": frozenset({LEDGER, STORE}),
    "queue-age": frozenset({STORE}),
    "scheduling-delay": frozenset({STORE}),
    "startup-success": frozenset({STORE}),
    "active-progress": frozenset({STORE}),
    "artifact-write-success": frozenset({STORE}),
    "terminal-state-consistency": frozenset({STORE}),
    "time-to-usable-result": frozenset({STORE}),
}

# per objective kind: the part of a check id that names it (`<experiment>.<kind>[.<name>]`)
CHECK_SOURCES: dict[str, frozenset[str]] = {
    # journal status and deviation
    "experiment": frozenset({JOURNAL}),
    # recovery of the experiment's SLIs after the fault start
    "rto": frozenset({REQUESTS, STORE, FAULTS, JOURNAL}),
    # acknowledged submissions against the store; checkpoints and artifacts in the store
    "rpo": frozenset({LEDGER, STORE, FAULTS, JOURNAL}),
    # the alert fired in Prometheus's ALERTS series after the fault start
    "alert": frozenset({PROMETHEUS, FAULTS, JOURNAL}),
    "invariant": frozenset({STORE, FAULTS, JOURNAL}),
    # evidence_dropped events in the store; the agents' drop counter in Prometheus is a
    # cross-check read when present, never required (slo/dropped.py)
    "evidence.dropped": frozenset({STORE}),
}


def check_kind(check_id: str) -> str:
    """`sli.<name>` -> `sli`, `evidence.dropped` -> itself, `<exp>.<kind>[.x]` -> `<kind>`.
    Experiment names never contain a dot (failure-class ids)."""
    if check_id.startswith("sli.") or check_id == "evidence.dropped":
        return "sli" if check_id.startswith("sli.") else check_id
    parts = check_id.split(".")
    return parts[1] if len(parts) > 1 else check_id


def check_sources(check_id: str) -> frozenset[str]:
    """The evidence a check is computed from. KeyError for an undeclared objective kind: a new
    check must declare its sources here before it can be judged under telemetry loss."""
    if check_id.startswith("sli."):
        return SLI_SOURCES[check_id.removeprefix("sli.")]
    return CHECK_SOURCES[check_kind(check_id)]


def needs_prometheus(check_id: str) -> bool:
    return PROMETHEUS in check_sources(check_id)


# --------------------------------------------------------------------------- loss detection

ALERTS_QUERY = "alerts"  # prometheus/alerts.json: what the alert objectives read
SCRAPES_QUERY = "scrapes"  # prometheus/scrapes.json: Prometheus's own liveness
# one series with a point at every step at which Prometheus scraped any target in the last
# minute; no point = Prometheus was not running or reached no target (stopped, crashed, cut off)
SCRAPES_PROMQL = "count(count_over_time(up[1m]))"
GAP_STEPS = 3  # a stretch without points longer than this many query steps is a gap
DEFAULT_STEP = 5.0


@dataclass(frozen=True)
class TelemetryLoss:
    """Why the Prometheus evidence of a window cannot be used."""

    reason: str


def gap_tolerance(query: PromQuery) -> float:
    return GAP_STEPS * (query.step or DEFAULT_STEP)


def scrape_gaps(query: PromQuery, lo: float, hi: float) -> list[tuple[float, float]]:
    """Stretches of [lo, hi] (clipped to the query's range) without a scrape point, longer than
    the tolerance. A query with no point at all in the window is one gap over all of it."""
    if query.start is not None:
        lo = max(lo, query.start)
    if query.end is not None:
        hi = min(hi, query.end)
    if hi <= lo:
        return []
    points = sorted({t for s in query.series for t, v in s.values if v > 0 and lo <= t <= hi})
    bounds = [lo, *points, hi]
    limit = gap_tolerance(query)
    return [(a, b) for a, b in itertools.pairwise(bounds) if b - a > limit]


def telemetry_loss(prometheus: Mapping[str, PromQuery], lo: float, hi: float,
                   needed: Sequence[str] = (ALERTS_QUERY,)) -> TelemetryLoss | None:
    """Whether the Prometheus evidence for [lo, hi] is lost: a failed query the window needs,
    a failed liveness query, or a scrape gap inside the window. None: nothing says so."""
    for name in needed:
        q = prometheus.get(name)
        if q is not None and q.error is not None:
            return TelemetryLoss(f"prometheus/{name}.json: query failed: {q.error}")
    scrapes = prometheus.get(SCRAPES_QUERY)
    if scrapes is None:
        return None
    if scrapes.error is not None:
        return TelemetryLoss(f"prometheus/{SCRAPES_QUERY}.json: query failed: {scrapes.error}")
    gaps = scrape_gaps(scrapes, lo, hi)
    if not gaps:
        return None
    a, b = max(gaps, key=lambda g: g[1] - g[0])
    return TelemetryLoss(
        f"Prometheus scraped nothing for {b - a:.0f}s of the experiment window "
        f"({a - lo:.0f}s to {b - lo:.0f}s after the fault start; prometheus/{SCRAPES_QUERY}.json)"
    )
