"""The serving SLIs (slo/sli.py serving_*) on inference ledger lines (slo/inference_ledger.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slo import sli
from slo.inference_ledger import InferenceLedgerError, InferenceRecord, dumps, read

T0 = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)


def rec(second: float, status: int | None = 200, latency: float = 10.0, version: str | None = "v1",
        correct: bool | None = True, error: str | None = None) -> InferenceRecord:
    return InferenceRecord(time=T0 + timedelta(seconds=second), status=status, error=error,
                           latency_ms=latency, version=version, correct=correct)


RECORDS = [rec(0), rec(1, latency=900.0), rec(2, status=503, version=None, correct=None),
           rec(3, status=None, error="ConnectionResetError", version=None, correct=None),
           rec(4, version="v2-garbage", correct=False), rec(5, status=400, correct=None)]


def test_success_counts_5xx_and_transport_errors_as_not_answered() -> None:
    assert sli.count(sli.serving_success(RECORDS)) == (4, 6)


def test_latency_judges_answered_requests_only() -> None:
    assert sli.count(sli.serving_latency(RECORDS, 500.0)) == (3, 4)
    assert sli.latency_quantile(RECORDS, 0.99) == 900.0
    assert sli.latency_quantile(RECORDS, 0.5) == 10.0
    assert sli.latency_quantile([RECORDS[2]], 0.99) is None


def test_correctness_and_bad_version_share() -> None:
    assert sli.count(sli.serving_correctness(RECORDS)) == (2, 3)
    outcomes = sli.serving_good_version(RECORDS, frozenset({"v2-garbage"}))
    assert sli.count(outcomes) == (3, 4)
    assert [o.subject for o in outcomes if not o.good] == ["v2-garbage"]


def test_the_ledger_round_trips_and_names_a_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "inference.jsonl"
    path.write_text("".join(dumps(r) for r in RECORDS) + '{"time": "2026-12-07T03:00:0')
    assert read(path) == RECORDS  # a torn last line (killed writer) is dropped
    path.write_text(dumps(RECORDS[0]) + '{"time": "2026-12-07T03:00:00Z", "latency_ms": -1}\n')
    with pytest.raises(InferenceLedgerError, match=r"inference.jsonl: line 2: field latency_ms"):
        read(path)
    assert read(tmp_path / "absent.jsonl") == []
