"""The serving classes' invariants (slo/serving_invariants.py) on inference-ledger lines, their
registration, the inference ledger in the evidence, and the serving check's defect switch in
the generated haproxy.cfg (environments/local/serving.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from environments.local import serving
from slo.evidence import EvidenceError, FaultRecord, load_evidence
from slo.fixtures import build_run
from slo.inference_ledger import FILE, InferenceRecord, dumps
from slo.invariants import KNOWN_INVARIANTS, check_invariant
from slo.serving_invariants import (
    restarted_within_rto,
    serving_availability,
    serving_latency_p99,
)
from slo.sli import ts

T0 = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _lines(n: int, failed: int = 0, latency_ms: float = 10.0, slow: int = 0,
           slow_ms: float = 0.0) -> list[InferenceRecord]:
    """n requests 0.1 s apart; the first ``failed`` answered 503, the next ``slow`` late."""
    out = []
    for i in range(n):
        status = 503 if i < failed else 200
        late = failed <= i < failed + slow
        out.append(InferenceRecord(time=_at(i * 0.1), status=status,
                                   latency_ms=slow_ms if late else latency_ms,
                                   version="v1", correct=status == 200 or None))
    return out


def _window() -> tuple[float, float]:
    return ts(_at(0)), ts(_at(1000))


def test_every_prediction_answered_holds_and_says_n_and_the_bound() -> None:
    r = serving_availability(_lines(400), *_window())
    assert r.violations == () and r.no_data is None and r.judged == 400
    assert r.measured == "400 of 400 answered (1.0000, at least 0.99)"


def test_one_percent_may_fail_and_more_is_a_violation() -> None:
    assert serving_availability(_lines(400, failed=4), *_window()).violations == ()
    # the seeded defect's shape: a loading replica answering 503 for a few seconds
    r = serving_availability(_lines(400, failed=20), *_window())
    assert len(r.violations) == 1
    assert r.violations[0].startswith("380 of 400 answered (0.9500, at least 0.99; failed: ")
    assert "04:00:00.000 503" in r.violations[0] and r.violations[0].endswith(" ...)")


def test_a_transport_error_is_a_failed_prediction() -> None:
    lines = _lines(100) + [InferenceRecord(time=_at(50), error="ConnectionResetError",
                                           latency_ms=3.0)] * 2
    r = serving_availability(lines, *_window())
    assert r.judged == 102 and len(r.violations) == 1
    assert "ConnectionResetError" in r.violations[0]


def test_only_the_window_counts() -> None:
    # 30 failures before the fault start are not the fault's cost
    lines = _lines(400, failed=30)
    r = serving_availability(lines, ts(_at(3.5)), ts(_at(100)))
    assert r.judged == 365 and r.violations == ()


def test_too_few_or_no_predictions_is_no_data_never_a_pass() -> None:
    r = serving_availability(_lines(99), *_window())
    assert r.no_data == "99 prediction requests in the window, fewer than the 100 a 0.99 ratio needs"
    r = serving_availability([], *_window())
    assert r.no_data is not None and "inference.jsonl" in r.no_data and "--serving" in r.no_data
    assert serving_latency_p99([], *_window()).no_data is not None


def test_p99_within_the_bound_and_beyond_it() -> None:
    r = serving_latency_p99(_lines(200, slow=2, slow_ms=900.0), *_window())
    assert r.violations == () and r.measured == "p99 10.0 ms over 200 answered (at most 250 ms)"
    r = serving_latency_p99(_lines(200, slow=3, slow_ms=900.0), *_window())
    assert r.violations == ("p99 900.0 ms over 200 answered (at most 250 ms)",)


def test_p99_is_over_answered_predictions_only() -> None:
    # failed requests belong to availability; their (fast) latency must not hide slow answers
    lines = _lines(300, failed=100, slow=3, slow_ms=900.0, latency_ms=1.0)
    assert serving_latency_p99(lines, *_window()).violations != ()


def _kill(target: str, start: float, end: float | None) -> list[FaultRecord]:
    out = [FaultRecord(time=_at(start), event="fault_start", fault="kill", target=target)]
    if end is not None:
        out.append(FaultRecord(time=_at(end), event="fault_end", fault="kill", target=target,
                               details={"recovered_seconds": 3.0}))
    return out


def test_replica_back_within_the_rto() -> None:
    toxic = [FaultRecord(time=_at(14), event="fault_start", fault="toxic", target="s3/slow"),
             FaultRecord(time=_at(30), event="fault_end", fault="toxic", target="s3/slow")]
    r = restarted_within_rto(_kill("model-1", 10, 22.5) + toxic, *_window(), 30)
    assert r.judged == 1 and r.violations == ()  # the toxic is no process fault
    assert r.measured == "model-1 back in 12.5 s (RTO 30 s)"
    r = restarted_within_rto(_kill("model-1", 10, 45), *_window(), 30)
    assert r.violations == ("kill model-1: back 35.0 s after the fault (RTO 30 s)",)
    r = restarted_within_rto(_kill("model-1", 10, None), *_window(), 30)
    assert r.violations == ("kill model-1: not back by the end of the window",)
    assert restarted_within_rto([], *_window(), 30).no_data is not None


def test_registered_under_the_names_objectives_list() -> None:
    assert {"serving-availability", "serving-latency-p99",
            "restarted-within-rto"} <= set(KNOWN_INVARIANTS)
    r = check_invariant("restarted-within-rto", _evidence_stub(), *_window())
    assert r.no_data == "no RTO to judge it against"


def _evidence_stub():  # only what the registry's lambdas read
    from types import SimpleNamespace
    return SimpleNamespace(faults=(), inference=())


def test_evidence_has_the_inference_ledger_or_none(tmp_path: Path) -> None:
    run = tmp_path / "run"
    build_run(run)
    assert load_evidence(run).inference == ()  # a run without serving: nothing, no error
    (run / FILE).write_text("".join(dumps(r) for r in _lines(3)))
    assert len(load_evidence(run).inference) == 3
    (run / FILE).write_text(json.dumps({"time": "2026-12-07T04:00:00Z", "latency_ms": -1}) + "\n"
                            + dumps(_lines(1)[0]))
    with pytest.raises(EvidenceError, match=r"^inference.jsonl: line 1: field latency_ms: "):
        load_evidence(run)


CFG = serving.haproxy_section({"haproxy_serving": 1, "model1": 2, "model2": 3})


def test_the_serving_check_is_the_models_readiness() -> None:
    assert "  option httpchk GET /v2/models/fraud-score/ready\n" in CFG
    assert "/v2/health/live" not in CFG


def test_the_defect_switches_the_check_to_liveness_and_back() -> None:
    broken = serving.with_check(CFG, frozenset({"serving-check-liveness"}))
    assert "  option httpchk GET /v2/health/live\n" in broken and "/ready" not in broken
    assert broken == serving.haproxy_section(
        {"haproxy_serving": 1, "model1": 2, "model2": 3}, frozenset({"serving-check-liveness"}))
    assert serving.with_check(broken, frozenset()) == CFG
    assert serving.with_check(CFG, frozenset({"fencing-off"})) == CFG  # other defects: no change
