"""The tracking invariants (pure): the trainers' own account against what MLflow holds."""

from __future__ import annotations

from typing import Any

from slo.evidence import Attempt, Event, TrackingRun
from slo.tracking_invariants import (
    metric_points_kept,
    one_run_per_attempt,
    runs_terminated,
    tracked,
    training_unaffected,
)

T0 = "2026-12-07T03:00:00Z"


def _attempt(op: str, state: str = "succeeded") -> Attempt:
    return Attempt(id=f"a-{op}", operation_id=op, number=1, state=state, created_at=T0)


def _summary(op: str, logged: int = 200, wait: float = 3.0, held: float = 0.0001) -> Event:
    data: dict[str, Any] = {"tracking": {"points_logged": logged, "points_dropped": 0,
                                         "finish_wait_seconds": wait,
                                         "longest_log_call_seconds": held}}
    return Event(attempt_id=f"a-{op}", operation_id=op, time=T0, kind="log", data=data)


def _run(op: str, held: int = 200, status: str = "FINISHED", rid: str = "") -> TrackingRun:
    return TrackingRun(run_id=rid or f"r-{op}", attempt_tag=f"{op}/attempt-1", status=status,
                       metric_points={"loss": held})


def _judge(attempts: list[Attempt], events: list[Event], runs: list[TrackingRun] | None,
           check: Any) -> Any:
    subjects = tracked(attempts, events, runs or [], 0, 4e9)
    return check(subjects, runs)


def test_a_healthy_game_day_holds_every_invariant() -> None:
    attempts = [_attempt("op1"), _attempt("op2")]
    events = [_summary("op1"), _summary("op2")]
    runs = [_run("op1"), _run("op2")]
    for check in (metric_points_kept, one_run_per_attempt, runs_terminated,
                  training_unaffected):
        result = _judge(attempts, events, runs, check)
        assert (result.judged, result.violations, result.no_data) == (2, (), None), result


def test_points_missing_in_mlflow_are_lost() -> None:
    result = _judge([_attempt("op1")], [_summary("op1", logged=200)], [_run("op1", held=170)],
                    metric_points_kept)
    lost = ("op1/attempt-1: 30 of 200 metric points lost (MLflow holds 170; the sink counted 0 "
            "dropped by its bound)")
    assert result.violations == (lost,)


def test_a_trainer_that_never_reported_is_judged_not_skipped() -> None:
    result = _judge([_attempt("op1")], [], [_run("op1")], metric_points_kept)
    assert result.violations == ("op1/attempt-1: the trainer never reported what it logged",)


def test_two_runs_for_one_attempt_are_a_duplicate() -> None:
    result = _judge([_attempt("op1")], [_summary("op1")],
                    [_run("op1", rid="r1"), _run("op1", rid="r2")], one_run_per_attempt)
    assert result.violations == ("op1/attempt-1: 2 runs (r1, r2)",)


def test_a_run_left_running_or_missing_is_not_terminated() -> None:
    result = _judge([_attempt("op1"), _attempt("op2")], [_summary("op1"), _summary("op2")],
                    [_run("op1", status="RUNNING")], runs_terminated)
    assert set(result.violations) == {"op1/attempt-1: run r-op1 left RUNNING",
                                      "op2/attempt-1: no run in MLflow"}


def test_training_failed_or_waiting_past_the_bound_is_affected() -> None:
    result = _judge([_attempt("op1", state="failed"), _attempt("op2"), _attempt("op3")],
                    [_summary("op1"), _summary("op2", wait=300.0), _summary("op3", held=62.4)],
                    [_run("op1"), _run("op2"), _run("op3")], training_unaffected)
    assert set(result.violations) == {
        "op1/attempt-1: training failed",
        "op2/attempt-1: waited 300.0 s for tracking at its end (bound 125 s)",
        "op3/attempt-1: a tracking call held training 62.4 s (bound 1 s)"}


def test_no_snapshot_or_no_tracked_attempt_is_no_data_never_a_pass() -> None:
    assert _judge([_attempt("op1")], [_summary("op1")], None, runs_terminated).no_data
    untracked = _judge([_attempt("op1")], [], [], metric_points_kept)
    assert untracked.no_data == "no tracked attempt in the window"


def test_an_attempt_that_started_before_the_fault_and_trained_through_it_is_judged() -> None:
    a = Attempt(id="a-op1", operation_id="op1", number=1, state="succeeded",
                created_at="2026-12-07T03:00:00Z", finished_at="2026-12-07T03:01:00Z")
    fault = 1796612430.0  # 03:00:30: after the attempt's start, before its end
    assert [t.identity for t in tracked([a], [_summary("op1")], [_run("op1")], fault,
                                        fault + 60)] == ["op1/attempt-1"]
    assert tracked([a], [_summary("op1")], [_run("op1")], fault + 60, fault + 120) == []
