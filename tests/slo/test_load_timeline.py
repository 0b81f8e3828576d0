"""The load around a fault (slo/load_timeline.py): offered, goodput, p99 per bucket, and how
long after the trigger ended goodput was back to 95 % of before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from slo.charts import goodput_text, load_svg
from slo.evidence import RequestRecord
from slo.load_timeline import goodput_recovery, load_points
from slo.verdict import ExperimentResult

T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)
START = T0.timestamp()


def _req(s: float, status: int | None = 201, route: str = "/v1/operations",
         method: str = "POST", ms: float = 20.0) -> RequestRecord:
    return RequestRecord(time=T0 + timedelta(seconds=s), method=method, route=route,
                         status=status, latency_ms=ms)


def _stream(slump: tuple[float, float] | None, until: float = 60.0) -> list[RequestRecord]:
    """4 submissions/s; inside ``slump`` every one fails (503) and is retried once."""
    out = []
    for i in range(int(until * 4)):
        t = i / 4
        if slump and slump[0] <= t < slump[1]:
            out += [_req(t, 503, ms=900.0), _req(t + 0.1, 503, ms=900.0)]
        else:
            out.append(_req(t))
    return out


def test_buckets_count_offered_goodput_and_p99() -> None:
    reqs = [*_stream(None, 4.0), _req(1.0, 200, "/v1/operations/{id}", "GET", ms=500.0),
            _req(1.5, None, ms=5000.0), _req(0.5, 200, "s3:/{bucket}/x", "GET")]
    points = load_points(reqs, START, START + 4.0, step=2.0)
    assert [(p.offered, p.goodput) for p in points] == [(5.0, 4.0), (4.0, 4.0)]
    assert points[0].p99_ms == 500.0 and points[1].p99_ms == 20.0  # timeouts have no latency


def test_recovery_is_measured_from_the_end_of_the_trigger() -> None:
    points = load_points(_stream((20.0, 30.0), until=70.0), START, START + 70.0)
    r = goodput_recovery(points, START + 20.0, START + 30.0)
    assert r.before == 4.0 and r.during == 0.0 and r.seconds_after_trigger == 0.0
    # a system that stays down 16 s after its trigger (metastable) is measured as such
    points = load_points(_stream((20.0, 46.0), until=80.0), START, START + 80.0)
    r = goodput_recovery(points, START + 20.0, START + 30.0)
    assert r.seconds_after_trigger == 16.0
    never = goodput_recovery(load_points(_stream((20.0, 70.0), 70.0), START, START + 70.0),
                             START + 20.0, START + 30.0)
    assert never.seconds_after_trigger is None


def test_the_report_says_what_it_measured_and_draws_the_fault() -> None:
    points = load_points(_stream((20.0, 46.0), until=80.0), START, START + 80.0)
    r = goodput_recovery(points, START + 20.0, START + 30.0)
    exp = ExperimentResult(name="x", fault_start=START + 20.0, fault_end=START + 30.0,
                           load=[(p.t, p.offered, p.goodput, p.p99_ms) for p in points],
                           goodput_before=r.before, goodput_during=r.during,
                           goodput_recovery_seconds=r.seconds_after_trigger)
    assert goodput_text(exp) == ("goodput 4.00/s before the fault, 0.00/s during it, back to "
                                 "95 % of it 16s after the fault ended")
    svg = load_svg(exp)
    assert svg.startswith("<svg") and "fecaca" in svg and svg.count("<polyline") == 3
    assert "no submission acknowledged" in goodput_text(exp.model_copy(update={"goodput_before": 0}))
