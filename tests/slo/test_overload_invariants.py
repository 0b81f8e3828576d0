"""The overload class's invariants (slo/overload_invariants.py): goodput back within the RTO
after the trigger ended, and submission requests per acknowledged submission bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from slo.evidence import FaultRecord, RequestRecord
from slo.invariants import KNOWN_INVARIANTS, check_invariant
from slo.overload_invariants import goodput_recovered, request_amplification

T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)
START = T0.timestamp()
TRIGGER = (30.0, 60.0)  # the latency toxic, seconds after T0


def _req(s: float, status: int | None = 201, route: str = "/v1/operations",
         method: str = "POST") -> RequestRecord:
    return RequestRecord(time=T0 + timedelta(seconds=s), method=method, route=route,
                         status=status, latency_ms=20.0, error=None if status else "timeout")


def _faults(lo: float = TRIGGER[0], hi: float | None = TRIGGER[1]) -> list[FaultRecord]:
    out = [FaultRecord(time=T0 + timedelta(seconds=lo), event="fault_start",
                       fault="toxics", target="database")]
    if hi is not None:
        out.append(FaultRecord(time=T0 + timedelta(seconds=hi), event="fault_end",
                               fault="toxics", target="database"))
    return out


def _load(down_until: float, until: float = 150.0, rate: int = 10,
          shed: bool = True) -> list[RequestRecord]:
    """``rate`` submissions/s; from the trigger to ``down_until`` one in five is acknowledged
    and the rest are refused fast and retried once (``shed``) or time out and are retried
    once, both unacknowledged (a queue without bound)."""
    out = []
    for i in range(int(until * rate)):
        t = i / rate
        if TRIGGER[0] <= t < down_until and i % 5:
            status = 503 if shed else None
            out += [_req(t, status), _req(t + 0.05, status)]
        else:
            out.append(_req(t))
    return out


def test_goodput_back_at_the_end_of_the_trigger_passes_with_what_was_measured() -> None:
    r = goodput_recovered(_load(down_until=TRIGGER[1]), _faults(), START + 30, START + 150, 60)
    assert r.judged == 1 and not r.violations and r.no_data is None
    assert r.measured is not None and "10.0/s before toxics database" in r.measured
    assert "2.0/s during it, back 0 s after it ended" in r.measured


def test_goodput_down_beyond_the_rto_after_the_trigger_is_a_metastable_failure() -> None:
    # back 70 s after the trigger ended: later than the RTO of 60 s
    r = goodput_recovered(_load(down_until=130.0, until=200.0), _faults(), START + 30,
                          START + 200, 60)
    assert len(r.violations) == 1 and "back 70 s after it ended" in r.violations[0]
    assert "not within its RTO of 60 s" in r.violations[0]
    # never back within the evidence
    r = goodput_recovered(_load(down_until=200.0, until=150.0), _faults(), START + 30,
                          START + 150, 60)
    assert "not back within the 90 s of evidence" in r.violations[0]


def test_goodput_without_a_trigger_or_a_baseline_is_no_data() -> None:
    assert goodput_recovered(_load(TRIGGER[1]), [], START, START + 150, 60).no_data
    late = [r for r in _load(TRIGGER[1]) if r.time >= T0 + timedelta(seconds=TRIGGER[0])]
    r = goodput_recovered(late, _faults(), START + 30, START + 150, 60)
    assert r.judged == 0 and "no acknowledged submission" in (r.no_data or "")


def test_amplification_of_fast_refusals_is_bounded_and_of_timeouts_is_not() -> None:
    # shed and retried once for 30 s, then 60 s healthy: (30*10*1.8 + 600) / (60 + 600)
    r = request_amplification(_load(TRIGGER[1]), _faults(), START + 30, START + 150, 60)
    assert not r.violations and r.measured is not None and "at most 2x" in r.measured
    assert "1.73 requests per acknowledged submission" in r.measured
    # over a fixed span whatever the RTO: a short RTO does not narrow it to the trigger,
    # where a healthy API refuses much of its load by design
    assert request_amplification(_load(TRIGGER[1]), _faults(), START + 30, START + 150,
                                 5).measured == r.measured
    # the same retries with goodput down until long after the trigger: amplified
    r = request_amplification(_load(140.0, until=160.0, shed=False), _faults(), START + 30,
                              START + 160, 60)
    assert len(r.violations) == 1 and "1.8 requests" not in r.violations[0]
    assert "(at most 2x)" in r.violations[0]
    # nothing acknowledged at all after the trigger started
    none = [r for r in _load(200.0, until=150.0) if r.status != 201 or r.time < T0 + timedelta(
        seconds=TRIGGER[0])]
    r = request_amplification(none, _faults(), START + 30, START + 150, 60)
    assert "none acknowledged" in r.violations[0]


def test_amplification_counts_submissions_only_and_needs_a_baseline() -> None:
    reads = [_req(t / 2, 200, "/v1/operations/{id}", "GET") for t in range(300)]
    r = request_amplification([*_load(TRIGGER[1]), *reads], _faults(), START + 30,
                              START + 150, 60)
    assert "1.73 requests" in (r.measured or "")
    assert request_amplification(reads, _faults(), START + 30, START + 150, 60).no_data


def test_registered_and_judged_against_the_rto_it_is_given() -> None:
    from slo.evidence import Evidence

    assert {"goodput-recovered", "bounded-request-amplification"} <= set(KNOWN_INVARIANTS)
    ev = Evidence.model_construct(requests=_load(down_until=130.0, until=200.0),
                                  faults=_faults())
    assert check_invariant("goodput-recovered", ev, START + 30, START + 200,
                           rto_seconds=60).violations
    assert not check_invariant("goodput-recovered", ev, START + 30, START + 200,
                               rto_seconds=90).violations
    assert check_invariant("goodput-recovered", ev, START + 30, START + 200).no_data


def _lag_note(start: float, end: float, max_lag_s: float) -> FaultRecord:
    """The load's "overload stopped" note with one lag episode of its generator."""
    return FaultRecord(time=T0 + timedelta(seconds=170), event="note", fault="overload stopped",
                       target="local", details={"generator_lag": [
                           {"start": START + start, "end": START + end,
                            "max_lag_s": max_lag_s}]})


def test_a_load_generator_behind_its_schedule_is_not_judged_either_way() -> None:
    # the same records a metastable platform leaves; the client's loop was 3 s late at +90 s
    load = _load(down_until=130.0, until=200.0, shed=False)
    faults = [*_faults(), _lag_note(90.0, 95.0, 3.0)]
    for check in (goodput_recovered, request_amplification):
        r = check(load, faults, START + 30, START + 200, 60)
        assert r.judged == 0 and not r.violations, r
        assert "load generator fell 3.0 s behind" in (r.no_data or "")
        assert "not the platform" in (r.no_data or "")
    # a lag below the limit, or outside the judged span (trigger - 10 s to trigger end + 60 s),
    # leaves the records judged: the same failure is found
    for note in (_lag_note(90.0, 95.0, 0.5), _lag_note(150.0, 160.0, 3.0),
                 _lag_note(5.0, 15.0, 3.0)):
        r = goodput_recovered(load, [*_faults(), note], START + 30, START + 200, 60)
        assert r.no_data is None and r.violations, note
    # a generator's faults passed as a one-shot iterator are read whole
    r = request_amplification(load, iter([*_faults(), _lag_note(90.0, 95.0, 3.0)]),
                              START + 30, START + 200, 60)
    assert r.no_data is not None and "behind" in r.no_data
