"""The pure figures of `gameday bench runtime` (no processes started)."""

from __future__ import annotations

import math

import pytest

from gameday.bench_runtime import (
    cpu_split,
    latency_summary,
    machine_busy_percent,
    median_figures,
    per_attempt_ms,
    percentile,
)


def test_percentile_is_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]  # 1..100, shuffled order must not matter
    xs.reverse()
    assert (percentile(xs, 50), percentile(xs, 95), percentile(xs, 99)) == (50.0, 95.0, 99.0)
    assert percentile(xs, 100) == 100.0
    assert percentile([0.3], 99) == 0.3
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="in \\(0, 100\\]"):
        percentile(xs, 0)


def test_latency_summary_in_ms() -> None:
    s = latency_summary([0.1] * 90 + [2.0] * 10)
    assert s == {"n": 100, "p50_ms": 100.0, "p95_ms": 2000.0, "p99_ms": 2000.0}


def test_cpu_split_counts_reaped_children_and_the_whole_tree_once() -> None:
    # pid: (ppid, own, reaped). Agent 10 reaped plain workloads worth 7; its warm parent 11
    # reaped forked children worth 40 and has a live child 12 (own 3) with a live child 13.
    stats = {1: (0, 999, 999), 10: (1, 50, 7), 11: (10, 5, 40), 12: (11, 3, 0),
             13: (12, 2, 0), 20: (1, 30, 0), 21: (20, 4, 1), 99: (1, 1000, 0)}
    assert cpu_split(stats, [10]) == (50, 7 + 5 + 40 + 3 + 2)
    assert cpu_split(stats, [10, 20]) == (80, 57 + 5)
    assert cpu_split(stats, [404]) == (0, 0)  # an agent that is gone counts nothing


def test_per_attempt_ms() -> None:
    assert per_attempt_ms(250, 100, 50) == 50.0  # 2.5 s over 50 attempts
    assert math.isnan(per_attempt_ms(10, 100, 0))


def test_median_figures_nested_and_missing_keys() -> None:
    rounds = [{"a": 1, "m": "x", "q": {"p95": 10, "n": 3}, "states": {"succeeded": 5}},
              {"a": 5, "m": "y", "q": {"p95": 30, "n": 3}, "states": {"succeeded": 4, "failed": 1}},
              {"a": 3, "m": "z", "q": {"p95": 20, "n": 3}, "states": {"succeeded": 5}}]
    out = median_figures(rounds)
    assert out == {"a": 3, "m": "x", "q": {"p95": 20, "n": 3},
                   "states": {"succeeded": 5, "failed": 1}}


def test_machine_busy_percent_from_proc_stat_lines() -> None:
    # user nice system idle iowait irq softirq steal: 300 busy + 100 idle/iowait ticks
    before = [100, 0, 50, 1000, 10, 0, 0, 0]
    after = [300, 0, 150, 1080, 30, 0, 0, 0]
    assert machine_busy_percent(before, after) == 75.0
    assert math.isnan(machine_busy_percent(before, before))


def test_requests_by_route_sums_codes_per_method_and_route() -> None:
    from gameday.bench_runtime import requests_by_route

    lines = [
        "# HELP controlplane_http_requests_total HTTP requests answered",
        'controlplane_http_requests_total{route="/v1/agents/{agent_id}/claim",method="POST",code="200"} 7.0',
        'controlplane_http_requests_total{route="/v1/agents/{agent_id}/claim",method="POST",code="503"} 1.0',
        'controlplane_http_requests_total{route="/metrics",method="GET",code="200"} 2.0',
        'controlplane_http_request_duration_seconds_count{route="/metrics",method="GET"} 2.0',
    ]
    text = "\n".join(lines)
    assert requests_by_route(text) == {"POST /v1/agents/{agent_id}/claim": 8.0,
                                       "GET /metrics": 2.0}
