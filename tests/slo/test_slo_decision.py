"""Exit code, result and reason: precedence 3 > 2 > 1 > 0, and never "pass" above a non-zero
exit code, whatever mix of causes."""

from __future__ import annotations

import itertools

import pytest

from slo.decision import EXIT_EVIDENCE, EXIT_EXPERIMENT, EXIT_OBJECTIVE, EXIT_PASS, decide
from slo.scoring import GateOutcome, Status
from slo.verdict import Check, ExperimentResult


def _check(id_: str, status: str, key: bool = False) -> Check:
    return Check(id=id_, experiment=None, objective=id_, measured=None, expected="",
                 status=status, weight=1.0, key=key, message="")


OK = ExperimentResult(name="ok", measured=True, experiment_ok=True, journal_status="completed")
MISSING = ExperimentResult(name="gone", measured=False, journal_present=False,
                           not_measured_reason="no journal; runner: refused: unhealthy")
NOT_MEASURED = ExperimentResult(name="idle", measured=False, journal_status="completed",
                                not_measured_reason="steady state not met before the method")
DEVIATED = ExperimentResult(name="bent", measured=True, experiment_ok=False, deviated=True,
                            journal_status="completed")
PASSING = GateOutcome(Status.PASS, 100.0, False, 3)


@pytest.mark.parametrize(
    ("missing", "key_fail", "bad_run", "expected"),
    [(m, k, b, EXIT_EVIDENCE if m else EXIT_OBJECTIVE if k else EXIT_EXPERIMENT if b
      else EXIT_PASS) for m, k, b in itertools.product([False, True], repeat=3)],
)
def test_precedence_and_reason_name_every_cause(
    missing: bool, key_fail: bool, bad_run: bool, expected: int
) -> None:
    experiments = [OK] + ([MISSING] if missing else []) + ([NOT_MEASURED] if bad_run else [])
    checks = [_check("sli.a", "pass"), _check("gone.rto", "not_measured", key=True)]
    if key_fail:
        checks.append(_check("ok.rpo.artifacts", "fail", key=True))
    gate = GateOutcome(Status.FAIL if key_fail else Status.PASS, 50.0 if key_fail else 100.0,
                       key_fail, len(checks))
    d = decide(checks, experiments, gate, 75)
    assert d.exit_code == expected
    assert d.result == {EXIT_EVIDENCE: "error", EXIT_OBJECTIVE: "fail",
                        EXIT_EXPERIMENT: "fail", EXIT_PASS: "pass"}[expected]
    assert ("missing from the evidence: gone (no journal; runner: refused: unhealthy)"
            in d.reason) == missing
    assert ("key objective(s) missed: ok.rpo.artifacts" in d.reason) == key_fail
    assert ("not measured: idle (steady state not met before the method)" in d.reason) == bad_run
    assert (d.reason == "all objectives met") == (expected == EXIT_PASS)


def test_failed_experiment_is_exit_1_and_never_pass() -> None:
    d = decide([_check("sli.a", "pass")], [DEVIATED], PASSING, 75)
    assert (d.exit_code, d.result) == (EXIT_EXPERIMENT, "fail")
    assert d.reason == "experiment(s) failed: bent (journal status completed, deviated)"


def test_warning_gate_and_low_score() -> None:
    warned = decide([_check("sli.a", "warning")], [OK], GateOutcome(Status.WARNING, 80.0, False, 1),
                    75)
    assert (warned.exit_code, warned.result) == (EXIT_PASS, "warning")
    assert warned.reason == "gate warning; warning(s): sli.a"
    low = decide([_check("sli.a", "fail")], [OK], GateOutcome(Status.FAIL, 50.0, False, 1), 75)
    assert (low.exit_code, low.result) == (EXIT_OBJECTIVE, "fail")
    assert low.reason == "score 50.0 below warning threshold 75"


def test_no_data_is_named_but_does_not_fail() -> None:
    d = decide([_check("sli.a", "pass"), _check("sli.b", "no_data")], [OK], PASSING, 75)
    assert (d.exit_code, d.result) == (EXIT_PASS, "pass")
    assert d.reason == "all objectives met; no data (not scored): sli.b"
