"""bounded-retry-amplification (slo/invariants.py): the object store's request rate during an
S3 brownout against its rate just before, from the store's own counts on the fault records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slo.evidence import FaultRecord
from slo.invariants import MAX_RETRY_AMPLIFICATION, check_invariant, retry_amplification
from slo.sli import ts

T0 = datetime(2026, 12, 6, 5, 0, tzinfo=UTC)


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _brownout(start: float, end: float, base: tuple[int, float], first: int, last: int,
              **start_details: Any) -> list[FaultRecord]:
    details = {"baseline": {"requests": base[0], "seconds": base[1]},
               "counters": {"requests": first}, **start_details}
    return [FaultRecord(time=_at(start), event="fault_start", fault="s3_brownout",
                        target="moto", details=details),
            FaultRecord(time=_at(end), event="fault_end", fault="s3_brownout", target="moto",
                        details={"counters": {"requests": last}})]


def test_backing_off_clients_stay_below_the_bound() -> None:
    # the healthy run measured on 2026-12-06: 54 requests in 3.0 s before, 352 in 28 s during
    r = retry_amplification(_brownout(10, 38, (54, 3.0), 166, 518), ts(_at(0)), ts(_at(60)))
    assert r.judged == 1 and r.violations == () and r.no_data is None
    assert r.measured == "12.6/s against 18.0/s before: 0.70x (at most 2x)"  # shown with a pass


def test_a_retry_storm_is_a_violation_naming_the_rates() -> None:
    # the seeded defect storage-retry-no-backoff: 2,781 requests in 28.1 s against 14.9/s
    r = retry_amplification(_brownout(10, 38.1, (45, 3.02), 100, 2881), ts(_at(0)), ts(_at(60)))
    assert len(r.violations) == 1
    assert "2781 S3 requests in 28.1 s" in r.violations[0]
    assert f"(at most {MAX_RETRY_AMPLIFICATION:g}x)" in r.violations[0]


def test_no_baseline_traffic_or_no_counts_is_no_data_never_a_pass() -> None:
    quiet = retry_amplification(_brownout(10, 20, (0, 3.0), 5, 50), ts(_at(0)), ts(_at(60)))
    assert quiet.judged == 0 and "no S3 request in its baseline" in (quiet.no_data or "")
    start_only = _brownout(10, 20, (30, 3.0), 5, 50)[:1]
    open_ended = retry_amplification(start_only, ts(_at(0)), ts(_at(60)))
    assert open_ended.judged == 0 and "no request counts" in (open_ended.no_data or "")
    nothing = retry_amplification([], ts(_at(0)), ts(_at(60)))
    assert nothing.no_data == "no S3 brownout in the window"


def test_a_brownout_outside_the_window_is_not_judged_and_the_name_is_known() -> None:
    faults = _brownout(100, 120, (54, 3.0), 0, 10_000)
    assert retry_amplification(faults, ts(_at(0)), ts(_at(60))).judged == 0

    class Ev:
        pass

    ev = Ev()
    ev.faults = _brownout(10, 38, (54, 3.0), 166, 518)  # type: ignore[attr-defined]
    result = check_invariant("bounded-retry-amplification", ev, ts(_at(0)), ts(_at(60)))  # type: ignore[arg-type]
    assert result.name == "bounded-retry-amplification" and result.judged == 1
