"""model-store-unavailable's invariants (slo/scale_up_invariants.py) on hand-made inference
lines and timeline records, the shapes each seeded defect leaves, and their registration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slo.evidence import FaultRecord
from slo.inference_ledger import InferenceRecord
from slo.invariants import INVARIANTS, RTO_INVARIANTS
from slo.scale_up_invariants import (
    no_half_loaded_model,
    scaled_up_ready_within_rto,
    store_outage_availability,
    unready_with_reason,
)
from slo.sli import ts

T0 = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)
OUT, BACK = 10.0, 40.0  # the store cut off from +10 s to +40 s


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _window() -> tuple[float, float]:
    return ts(_at(0)), ts(_at(1000))


def _lines(n: int, start: float = 0.0, failed: int = 0, wrong: int = 0) -> list[InferenceRecord]:
    """n predictions 0.1 s apart from ``start``; the first ``failed`` answered 503, the next
    ``wrong`` answered with a wrong answer."""
    return [InferenceRecord(time=_at(start + i * 0.1), status=503 if i < failed else 200,
                            latency_ms=10.0, version="v1",
                            correct=None if i < failed else not (i < failed + wrong))
            for i in range(n)]


def _note(s: float, what: str, **details: Any) -> FaultRecord:
    return FaultRecord(time=_at(s), event="note", fault=what, target="local", details=details)


def _outage(back: float | None = BACK) -> list[FaultRecord]:
    out = [FaultRecord(time=_at(OUT), event="fault_start", fault="artifact_store_unreachable",
                       target="moto")]
    if back is not None:
        out.append(FaultRecord(time=_at(back), event="fault_end",
                               fault="artifact_store_unreachable", target="moto"))
    return out


def _state(s: float, state: str, reason: str, op: str = "0", since: float | None = None,
           ) -> FaultRecord:
    return _note(s, "serving_replica_state", replica="model-3", state=state, reason=reason,
                 since=ts(_at(since if since is not None else s)), haproxy={"op_state": op})


SCALE = _note(12, "serving_scale", started=["model-3"], before=["model-1", "model-2"])
UNREADY = "artifact store unreachable: Read timeout on endpoint URL"


def test_availability_during_the_outage_says_n_and_the_bound() -> None:
    # 250 predictions during the outage, 50 after it failing: only the outage's count
    lines = _lines(250, start=OUT + 1) + _lines(50, start=BACK + 1, failed=50)
    r = store_outage_availability(lines, _outage(), *_window())
    assert r.violations == () and r.judged == 250
    assert r.measured == "250 of 250 answered during the 30 s outage (1.0000, at least 0.99)"


def test_a_replica_let_in_before_its_model_loaded_fails_availability() -> None:
    # the scale-up-skips-readiness shape: one prediction in three answered 503 by the new one
    r = store_outage_availability(_lines(300, start=OUT, failed=100), _outage(), *_window())
    assert len(r.violations) == 1
    assert r.violations[0].startswith("200 of 300 answered during the 30 s outage (0.6667, "
                                      "at least 0.99); failed: 06:00:10.000 503")
    assert store_outage_availability(_lines(300, start=OUT, failed=3), _outage(),
                                     *_window()).violations == ()


def test_availability_without_an_outage_or_enough_requests_is_no_data() -> None:
    assert store_outage_availability(_lines(300), [], *_window()).no_data == (
        "the model store was not cut off in the window")
    r = store_outage_availability(_lines(99, start=OUT), _outage(), *_window())
    assert r.no_data is not None and r.no_data.startswith(
        "99 prediction requests in the 30 s the store was cut off, fewer than the 100")


def test_every_golden_answer_right_holds_and_one_wrong_is_a_violation() -> None:
    r = no_half_loaded_model(_lines(200, failed=5), *_window())
    assert r.violations == () and r.measured == "195 of 195 answered golden predictions right"
    # the serve-partial-model shape: a replica serving weights it never read answers wrong
    r = no_half_loaded_model(_lines(200, wrong=1), *_window())
    assert r.violations == (("1 of 200 answered with a wrong answer (a model not loaded in full "
                             "answered): 06:00:00.000 v1"),)
    assert no_half_loaded_model(_lines(10, failed=10), *_window()).no_data == (
        "no answered golden-set prediction in the window")


def test_the_new_replica_unready_saying_why_and_out_holds() -> None:
    faults = [*_outage(), SCALE, _state(25, "unready", UNREADY), _state(36, "unready", UNREADY)]
    r = unready_with_reason(faults, *_window())
    assert r.violations == () and r.judged == 2
    assert r.measured == f"model-3 unready: {UNREADY}; model-3 unready: {UNREADY}"


def test_a_new_replica_ready_on_a_model_it_never_read_or_let_in_is_a_violation() -> None:
    # serve-partial-model: it went ready while the store was cut off
    r = unready_with_reason([*_outage(), SCALE, _state(25, "ready", "serving what was loaded",
                                                       op="2")], *_window())
    assert r.violations == (
        "model-3 at 06:00:25: model 'ready', not unready with a reason (serving what was loaded)",
        "model-3 at 06:00:25: HAProxy had it up (taking predictions) while its model was 'ready'")
    # scale-up-skips-readiness: unready, saying why, but HAProxy has it up
    r = unready_with_reason([*_outage(), SCALE, _state(25, "unready", UNREADY, op="2")],
                            *_window())
    assert r.violations == (("model-3 at 06:00:25: HAProxy had it up (taking predictions) while "
                             "its model was 'unready'"),)
    # still loading when looked at: it never said why
    r = unready_with_reason([*_outage(), SCALE, _state(25, "loading", "reading http://s3/")],
                            *_window())
    assert r.violations == (("model-3 at 06:00:25: model 'loading', not unready with a reason "
                             "(reading http://s3/)"),)


def test_unready_with_reason_needs_a_look_during_the_outage() -> None:
    assert unready_with_reason(_outage(), *_window()).no_data == "no scale-up in the window"
    # looked at only after the store was back
    r = unready_with_reason([*_outage(), SCALE, _state(45, "unready", UNREADY)], *_window())
    assert r.no_data == ("model-3 never looked at while the store was cut off (no "
                         "serving_replica_state note in the outage)")


def test_ready_within_the_rto_of_the_store_coming_back() -> None:
    faults = [*_outage(), SCALE, _state(25, "unready", UNREADY),
              _state(47, "ready", "loaded 180 bytes", op="2", since=43.5)]
    r = scaled_up_ready_within_rto(faults, *_window(), rto=30)
    assert r.violations == ()
    assert r.measured == "model-3 ready 3.5 s after the store was back (RTO 30 s)"
    r = scaled_up_ready_within_rto(faults, *_window(), rto=3)
    assert r.violations == ("model-3: ready 3.5 s after the store was back (RTO 3 s)",)


def test_never_ready_or_never_back_is_said() -> None:
    r = scaled_up_ready_within_rto([*_outage(), SCALE, _state(70, "unready", UNREADY)],
                                   *_window(), rto=30)
    assert r.violations == ("model-3: not ready by the end of the window",)
    r = scaled_up_ready_within_rto([*_outage(back=None), SCALE], *_window(), rto=30)
    assert r.no_data == "the model store was not back by the end of the window"


def test_registered_for_the_class_only() -> None:
    assert {"store-outage-availability", "no-half-loaded-model",
            "unready-with-reason"} <= INVARIANTS.keys()
    assert "scaled-up-ready-within-rto" in RTO_INVARIANTS
