"""The one place that names the Prometheus metrics the generated rules read.

SLI documents refer to these by key as ``${key}`` placeholders in their queries, so a renamed
metric (or a different platform) is a one-line change here. The offline evaluator never uses
these names: it computes SLIs from the raw evidence files (docs/EVIDENCE.md).
"""

from __future__ import annotations

METRICS: dict[str, str] = {
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

# What counts the API's responses differs per environment, so these placeholders take their
# values from the source the environment names (`spec.rules.apiRequests` in
# slo/specs/env/<env>.yaml). A source nothing exports in an environment leaves its SLO without
# data and its SloInputAbsent alert firing for good (tests/infra/test_slo_inputs.py checks the
# cloud stacks against the monitors the Pulumi program declares).
API_REQUEST_SOURCES: dict[str, dict[str, str]] = {
    # local: HAProxy in front of the API replicas, what a client actually sees (a replica that
    # is down or refuses the connection answers 5xx through it); its health checks are not
    # responses, and its code="5xx" series exists (at 0) before the first error
    "haproxy": {
        "api_responses": "haproxy_backend_http_responses_total",
        "api_errors": 'sum(rate(${api_responses}{proxy=~".*api.*",code="5xx"}[${window}]))',
        "api_requests": 'sum(rate(${api_responses}{proxy=~".*api.*"}[${window}]))',
    },
    # EKS: the API is a ClusterIP Service, nothing in front of it exports request metrics; the
    # API's own counter (scraped through its ServiceMonitor) without the kubelet's probes and
    # Prometheus's scrapes (a /readyz 503 with the database down is no client's error). Its
    # 5xx series appear only with the first error: `or vector(0)` keeps the ratio at 0, not
    # empty, until then. It cannot see a request that never reached a pod (every replica
    # down, a connection reset) nor a client's timeout.
    "api": {
        "api_responses": "controlplane_http_requests_total",
        "api_errors": ('(sum(rate(${api_responses}{route!~"/healthz|/readyz|/metrics",'
                       'code=~"5.."}[${window}])) or vector(0))'),
        "api_requests": 'sum(rate(${api_responses}{route!~"/healthz|/readyz|/metrics"}[${window}]))',
    },
}
API_REQUEST_KEYS = frozenset(next(iter(API_REQUEST_SOURCES.values())))
assert all(set(v) == API_REQUEST_KEYS for v in API_REQUEST_SOURCES.values())

# placeholders that are label values or whole queries, not metric names (the absent-data
# rules skip them; a query's own placeholders count)
LABEL_VALUE_KEYS = frozenset({"api_errors", "api_requests", "artifact_write_ok"})
PLACEHOLDER_KEYS = frozenset(METRICS) | API_REQUEST_KEYS


def metric_values(api_requests: str) -> dict[str, str]:
    """Every placeholder's value for an environment whose API requests come from
    `api_requests` (a key of API_REQUEST_SOURCES)."""
    return {**METRICS, **API_REQUEST_SOURCES[api_requests]}
