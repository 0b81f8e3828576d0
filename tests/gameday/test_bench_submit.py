"""The submit benchmark's arithmetic (the figures it prints are measured, not tested here)."""

from __future__ import annotations

import math

import pytest

from gameday.bench_submit import cpu_ms_per, percentile_ms, submit_summary


def test_percentile_is_nearest_rank_in_milliseconds() -> None:
    xs = [i / 1000 for i in range(1, 101)]  # 1..100 ms, shuffled order must not matter
    assert percentile_ms(list(reversed(xs)), 50) == pytest.approx(50.0)  # nearest rank
    assert percentile_ms(xs, 99) == pytest.approx(99.0)
    assert percentile_ms(xs, 100) == pytest.approx(100.0)
    assert math.isnan(percentile_ms([], 99))


def test_cpu_per_submission_from_ticks() -> None:
    assert cpu_ms_per(ticks=50, hz=100, n=1000) == pytest.approx(0.5)  # 0.5 s over 1000
    assert math.isnan(cpu_ms_per(ticks=50, hz=100, n=0))


def test_summary_names_every_figure() -> None:
    lat = {"submissions_per_s": 800.0, "p50_ms": 20.0, "p95_ms": 30.0, "p99_ms": 40.0,
           "errors": 0, "rounds": 3}
    text = submit_summary({
        "saturation": {**lat, "concurrency": 32},
        "half_saturation": {**lat, "submissions_per_s": 400.0, "target_per_s": 400.0},
        "cpu_ms_per_submission": {"api": 0.6, "reconciler": 0.3, "postgres": 0.5,
                                  "client": 0.2},
        "acknowledged": 10, "acknowledged_and_committed": 9,
        "rss_mib": {"api": 60.0}, "pss_mib": {"api": 50.0},
    })
    assert "800 durable submissions/s" in text and "open loop at 400/s" in text
    assert "api 0.60, reconciler 0.30, postgres 0.50, client 0.20" in text
    assert "9 of 10 acknowledged ids" in text
