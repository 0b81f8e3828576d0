"""The rollout controller's decision (controlplane/serving/rollout.py): pure."""

from __future__ import annotations

import pytest

from controlplane.serving.rollout import Action, Analysis, Policy, decide, failures, weights

POLICY = Policy(steps=(10, 50, 100), max_error_ratio=0.02, max_p99_ms=250, min_requests=20)
HEALTHY = Analysis(requests=100, errors=1, p99_ms=40.0, golden_total=30, golden_wrong=0)


def test_a_healthy_canary_steps_up_then_finishes() -> None:
    assert decide(POLICY, 0, HEALTHY).action is Action.STEP
    assert decide(POLICY, 0, HEALTHY).share == 50
    assert decide(POLICY, 1, HEALTHY).share == 100
    done = decide(POLICY, 2, HEALTHY)
    assert (done.action, done.share) == (Action.DONE, 100)


@pytest.mark.parametrize(("analysis", "reason"), [
    (Analysis(100, 3, 40.0, 30, 0), "error ratio 0.030 above 0.02 (3 of 100)"),
    (Analysis(100, 0, 420.0, 30, 0), "p99 420 ms above 250 ms"),
    (Analysis(100, 0, 40.0, 30, 30), "30 of 30 golden answers wrong"),
])
def test_each_signal_alone_rolls_back(analysis: Analysis, reason: str) -> None:
    decision = decide(POLICY, 1, analysis)
    assert (decision.action, decision.share, decision.reasons) == (Action.ROLLBACK, 0, (reason,))


def test_with_rollback_off_a_failing_canary_keeps_its_share() -> None:
    off = Policy(steps=(10, 50, 100), rollback=False)
    decision = decide(off, 1, Analysis(100, 50, 40.0, 30, 0))
    assert (decision.action, decision.share) == (Action.HOLD, 50)
    assert decision.reasons[-1] == "rollback is off"


def test_too_few_requests_is_a_hold_never_a_pass() -> None:
    decision = decide(POLICY, 0, Analysis(5, 0, 10.0, 5, 0))
    assert (decision.action, decision.share) == (Action.HOLD, 10)
    assert "too few to judge" in decision.reasons[0]
    assert failures(POLICY, Analysis(0, 0, None, 0, 0)) == []


def test_weights_and_bad_policies() -> None:
    assert weights(0) == (100, 0) and weights(25) == (75, 25) and weights(100) == (0, 100)
    with pytest.raises(ValueError, match="within 0..100"):
        weights(101)
    with pytest.raises(ValueError, match="strictly increasing percents"):
        Policy(steps=(50, 10))
    with pytest.raises(ValueError, match="max_error_ratio 2"):
        Policy(max_error_ratio=2)
