"""The storage classes' invariants (slo/storage_invariants.py): API p99 while a disk is slow,
and database promotions counted from the Patroni timeline that disk fault records carry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slo.evidence import FaultRecord, RequestRecord
from slo.invariants import KNOWN_INVARIANTS
from slo.sli import ts
from slo.storage_invariants import MAX_P99_SECONDS, bounded_latency, p99, promotions

T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)
LO, HI = ts(T0), ts(T0 + timedelta(seconds=120))


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _disk(event: str, at: float, timeline: int | None, leader: str | None = "pg-0",
          **extra: Any) -> FaultRecord:
    cluster = {"leader": leader, "timeline": timeline, "roles": {}}
    return FaultRecord.model_validate({"time": _at(at), "event": event, "fault": "disk",
                                       "target": "pg-0", "details": {"cluster": cluster, **extra}})


def _req(at: float, ms: float, route: str = "POST /v1/operations", status: int = 201
         ) -> RequestRecord:
    return RequestRecord(time=_at(at), method="POST", route=route, status=status, latency_ms=ms)


def test_the_names_are_known_to_the_specs() -> None:
    assert {"bounded-latency", "no-failover", "at-most-one-failover"} <= set(KNOWN_INVARIANTS)


def test_p99_is_the_nearest_rank() -> None:
    assert p99([1.0]) == 1.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([float(i) for i in range(1, 201)]) == 198.0


def test_slow_but_bounded_requests_pass_and_say_their_p99() -> None:
    faults = [_disk("fault_start", 10, 1), _disk("fault_end", 40, 1)]
    requests = [_req(5, 3000)] + [_req(10 + i * 0.3, 450) for i in range(100)] + [_req(45, 4000)]
    r = bounded_latency(requests, faults, LO, HI)
    assert r.judged == 100 and r.violations == ()  # before and after the fault: not judged
    assert r.measured == f"p99 0.45 s over 100 requests (at most {MAX_P99_SECONDS:g} s)"


def test_a_tail_beyond_the_bound_is_one_violation_and_s3_downloads_do_not_count() -> None:
    faults = [_disk("fault_start", 10, 1), _disk("fault_end", 40, 1)]
    requests = ([_req(11 + i * 0.2, 300) for i in range(95)] + [_req(30, 5000)] * 5
                + [_req(20, 9000, route="s3:GET artifact")] * 50)
    r = bounded_latency(requests, faults, LO, HI)
    assert r.judged == 100 and len(r.violations) == 1
    assert "API p99 5.00 s over 100 requests during disk pg-0" in r.violations[0]


def test_latency_without_a_fault_or_requests_is_no_data() -> None:
    assert bounded_latency([_req(1, 1)], [], LO, HI).no_data == "no fault_start in the window"
    r = bounded_latency([], [_disk("fault_start", 10, 1)], LO, HI)
    assert r.judged == 0 and "no API request while the fault lasted" in (r.no_data or "")


def test_a_slow_disk_without_promotion_passes_no_failover() -> None:
    faults = [_disk("fault_start", 10, 3), _disk("fault_end", 40, 3)]
    r = promotions(faults, LO, HI, 0, "no-failover")
    assert r.judged == 1 and r.violations == ()
    assert r.measured == "disk on pg-0 at 06:00:10: 0 promotion(s) (timeline 3 -> 3; leader pg-0)"


def test_flapping_is_counted_from_the_timeline_including_the_settled_note() -> None:
    # failed over to pg-1 during the fault, and back to pg-0 after it was cleared
    faults = [_disk("fault_start", 10, 1), _disk("fault_end", 40, 2, "pg-1"),
              _disk("note", 55, 3, "pg-0", settled=True)]
    r = promotions(faults, LO, HI, 1, "at-most-one-failover")
    assert len(r.violations) == 1
    assert "2 promotion(s) (timeline 1 -> 3; leader pg-0 -> pg-1 -> pg-0), at most 1" \
        in r.violations[0]
    one = promotions(faults[:2], LO, HI, 1, "at-most-one-failover")
    assert one.violations == () and "1 promotion(s)" in (one.measured or "")
    assert len(promotions(faults[:2], LO, HI, 0, "no-failover").violations) == 1


def test_records_after_the_horizon_or_of_the_next_fault_do_not_count() -> None:
    faults = [_disk("fault_start", 10, 1), _disk("fault_end", 40, 1),
              _disk("fault_start", 60, 1), _disk("fault_end", 200, 5)]
    r = promotions(faults, LO, HI, 0, "no-failover")
    assert r.judged == 1 and r.violations == ()  # the second has no record before the horizon
    assert "no database timeline recorded after it" not in (r.measured or "")


def test_unknown_timelines_are_no_data_never_a_pass() -> None:
    unknown = [_disk("fault_start", 10, None, None), _disk("fault_end", 40, 2)]
    r = promotions(unknown, LO, HI, 0, "no-failover")
    assert r.judged == 0 and "no database timeline recorded at its start" in (r.no_data or "")
    other = [FaultRecord(time=_at(10), event="fault_start", fault="kill", target="api-1")]
    r = promotions(other, LO, HI, 0, "no-failover")
    assert r.judged == 0 and "recorded the database cluster" in (r.no_data or "")
