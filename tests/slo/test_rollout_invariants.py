"""bad-model-rollout's objectives (slo/rollout_invariants.py) on hand-made timelines shaped as
the rollout controller writes them (environments/local/serving_rollout.py) and inference-ledger
lines shaped as the Inferrer writes them; their registration under the names the recovery
objective lists."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from slo.evidence import FaultRecord
from slo.inference_ledger import InferenceRecord
from slo.invariants import KNOWN_INVARIANTS, check_invariant
from slo.rollout_invariants import (
    COST_FACTOR,
    bad_version_share,
    bad_versions,
    rolled_back_within_rto,
    rollouts,
)
from slo.sli import ts
from slo.specs import load_specs

T0 = datetime(2026, 12, 7, 5, 0, tzinfo=UTC)
BAD = ("v2-errors", "v2-garbage", "v2-slow")


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _note(s: float, what: str, **details: object) -> FaultRecord:
    return FaultRecord(time=_at(s), event="note", fault=what, target="local", details=details)


def _rollout(version: str, start: float, canary_at: float, decided: float, end: float | None,
             outcome: str = "rollback", expect: str | None = "rollback",
             reasons: tuple[str, ...] = ("error ratio 0.481 above 0.02 (13 of 27)",)
             ) -> list[FaultRecord]:
    """The notes of one rollout as the controller writes them: started (steps 10, 50, 100 %,
    4 s each), share 0 while the canary is redeployed, 10 % from ``canary_at``, decided at
    ``decided`` (rolled back: share 0 at once), ended at ``end`` after the canary's redeploy
    (None: left holding)."""
    out = [FaultRecord(time=_at(start), event="fault_start", fault="rollout", target="model-2",
                       details={"version": version}),
           _note(start, "rollout_start", version=version, steps=[10, 50, 100], step_seconds=4,
                 **({"expect": expect} if expect else {})),
           _note(start, "rollout_share", share=0, version="v1"),
           _note(canary_at, "rollout_share", share=10, version=version),
           _note(decided, "rollout_step", version=version, decision=outcome)]
    if outcome == "rollback":
        out.append(_note(decided, "rollout_share", share=0, version=version))
    if end is not None:
        if outcome == "rollback":
            out.append(_note(end, "rollout_share", share=50, version="v1"))
        out += [_note(end, "rollout_end", version=version, outcome=outcome, reasons=list(reasons)),
                FaultRecord(time=_at(end), event="fault_end", fault="rollout", target="model-2")]
    return out


def _three(hold: bool = False) -> list[FaultRecord]:
    """Three bad rollouts of 20 s each from t=10 (the experiment's shape)."""
    out = []
    for i, version in enumerate(BAD):
        s = 10 + 20 * i
        out += _rollout(version, s, s + 5, s + 9, None if hold else s + 14,
                        outcome="hold" if hold else "rollback")
    return out


def _traffic(canary_share: float, until: float = 100.0) -> list[InferenceRecord]:
    """A request every 0.1 s from t=0; while a bad version holds its 4 s step (t = s+5 .. s+9
    of each rollout above), the canary answers ``canary_share`` of them (every k-th), half of
    v2-errors' answers failing with a 500 that carries no version."""
    out = []
    every = round(1 / canary_share)
    for i in range(int(until * 10)):
        t = i / 10
        version, status = "v1", 200
        for j, bad in enumerate(BAD):
            s = 10 + 20 * j
            if s + 5 <= t < s + 9 and i % every == 0:
                version = bad
                if bad == "v2-errors" and (i // every) % 2:
                    version, status = None, 500
        out.append(InferenceRecord(time=_at(t), status=status, latency_ms=12.0, version=version,
                                   correct=None if status != 200 else version != "v2-garbage"))
    return out


def _window(end: float = 100.0) -> tuple[float, float]:
    return ts(_at(10)), ts(_at(end))


def test_the_timeline_tells_each_rollout_and_the_versions_declared_bad() -> None:
    good = _rollout("v2", 70, 75, 90, 95, outcome="done", expect="done", reasons=())
    found = rollouts(_three() + good, *_window())
    assert [(r.version, r.expect, r.outcome, r.end - r.start) for r in found] == [
        ("v2-errors", "rollback", "rollback", 14.0), ("v2-garbage", "rollback", "rollback", 14.0),
        ("v2-slow", "rollback", "rollback", 14.0), ("v2", "done", "done", 25.0)]
    # served from its first share above 0 to its share at 0 again; a first step of 10 % for 4 s
    assert [(r.exposed - r.start, r.withdrawn - r.exposed) for r in found[:3]] == [(5, 4)] * 3
    assert found[0].cost_seconds == 0.4
    assert found[3].withdrawn is None  # done: never taken away
    assert bad_versions(_three() + good, *_window()) == frozenset(BAD)
    # a rollout before the window is another experiment's
    assert bad_versions(_three(), ts(_at(31)), ts(_at(100))) == frozenset({"v2-slow"})


def test_each_bad_version_rolled_back_within_the_rto_holds_and_says_how_long() -> None:
    r = rolled_back_within_rto(_three(), *_window(), 20)
    assert r.judged == 3 and r.violations == () and r.no_data is None
    assert r.measured == ("v2-errors rollback after serving 4.0 s (rollout 14.0 s); v2-garbage "
                          "rollback after serving 4.0 s (rollout 14.0 s); v2-slow rollback after "
                          "serving 4.0 s (rollout 14.0 s) (RTO 20 s)")


def test_the_redeploys_at_share_0_are_not_counted() -> None:
    # the canary's redeploys took 30 s on each side (a loaded machine): the clients lost nothing
    slow = _rollout("v2-errors", 10, 40, 44, 75)
    r = rolled_back_within_rto(slow, *_window(), 20)
    assert r.violations == ()
    assert r.measured == "v2-errors rollback after serving 4.0 s (rollout 65.0 s) (RTO 20 s)"


def test_a_bad_version_held_instead_of_rolled_back_is_a_violation() -> None:
    # rollback-off's shape: the controller held, ran out of holds and ended "hold"
    held = _rollout("v2-errors", 10, 15, 19, 31, outcome="hold",
                    reasons=("error ratio 0.5 above 0.02 (20 of 40)", "rollback is off"))
    r = rolled_back_within_rto(held, *_window(), 20)
    assert r.violations == (("v2-errors at 05:00:10: ended hold, not rollback, its version "
                             "still serving after 16.0 s (rollout 21.0 s) (error ratio 0.5 above "
                             "0.02 (20 of 40); rollback is off)"),)
    # ... or never ended at all (still on the canary at the horizon)
    r = rolled_back_within_rto(_three(hold=True), *_window(), 20)
    assert len(r.violations) == 3
    assert r.violations[0] == ("v2-errors at 05:00:10: no rollout_end by the end of the window "
                               "(still on the canary)")


def test_a_rollback_later_than_the_rto_is_a_violation() -> None:
    late = _rollout("v2-slow", 10, 15, 40, 60)
    r = rolled_back_within_rto(late, *_window(), 20)
    assert r.violations == (("v2-slow at 05:00:10: its version served 25.0 s before it was rolled "
                             "back (RTO 20 s, rollout 50.0 s) (error ratio 0.481 above 0.02 (13 "
                             "of 27))"),)
    assert rolled_back_within_rto(late, *_window(), 30).violations == ()


def test_only_rollouts_declared_bad_are_judged_and_none_is_no_data() -> None:
    good = _rollout("v2", 10, 15, 30, 35, outcome="done", expect="done", reasons=())
    assert rolled_back_within_rto(good, *_window(), 20).no_data is not None
    # a rollout without a declaration (e.g. `gameday env rollout` by hand) is not judged
    undeclared = _rollout("v2-errors", 10, 15, 19, None, outcome="hold", expect=None)
    assert rolled_back_within_rto(undeclared, *_window(), 20).no_data is not None
    assert bad_version_share(_traffic(0.1), good, *_window()).no_data is not None


def test_the_canary_at_its_first_step_costs_under_the_bound() -> None:
    r = bad_version_share(_traffic(0.1), _three(), *_window())
    assert r.violations == () and r.judged == 900
    # 3 versions x 4 s x 10 requests/s x 10 %: 12 of 900 (v2-errors' failed ones included),
    # against twice the policy's cost: 2 x 3 x 0.4 s over the 90 s window
    assert r.measured == ("12 of 900 requests (0.0133, at most 0.0267: 2x 1.2 s of all traffic "
                          "over 90 s) answered by a bad version (v2-errors 2, v2-garbage 4, "
                          "v2-slow 4) or failed (2)")


def test_a_canary_given_a_full_shares_weight_is_a_violation() -> None:
    # canary-weight-ignored's shape: weights 90:100, the canary answers about half the requests
    r = bad_version_share(_traffic(0.5), _three(), *_window())
    assert r.measured is not None and r.violations == (r.measured,)
    assert r.measured.startswith("60 of 900 requests (0.0667, at most 0.0267: ")


def test_a_failed_request_counts_against_the_bound_and_only_the_window_counts() -> None:
    lines = _traffic(0.1)
    failing = [InferenceRecord(time=_at(60 + i / 10), error="connection reset", latency_ms=1.0)
               for i in range(20)]
    assert bad_version_share(lines + failing, _three(), *_window()).violations
    # the same failures after the window are another experiment's
    assert bad_version_share(lines + failing, _three(), *_window(59.0)).violations == ()


def test_a_rollout_whose_policy_is_not_noted_is_no_data() -> None:
    notes = [f if f.fault != "rollout_start" else _note(10, "rollout_start", version="v2-slow",
                                                         expect="rollback")
             for f in _rollout("v2-slow", 10, 15, 19, 31)]
    r = bad_version_share(_traffic(0.1), notes, *_window())
    assert r.no_data == "rollout_start names no first step or step_seconds: v2-slow at 05:00:10"


def test_too_few_predictions_is_no_data_never_a_pass() -> None:
    r = bad_version_share(_traffic(0.1)[:150], _three(), *_window())
    assert r.violations == () and r.judged == 50
    assert r.no_data == ("50 prediction requests in the window, fewer than the 100 a share of a "
                         "few percent needs (inference.jsonl: is the Inferrer user running?)")


def test_registered_under_the_names_the_recovery_objective_lists() -> None:
    ro = load_specs().recovery_objectives["bad-model-rollout"]
    assert ro.rto_seconds == 20  # local
    assert list(ro.invariants) == ["rolled-back-within-rto", "bad-version-share"]
    assert set(ro.invariants) <= set(KNOWN_INVARIANTS)
    evidence = SimpleNamespace(faults=tuple(_three()), inference=tuple(_traffic(0.1)))
    assert check_invariant("rolled-back-within-rto", evidence, *_window()).no_data == (
        "no RTO to judge it against")
    assert check_invariant("rolled-back-within-rto", evidence, *_window(),
                           rto_seconds=20).judged == 3
    assert check_invariant("bad-version-share", evidence, *_window()).measured.startswith("12 of")
    assert COST_FACTOR == 2.0
