"""The report's serving chart: latency and the traffic split per version over the run, the
declared canary share and the fault windows (slo/serving_charts.py, slo/serving_report.py).
Hand-made inference records and rollout notes, no environment."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slo.evaluate import evaluate_run
from slo.evidence import FaultRecord
from slo.fixtures import example_experiments
from slo.inference_ledger import InferenceRecord, dumps
from slo.report import write_reports
from slo.serving_charts import (
    FaultWindow,
    bucket_width,
    declared_shares,
    rollouts,
    serving_buckets,
    serving_summary,
    serving_svg,
    serving_view,
)

BASE = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)
T0 = BASE.timestamp()


def rec(at: float, latency_ms: float, version: str | None = "v1", status: int | None = 200,
        error: str | None = None) -> InferenceRecord:
    return InferenceRecord(time=BASE + timedelta(seconds=at), status=status, error=error,
                           latency_ms=latency_ms, version=version, correct=True)


def note(at: float, fault: str, **details: object) -> FaultRecord:
    return FaultRecord(time=BASE + timedelta(seconds=at), event="note", fault=fault,
                       target="serving", details=details)


def good_rollout(at: float) -> list[FaultRecord]:
    """The notes RolloutController.run writes for a rollout of v2 that ends done (the order
    of tests/serving/test_serving_env.py: shares 0 (canary still v1), 10, 50, 100, 50)."""
    return [note(at, "rollout_start", version="v2", **{"from": "v1"}, steps=[10, 50, 100]),
            note(at + 0.1, "rollout_share", canary="model-2", share=0, version="v1"),
            note(at + 5, "rollout_share", canary="model-2", share=10, version="v2"),
            note(at + 8, "rollout_step", step=0, share=10, decision="step"),
            note(at + 8, "rollout_share", canary="model-2", share=50, version="v2"),
            note(at + 11, "rollout_step", step=1, share=50, decision="step"),
            note(at + 11, "rollout_share", canary="model-2", share=100, version="v2"),
            note(at + 14, "rollout_step", step=2, share=100, decision="done"),
            note(at + 20, "rollout_share", canary="model-2", share=50, version="v2"),
            note(at + 20.1, "rollout_end", version="v2", outcome="done", reasons=[])]


def rolled_back(at: float, bad: str) -> list[FaultRecord]:
    return [note(at, "rollout_start", version=bad, **{"from": "v1"}, steps=[10, 50, 100]),
            note(at + 0.1, "rollout_share", canary="model-2", share=0, version="v1"),
            note(at + 5, "rollout_share", canary="model-2", share=10, version=bad),
            note(at + 8, "rollout_step", step=0, share=10, decision="rollback"),
            note(at + 8, "rollout_share", canary="model-2", share=0, version=bad),
            note(at + 12, "rollout_share", canary="model-2", share=50, version="v1"),
            note(at + 12.1, "rollout_end", version=bad, outcome="rollback",
                 reasons=["error ratio 0.481 above 0.02 (13 of 27)"])]


def test_buckets_hold_the_quantiles_failures_and_versions_of_their_answers() -> None:
    records = [rec(1 + k * 0.5, 10.0 * (k + 1)) for k in range(10)]  # 10..100 ms, bucket 0
    records += [rec(12, 30), rec(13, 40, "v2"), rec(14, 5, "v2", status=500),
                rec(15, 3000, None, status=None, error="ReadTimeout")]
    # sent at 9.95 s, answered 0.1 s later: counted where the client felt it, bucket 1
    records.append(rec(9.95, 100, "v2"))
    records.append(rec(45, 10))  # after the axis: in no bucket
    b = serving_buckets(records, T0, T0 + 30, 10)
    assert [x.requests for x in b] == [10, 5, 0]
    assert (b[0].p50_ms, b[0].p99_ms, b[0].failed, b[0].by_version) == (50, 100, 0, {"v1": 10})
    # answered in bucket 1: 30 (v1), 40 and 100 (v2); the 500 and the timeout are failures
    assert (b[1].p50_ms, b[1].p99_ms, b[1].failed) == (40, 100, 2)
    assert b[1].by_version == {"v1": 1, "v2": 2}
    assert b[2].p50_ms is None and b[2].by_version == {} and b[2].start == T0 + 20


def test_bucket_width_keeps_a_chart_readable() -> None:
    assert bucket_width(60) == 1
    assert bucket_width(600) == 5
    assert bucket_width(20 * 60) == 10
    assert bucket_width(3 * 3600) == 120


def test_the_declared_share_follows_a_rollout_that_ends_done() -> None:
    got = [(round(d.time - T0, 3), d.version, d.share)
           for d in declared_shares(good_rollout(30))]
    # 0 until the canary runs v2, its steps, then v2 on both replicas: 100 %, not 50
    assert got == [(30, "v2", 0), (30.1, "v2", 0), (35, "v2", 10), (38, "v2", 50),
                   (41, "v2", 100), (50, "v2", 100)]


def test_the_declared_share_of_a_rolled_back_version_returns_to_zero() -> None:
    notes = rolled_back(30, "v2-errors")
    # a reset to even weights after the rollout declares nothing about a new version
    notes.append(note(60, "rollout_share", canary="model-2", share=50, version="v1"))
    got = [(round(d.time - T0, 3), d.share) for d in declared_shares(notes)]
    assert got == [(30, 0), (30.1, 0), (35, 10), (38, 0), (42, 0)]
    assert [(r.version, r.outcome, r.reasons) for r in rollouts(notes)] == [
        ("v2-errors", "rollback", ("error ratio 0.481 above 0.02 (13 of 27)",))]


def _view():
    # v1 answers alone for 30 s, then the canary's v2 its ~10 %, then half, then everything
    records = [rec(s + k / 10, 20 + k % 7) for s in range(35) for k in range(10)]
    records += [rec(35 + k / 10, 25, "v2" if k % 10 == 0 else "v1") for k in range(30)]
    records += [rec(38 + k / 10, 25, "v2" if k % 2 else "v1") for k in range(30)]
    records += [rec(41 + k / 10, 400, "v2") for k in range(150)]  # last answer at 56.3 s
    records.append(rec(45, 5, "v2", status=503))
    windows = [FaultWindow(T0 + 10, T0 + 20, "api-replica-loss")]
    return serving_view(records, good_rollout(30), windows, T0, T0 + 60)


def test_the_svg_draws_latency_each_version_the_declared_share_and_the_fault() -> None:
    view = _view()
    assert view is not None and view.width == 1
    svg = serving_svg(view)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "<script" not in svg
    titles = re.findall(r'<polyline class="series"[^>]*><title>([^<]+)</title>', svg)
    assert {"p50", "p99", "answered by v1", "answered by v2"} <= set(titles)
    assert re.search(r'class="declared"[^>]*stroke-dasharray[^>]*><title>v2 declared: '
                     r"0%, 0%, 10%, 50%, 100%, 100%</title>", svg)
    faults = re.findall(r'<rect class="fault" x="([\d.]+)"[^>]*width="([\d.]+)"', svg)
    assert len(faults) == 2  # shaded across both panels
    # the window [10 s, 20 s] of a 60 s axis sits at 1/6 .. 2/6 of the plot width
    x0, width = float(faults[0][0]), float(faults[0][1])
    plot_l, plot_r = 64, 860 - 16 - 40
    assert abs(x0 - (plot_l + (plot_r - plot_l) / 6)) < 0.2
    assert abs(width - (plot_r - plot_l) / 6) < 0.2
    assert svg.count('class="failed"') == 1  # the one 503, marked in its bucket


def test_the_share_line_is_what_answered() -> None:
    view = _view()
    assert view is not None
    by_second = {round(b.start - T0): b for b in view.buckets}
    share = {s: by_second[s].by_version.get("v2", 0) / sum(by_second[s].by_version.values())
             for s in (20, 36, 39, 42)}
    assert share == {20: 0.0, 36: 0.1, 39: 0.5, 42: 1.0}
    assert serving_summary(view) == (
        "561 prediction requests, 1 failed; latency of the answered p50 24 ms, p99 400 ms; "
        "answered by v1 70.0%, v2 30.0%; rollout: v2 (from v1) at +30s: done at +50s.")


def test_no_records_no_chart() -> None:
    assert serving_view([], good_rollout(30), [], T0, T0 + 60) is None


def _hand_made_run(make_run) -> Path:
    run = make_run(*example_experiments())
    info = json.loads((run.path / "run.json").read_text())
    start = datetime.fromisoformat(info["started_at"])
    end = datetime.fromisoformat(info["ended_at"])
    span = (end - start).total_seconds()
    with open(run.path / "faults.jsonl", "a") as f:
        for n in good_rollout(0):
            row = n.model_dump(mode="json")
            row["time"] = (start + (n.time - BASE) + timedelta(seconds=span / 2)).isoformat()
            f.write(json.dumps(row) + "\n")
    steps = int(span * 2)
    (run.path / "inference.jsonl").write_text("".join(
        dumps(InferenceRecord(time=start + timedelta(seconds=k / 2), status=200,
                              latency_ms=15 + k % 5, correct=True,
                              version="v2" if k > steps // 2 + 30 else "v1"))
        for k in range(steps)))
    return run.path


def test_a_report_with_inference_records_shows_the_chart(make_run) -> None:
    path = _hand_made_run(make_run)
    verdict = evaluate_run(path)
    paths = write_reports(verdict, path)
    html = paths["report.html"].read_text()
    section = html[html.index('<section class="card" id="serving">'):html.index('id="cost"')]
    assert "answered by v1" in section and "answered by v2" in section
    assert 'class="declared"' in section
    measured = [e for e in verdict.experiments if e.measured]
    assert measured and section.count('<rect class="fault"') == 2 * len(measured)
    for e in measured:
        assert f"<title>fault {e.name}</title>" in section
    md = paths["report.md"].read_text()
    assert "## Serving over the run" in md
    assert "rollout: v2 (from v1)" in md and "done at" in md


def test_a_report_without_inference_records_has_no_serving_section(make_run) -> None:
    run = make_run(*example_experiments())
    paths = write_reports(evaluate_run(run.path), run.path)
    assert 'id="serving"' not in paths["report.html"].read_text()
    assert "Serving" not in paths["report.md"].read_text()


def test_an_unreadable_inference_ledger_is_refused_naming_its_line(make_run) -> None:
    """The evidence loader reads inference.jsonl (the serving invariants judge it): a bad line
    stops the evaluation with the file, line and field named (exit 3), before any report."""
    from slo.evidence import EvidenceError

    path = _hand_made_run(make_run)
    lines = (path / "inference.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"latency_ms":', '"latency_ms":-')
    (path / "inference.jsonl").write_text("\n".join(lines) + "\n")
    why = "inference.jsonl: line 2: field latency_ms: Input should be greater than or equal to 0"
    with pytest.raises(EvidenceError, match=re.escape(why)):
        evaluate_run(path)

