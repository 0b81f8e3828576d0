"""A cloud run records the API's requests from the metric the cloud SLO rules read, not
HAProxy's (which exists only locally); the local query is unchanged."""

from __future__ import annotations

import re

from environments.cloud.env import KNOWN_GAPS as CLOUD_GAPS
from environments.cloud.env import PROMETHEUS_QUERIES
from gameday.run_evidence import PROM_QUERIES

CLOUD_PROM_QUERIES = {k: q for k, q in {**PROM_QUERIES, **PROMETHEUS_QUERIES}.items()
                      if q is not None}  # as gameday/run_evidence.py merges them
from slo.metrics import API_REQUEST_SOURCES
from slo.specs import load_specs


def test_cloud_api_requests_read_what_the_cloud_rules_read() -> None:
    query = CLOUD_PROM_QUERIES["api_requests"]
    for env in ("dev", "staging", "prod"):
        source = API_REQUEST_SOURCES[load_specs(env).rules.api_requests]
        assert source["api_responses"] in query, env
        matchers = re.search(r"\}\{([^}]*)\}", source["api_requests"])
        assert matchers and "{" + matchers.group(1) + "}" in query, env
    assert "haproxy" not in query
    assert "prometheus/api_requests.json" not in CLOUD_GAPS


def test_local_api_requests_still_read_haproxy() -> None:
    assert PROM_QUERIES["api_requests"] == (
        "sum by (code) (rate(haproxy_backend_http_responses_total[30s]))")
    assert {k: v for k, v in CLOUD_PROM_QUERIES.items() if k != "api_requests"} == {
        k: v for k, v in PROM_QUERIES.items() if k != "api_requests"}
