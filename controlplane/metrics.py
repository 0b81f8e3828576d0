"""Prometheus metrics of the control plane. Names are a contract with slo/ (rules read them).

Labels carry project, queue, agent and pool; operation and attempt ids go to logs and events
instead, because a label per operation would grow Prometheus without bound.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_CHILDREN: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, remembered: prometheus_client checks and converts the
    labels and takes a lock on every call, a few per cent of the API's CPU per submission
    under load (docs/performance.md). Only for metrics that are never ``clear()``ed (a cleared
    child would keep counting outside the registry); label values are bounded as the labels'
    own (route templates, methods, codes, projects, queues)."""
    key = (id(metric), labels)
    c = _CHILDREN.get(key)
    if c is None:
        c = _CHILDREN[key] = metric.labels(*labels)
    return c

HTTP_REQUESTS = Counter("controlplane_http_requests_total", "HTTP requests answered",
                        ["route", "method", "code"])
HTTP_LATENCY = Histogram("controlplane_http_request_duration_seconds", "HTTP request latency",
                         ["route", "method"],
                         buckets=(.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
SUBMISSIONS = Counter("controlplane_submissions_total", "Submissions by result",
                      ["project", "queue", "result"])  # accepted | duplicate | rejected
STALE_REPORTS = Counter("controlplane_stale_reports_total",
                        "Agent reports refused because their fencing token was stale", ["agent"])
DB_ERRORS = Counter("controlplane_db_errors_total", "Requests failed by database errors", ["route"])

ATTEMPTS_FINISHED = Counter("controlplane_attempts_finished_total", "Attempts that ended",
                            ["pool", "result", "reason"])  # result: succeeded | failed | lost
STARTUP_FAILURES = Counter("controlplane_startup_failures_total",
                           "Attempts that failed before reaching running", ["pool", "reason"])
ARTIFACT_WRITES = Counter("controlplane_artifact_writes_total",
                          "Checkpoint/artifact writes reported by workloads", ["result"])
SUBMIT_GROUP_SIZE = Histogram("controlplane_submit_group_size",
                              "Submissions committed together by one statement (group commit)",
                              buckets=(1, 2, 4, 8, 16, 32, 64, 128))
SCHEDULING_DELAY = Histogram("controlplane_scheduling_delay_seconds",
                             "Attempt dispatched -> running", ["pool"],
                             buckets=(.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300))

# reconciler
QUEUE_AGE = Gauge("controlplane_queue_age_seconds",
                  "Age of the oldest waiting (accepted/queued/blocked) operation", ["queue"])
PENDING = Gauge("controlplane_pending_operations", "Waiting operations by reason",
                ["queue", "reason"])
OPERATIONS = Gauge("controlplane_operations", "Operations by state", ["state"])
PROGRESS_STALE = Gauge("controlplane_progress_stale_operations",
                       "Running attempts without progress within the bound")
LEASE_EXPIRIES = Counter("controlplane_lease_expiries_total", "Attempt leases that expired")
RETRIES = Counter("controlplane_retries_total", "Operations moved to retrying")
REROUTES = Counter("controlplane_reroutes_total", "Operations rerouted before start")
DISPATCHES = Counter("controlplane_dispatches_total", "Attempts dispatched")
DISPATCH_FAILURES = Counter("controlplane_dispatch_failures_total",
                            "Scheduling passes that failed", ["reason"])
DISPATCH_LATENCY = Histogram("controlplane_dispatch_latency_seconds",
                             "Wait from eligible to dispatched",
                             buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300))
RECONCILER_PASSES = Counter("controlplane_reconciler_passes_total", "Reconciler passes", ["pass"])
CLOCK_OFFSET = Gauge("controlplane_reconciler_clock_offset_seconds",
                     "The reconciler's wall clock minus the database's (reported only: leases "
                     "are measured on the database's clock, controlplane/clock.py)")

# Which process serves each metric slo/ rules read on its /metrics (the
# app.kubernetes.io/component of its pods, provisioning/components/controlplane.py): the API counts
# what it answers and what agents report to it, the reconciler what its passes see; a metric
# served by both needs both scraped. provisioning/slo_inputs.py holds each cloud stack's SLO rules to
# what its monitors scrape.
SERVED_BY: dict[str, tuple[str, ...]] = {
    "controlplane_http_requests_total": ("api",),
    "controlplane_http_request_duration_seconds": ("api",),
    "controlplane_submissions_total": ("api",),
    "controlplane_stale_reports_total": ("api",),
    "controlplane_attempts_finished_total": ("api", "reconciler"),  # lost: the reconciler
    "controlplane_startup_failures_total": ("api",),
    "controlplane_artifact_writes_total": ("api",),
    "controlplane_scheduling_delay_seconds": ("api",),
    "controlplane_queue_age_seconds": ("reconciler",),
    "controlplane_pending_operations": ("reconciler",),
    "controlplane_operations": ("reconciler",),
    "controlplane_progress_stale_operations": ("reconciler",),
    "controlplane_lease_expiries_total": ("reconciler",),
    "controlplane_retries_total": ("reconciler",),
    "controlplane_dispatch_latency_seconds": ("reconciler",),
}
