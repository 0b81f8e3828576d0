"""gameday bench tracking-peer's pure parts: a peer trainer's ledger judged by the same four
tracking invariants as our workload's sink, and its figures."""

from __future__ import annotations

from typing import Any

from gameday.tracking_peer import figures, judge, peer_verdict
from slo.evidence import TrackingRun


def _ledger(i: int, outcome: str, logged: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"attempt_id": f"peer-x-{i}/attempt-1", "outcome": outcome, "points_logged": logged,
            "ended": outcome == "succeeded", "calls": calls, "seconds": 30.0}


def test_a_failed_peer_trainer_with_its_run_left_running_breaks_three_promises() -> None:
    ledgers = [_ledger(0, "succeeded", 200, [{"call": "end_run", "seconds": 0.1}]),
               _ledger(1, "failed", 40, [{"call": "log_metric", "seconds": 62.5,
                                          "error": "MlflowException(...)"}])]
    runs = [TrackingRun(run_id="r0", attempt_tag="peer-x-0/attempt-1", status="FINISHED",
                        metric_points={"loss": 200}),
            TrackingRun(run_id="r1", attempt_tag="peer-x-1/attempt-1", status="RUNNING",
                        metric_points={"loss": 40})]
    got = {r["name"]: r for r in judge(ledgers, runs, 1e9, 1e9 + 100)}
    assert got["metric-points-kept"]["violations"] == []  # what it was acknowledged is there
    assert got["one-run-per-attempt"]["violations"] == []
    assert got["runs-terminated"]["violations"] == ["peer-x-1/attempt-1: run r1 left RUNNING"]
    assert got["training-unaffected"]["violations"] == [
        "peer-x-1/attempt-1: training failed",
        "peer-x-1/attempt-1: a tracking call held training 62.5 s (bound 1 s)"]


def test_figures_name_the_longest_blocking_call() -> None:
    led = _ledger(0, "succeeded", 200, [{"call": "log_metric", "seconds": 12.0},
                                        {"call": "log_metric", "seconds": 3.5},
                                        {"call": "end_run", "seconds": 0.7}])
    f = figures(led)
    assert (f["longest_log_metric_s"], f["log_metric_blocked_s"], f["slow_or_failed_calls"]) == (
        12.0, 15.5, 3)


def test_the_peer_verdict_sits_beside_a_game_day_in_slo_compare() -> None:
    from slo.compare import comparison_rows
    from slo.verdict import ExperimentResult, InvariantOutcome, Verdict

    ledgers = [_ledger(0, "succeeded", 200, [{"call": "log_metric", "seconds": 62.9}])]
    runs = [TrackingRun(run_id="r0", attempt_tag="peer-x-0/attempt-1", status="FINISHED",
                        metric_points={"loss": 200})]
    invariants = judge(ledgers, runs, 1e9, 1e9 + 100)
    peer = peer_verdict("tracking-peer-x", 1e9, 1e9 + 100, 1e9 + 5, 1e9 + 60, invariants,
                        {"peer-x-0/attempt-1": figures(ledgers[0])})
    assert (peer.result, peer.exit_code, peer.platform) == ("fail", 2, "mlflow-client")
    ours = Verdict(run_id="gd", env="local", suite="ci", platform="controlplane", started_at=0,
                   ended_at=1, result="pass", score=100.0, key_failed=False, exit_code=0,
                   reason="ok", slis=[], checks=[], findings=[], experiments=[ExperimentResult(
                       name="tracking-outage", experiment_ok=True, rto_seconds=120.0,
                       recovery_seconds=3.0, requests=300, failed_requests=0,
                       acknowledged_lost=0, invariants=[InvariantOutcome(
                           name="training-unaffected", judged=3)])])
    rows = dict(comparison_rows([ours, peer]))
    held = "peer-x-0/attempt-1: a tracking call held training 62.9 s (bound 1 s)"
    assert rows["experiment tracking-outage invariant training-unaffected"] == [
        "0 violations (judged 3)", f"1 violation(s) (judged 1): {held}"]
    assert rows["experiment tracking-outage"][1].startswith("fail (no load, no RTO")
