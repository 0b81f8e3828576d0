"""The SLO rules each cloud stack deploys read only metrics something in that stack exports:
a component that serves them (controlplane.metrics.SERVED_BY) scraped by a monitor the
program declares (issue 49 item 4: the HAProxy metric read in EKS, where no HAProxy exists)."""

from __future__ import annotations

import pytest

from controlplane.metrics import SERVED_BY
from provisioning.slo_inputs import rule_inputs, scraped_components, series_read, unexported
from tests.infra.harness import Run

STACKS = ("dev", "staging", "prod")


def _objects(run: Run) -> list[dict]:
    return [r.props for r in run.k8s_objects()]


def _rules(run: Run) -> dict:
    rule = next(r for r in run.k8s_objects() if r.props["kind"] == "PrometheusRule")
    return {"groups": rule.props["spec"]["groups"]}


@pytest.mark.parametrize("stack", STACKS)
def test_rules_read_only_metrics_the_stack_exports(runs: dict[str, Run], stack: str) -> None:
    run = runs[stack]
    assert unexported(_rules(run), _objects(run), SERVED_BY) == []
    # and the check is not vacuous: the API's request counter is among what they read
    assert "controlplane_http_requests_total" in rule_inputs(_rules(run))


@pytest.mark.parametrize("stack", STACKS)
def test_the_monitors_scrape_api_and_reconciler(runs: dict[str, Run], stack: str) -> None:
    assert {"api", "reconciler"} <= scraped_components(_objects(runs[stack]))


def test_a_metric_nothing_serves_is_named_with_its_readers(runs: dict[str, Run]) -> None:
    run = runs["dev"]
    rules = {"groups": [*_rules(run)["groups"], {"name": "x", "rules": [
        {"record": "r:haproxy", "expr": 'sum(rate(haproxy_backend_http_responses_total'
                                        '{code="5xx"}[5m]))'}]}]}
    problems = unexported(rules, _objects(run), SERVED_BY)
    assert problems == [("haproxy_backend_http_responses_total (read by r:haproxy): nothing "
                         "in the stack serves it")]


def test_a_component_no_monitor_scrapes_is_named(runs: dict[str, Run]) -> None:
    run = runs["dev"]
    objects = [o for o in _objects(run) if o["kind"] != "ServiceMonitor"]
    problems = unexported(_rules(run), objects, SERVED_BY)
    assert problems and all("served by api" in p for p in problems)
    assert any(p.startswith("controlplane_http_requests_total") for p in problems)


def test_a_monitor_on_a_port_the_service_lacks_scrapes_nothing(runs: dict[str, Run]) -> None:
    objects = _objects(runs["dev"])
    mangled = [{**o, "spec": {**o["spec"], "endpoints": [{"port": "metrics"}]}}
               if o["kind"] == "ServiceMonitor" else o for o in objects]
    assert "api" not in scraped_components(mangled)


def test_series_read_knows_functions_keywords_and_name_matchers() -> None:
    expr = ('max by (job) (up) == 0\nand on (job)\ngroup by (job) (last_over_time('
            '{__name__=~"a_total|b\\\\_c"}[1h])) or sum(rate(x_total{code=~"5.."}[5m])) '
            '/ 1e3 > bool slo:ratio{slo="a"}')
    assert series_read(expr) == {"up", "a_total", "b_c", "x_total", "slo:ratio"}
