"""The one place that names the Prometheus metrics the generated rules read.

SLI documents refer to these by key as ``${key}`` placeholders in their queries, so a renamed
metric (or a different platform) is a one-line change here. The offline evaluator never uses
these names: it computes SLIs from the raw evidence files (docs/EVIDENCE.md).
"""

from __future__ import annotations

METRICS: dict[str, str] = {
    # load balancer in front of the API replicas: what a client actually sees
    "haproxy_responses": "haproxy_backend_http_responses_total",
    "api_backend_regex": ".*api.*",
    "http_requests": "controlplane_http_requests_total",
    "submissions": "controlplane_submissions_total",
    "queue_age": "controlplane_queue_age_seconds",
    "pending_operations": "controlplane_pending_operations",
    "lease_expiries": "controlplane_lease_expiries_total",
    "stale_reports": "controlplane_stale_reports_total",
    "retries": "controlplane_retries_total",
    "attempts_finished": "controlplane_attempts_finished_total",
    "startup_failures": "controlplane_startup_failures_total",
    "artifact_writes": "controlplane_artifact_writes_total",
    # label value of controlplane_artifact_writes_total{result} that means "written and verified"
    "artifact_write_ok": "ok",
    "progress_stale": "controlplane_progress_stale_operations",
    "operations": "controlplane_operations",
    "dispatch_latency": "controlplane_dispatch_latency_seconds",
    "scheduling_delay": "controlplane_scheduling_delay_seconds",
}

# keys above that are label values, not metric names (the absent-data rules skip them)
LABEL_VALUE_KEYS = frozenset({"api_backend_regex", "artifact_write_ok"})
