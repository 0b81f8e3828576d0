"""What an injected fault may cost the run-wide SLIs (slo/fault_impact.py): the outcomes of a
non-key SLI an experiment declares, from its fault's start until its RTO has passed, are left
to that experiment; everything after its RTO, every SLI it does not declare and every key SLI
still counts against the run."""

from __future__ import annotations

from datetime import UTC, datetime

from slo import sli
from slo.evaluate import evaluate_run
from slo.evidence import Attempt
from slo.fault_impact import ImpactWindow, Judged, excuse, impact_windows
from slo.fixtures import ExperimentFixture
from slo.sli import Outcome

INF = float("inf")


def test_one_window_per_declared_non_key_sli_from_the_fault_to_its_rto() -> None:
    windows = impact_windows(
        [Judged("a", 100.0, 15.0, ("api-availability", "submission-durability")),
         Judged("b", None, 60.0, ("queue-age",)),  # not measured: nothing excused
         Judged("c", 300.0, 120.0, ("queue-age", "startup-success")),
         Judged("overload", 500.0, 4.0, ("api-availability",), rto_from=530.0)],
        [200.0, 290.0, 400.0, INF], key_slis={"submission-durability"})
    assert windows == [
        ImpactWindow("a", "api-availability", 100.0, 115.0),
        # cut at the next experiment's start: its fault is its own business
        ImpactWindow("c", "queue-age", 300.0, 400.0),
        ImpactWindow("c", "startup-success", 300.0, 400.0),
        # judged on goodput after the trigger: the RTO counts from the fault's end
        ImpactWindow("overload", "api-availability", 500.0, 534.0),
    ]


def test_outcomes_inside_a_window_of_their_own_sli_are_left_to_the_experiment() -> None:
    windows = [ImpactWindow("a", "api-availability", 100.0, 115.0),
               ImpactWindow("c", "queue-age", 100.0, 400.0)]
    outcomes = [Outcome(99.0, False), Outcome(100.0, False), Outcome(110.0, True),
                Outcome(115.0, False), Outcome(116.0, False)]
    got = excuse("api-availability", outcomes, windows)
    assert [o.time for o in got.kept] == [99.0, 116.0]
    assert got.by_experiment == {"a": 3} and got.count == 3 and got.bad == 2
    # another SLI's window excuses nothing here
    assert excuse("startup-success", outcomes, windows).kept == outcomes


def test_failures_after_the_rto_still_count_against_the_run(make_run) -> None:
    """api-replica-loss's local RTO is 15 s: requests failing for 2 s after the fault are the
    experiment's; failing for 25 s, the last 10 s count run-wide (and the RTO is missed)."""
    short = evaluate_run(make_run(ExperimentFixture("api-replica-loss",
                                                    api_error_seconds=2.0)).path)
    s = next(x for x in short.slis if x.name == "api-availability")
    assert s.value == 1.0 and s.excused_bad > 0
    assert s.excused_by.keys() == {"api-replica-loss"}
    check = next(c for c in short.checks if c.id == "sli.api-availability")
    assert check.status == "pass"
    assert f"({s.excused_bad} bad), judged by their experiments' RTO: api-replica-loss" \
        in check.message

    long = evaluate_run(make_run(ExperimentFixture("api-replica-loss",
                                                   api_error_seconds=25.0)).path)
    s = next(x for x in long.slis if x.name == "api-availability")
    assert s.total - s.good > 0 and s.excused_bad > 0, s
    assert next(c for c in long.checks if c.id == "sli.api-availability").status != "pass"
    assert next(c for c in long.checks if c.id == "api-replica-loss.rto").status == "fail"


def test_a_key_sli_is_never_excused(make_run) -> None:
    """Acknowledged work lost during a fault the experiment declares durability for."""
    v = evaluate_run(make_run(ExperimentFixture("api-replica-loss", lost_acks=3)).path)
    s = next(x for x in v.slis if x.name == "submission-durability")
    assert s.excused == 0 and s.total - s.good == 3
    assert next(c for c in v.checks if c.id == "sli.submission-durability").status == "fail"


def _attempt(state: str, started: bool) -> Attempt:
    t = datetime(2026, 12, 6, tzinfo=UTC)
    return Attempt(id=f"{state}-{started}", operation_id="op", number=1, agent_name="cpu-1",
                   state=state, created_at=t, started_at=t if started else None,
                   finished_at=t)


def test_startup_success_counts_failed_starts_not_attempts_whose_agent_was_lost() -> None:
    """As the live metric does (controlplane_startup_failures_total): an image, credential or
    data failure before running is a failed start; an agent killed before it started its
    attempt is not (its operation is judged by time to result and durability)."""
    outcomes = sli.startup_success([_attempt("failed", False), _attempt("lost", False),
                                    _attempt("succeeded", True), _attempt("lost", True)])
    assert sorted((o.subject, o.good) for o in outcomes) == [
        ("failed-False", False), ("lost-True", True), ("succeeded-True", True)]
