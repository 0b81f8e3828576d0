"""Property tests for the pure math: budget, burn rates, durability, series, Keptn scoring."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from slo import budget, sli
from slo.evidence import Attempt, Event, LedgerEntry, Operation
from slo.scoring import Criterion, Scored, Status, check_status, gate_outcome

targets = st.floats(min_value=0.5, max_value=0.99999)
counts = st.integers(min_value=1, max_value=100_000)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@given(total=counts, data=st.data(), target=targets)
def test_burn_rate_at_most_one_iff_objective_met(
    total: int, data: st.DataObject, target: float
) -> None:
    good = data.draw(st.integers(min_value=0, max_value=total))
    value = budget.sli_value(good, total)
    rate = budget.burn_rate(1 - value, target)
    # a tolerance: (1 - value) and (1 - target) are both rounded floats
    if abs(value - target) > 1e-9:
        assert (rate <= 1.0) == budget.objective_met(value, target)


@given(
    rate=st.floats(min_value=0, max_value=1000),
    window=st.floats(min_value=60, max_value=1e7),
    duration=st.floats(min_value=0, max_value=1e7),
    k=st.floats(min_value=0.1, max_value=10),
)
def test_budget_consumption_is_linear_in_time_and_rate(
    rate: float, window: float, duration: float, k: float
) -> None:
    base = budget.budget_consumed(rate, duration, window)
    assert abs(budget.budget_consumed(rate, duration * k, window) - base * k) <= 1e-9 * max(
        1, base * k
    )
    assert abs(budget.budget_consumed(rate * k, duration, window) - base * k) <= 1e-9 * max(
        1, base * k
    )
    # burning exactly at 1x for a whole window spends exactly the budget
    assert abs(budget.budget_consumed(1.0, window, window) - 1.0) < 1e-12


@given(
    target=targets,
    window=st.floats(min_value=60, max_value=1e7),
    duration=st.floats(min_value=1, max_value=1e7),
)
def test_value_at_full_budget_spends_exactly_one_budget(
    target: float, window: float, duration: float
) -> None:
    v = budget.value_at_full_budget(target, duration, window)
    if duration <= window:
        assert v <= target + 1e-12  # a run shorter than the window may be worse than target
    if v > 0:
        spent = budget.budget_consumed(budget.burn_rate(1 - v, target), duration, window)
        assert abs(spent - 1.0) < 1e-6


@given(
    default=st.floats(min_value=1, max_value=1e6),
    window=st.floats(min_value=60, max_value=1e8),
    floor=st.floats(min_value=1, max_value=3600),
)
def test_scaled_window_keeps_budget_share_and_floor(
    default: float, window: float, floor: float
) -> None:
    scaled = budget.scaled_window(default, window, floor)
    assert scaled >= floor
    if scaled > floor:
        assert abs(scaled / window - default / (30 * 86400)) < 1e-9


@given(n=st.integers(min_value=1, max_value=300), data=st.data())
def test_durability_counts_missing_and_duplicated(n: int, data: st.DataObject) -> None:
    keys = [f"k{i}" for i in range(n)]
    lost = data.draw(st.sets(st.sampled_from(keys), max_size=n))
    dup = data.draw(st.sets(st.sampled_from(keys), max_size=n)) - lost
    ledger = [
        LedgerEntry(
            operation_id=f"op-{k}",
            idempotency_key=k,
            acked_at=T0 + timedelta(seconds=i),
            project="p",
        )
        for i, k in enumerate(keys)
    ]
    ledger += ledger[: n // 3]  # client retries acknowledged with the same key are one submission
    ops = []
    for k in keys:
        copies = 0 if k in lost else 2 if k in dup else 1
        ops += [
            Operation(
                id=f"op-{k}-{c}", project="p", state="succeeded", idempotency_key=k, created_at=T0
            )
            for c in range(copies)
        ]
    audit = sli.submission_durability(ledger, ops)
    good, total = sli.count(audit.outcomes)
    assert total == n
    assert good == n - len(lost) - len(dup)
    assert set(audit.missing) == lost and set(audit.duplicated) == dup


def _ack(key: str, op_id: str, second: int = 0) -> LedgerEntry:
    return LedgerEntry(operation_id=op_id, idempotency_key=key, project="p",
                       acked_at=T0 + timedelta(seconds=second))


def _op(op_id: str, key: str | None) -> Operation:
    return Operation(id=op_id, project="p", state="succeeded", idempotency_key=key,
                     created_at=T0)


def test_same_key_acknowledged_under_two_operation_ids_is_duplicated() -> None:
    # the retry created a new operation: the store holds one, the client was told two ids
    audit = sli.submission_durability(
        [_ack("k1", "op-a", 0), _ack("k1", "op-b", 1), _ack("k2", "op-c", 2)],
        [_op("op-b", "k1"), _op("op-c", "k2")],
    )
    assert audit.duplicated == ("k1",) and audit.missing == ()
    assert audit.matched_by_key_only == ("k1",)
    assert [o.good for o in audit.outcomes] == [False, True]


def test_ack_answered_under_a_new_id_is_matched_by_key_only() -> None:
    audit = sli.submission_durability([_ack("k1", "op-old")], [_op("op-new", "k1")])
    assert audit.matched_by_key_only == ("k1",)
    assert audit.duplicated == () and audit.missing == ()  # stored once: still durable
    # the store lost the key column but kept the acknowledged operation: present, not by key
    audit = sli.submission_durability([_ack("k1", "op-1")], [_op("op-1", None)])
    assert audit.missing == () and audit.matched_by_key_only == ()


outcome_lists = st.lists(
    st.builds(sli.Outcome, time=st.floats(min_value=0, max_value=1000), good=st.booleans()),
    max_size=200,
)


@given(outcomes=outcome_lists, window=st.floats(min_value=0.5, max_value=200))
def test_rolling_ratio_is_a_share_of_the_window(outcomes: list[sli.Outcome], window: float) -> None:
    times = sli.sample_times(0, 1000, 7.5)
    values = sli.rolling_ratio(outcomes, times, window)
    for t, v in zip(times, values):
        inside = [o for o in outcomes if t - window < o.time <= t]
        if not inside:
            assert v is None
        else:
            assert v is not None and abs(v - sum(o.good for o in inside) / len(inside)) < 1e-12


series = st.lists(
    st.one_of(st.none(), st.floats(min_value=0, max_value=1)), min_size=1, max_size=80
)


@given(
    values=series,
    target=st.floats(min_value=0.5, max_value=0.999),
    hold=st.integers(min_value=1, max_value=5),
    fault=st.integers(min_value=0, max_value=20),
    horizon=st.integers(min_value=0, max_value=90),
)
def test_recovery_is_the_final_good_run_before_the_horizon(
    values: list[float | None], target: float, hold: int, fault: int, horizon: int
) -> None:
    times = [float(i) for i in range(len(values))]
    rec = sli.recovery_time(times, values, target, float(fault), hold, float(horizon))
    seen = [(t, v) for t, v in zip(times, values) if fault <= t <= horizon and v is not None]
    bad = [t for t, v in seen if v < target]
    if not bad:
        assert rec == 0.0
    elif rec is None:
        # still breached at the horizon, or back too late to hold
        assert sum(1 for t, _ in seen if t > bad[-1]) < hold
    else:
        back = fault + rec
        assert back > bad[-1]  # no breach after it before the horizon
        assert all(v >= target for t, v in seen if t >= back)
        assert sum(1 for t, _ in seen if t >= back) >= hold
        # it is the first good sample after the last breach
        assert not [t for t, _ in seen if bad[-1] < t < back]


@given(values=series, target=st.floats(min_value=0.5, max_value=0.999),
       hold=st.integers(min_value=1, max_value=5))
def test_a_breach_at_the_horizon_is_never_a_recovery(
    values: list[float | None], target: float, hold: int
) -> None:
    times = [float(i) for i in range(len(values) + 1)]
    stuck = [*values, 0.0]  # the last sample before the horizon is a breach
    assert sli.recovery_time(times, stuck, target, 0.0, hold, times[-1]) is None


def test_stuck_for_good_after_the_fault_never_recovered() -> None:
    # fault at 10 for 10 s: fine throughout, then broken from 40 to the horizon at 60
    times = [float(t) for t in range(0, 65, 5)]
    values = [1.0 if t < 40 else 0.5 for t in times]
    assert sli.recovery_time(times, values, 0.99, 10.0, 3, 60.0) is None
    # the old "until fault end + one window" cut-off would have called this 0 s
    assert sli.first_breach(times, values, 0.99, 10.0, 20.0 + 10.0) is None


def test_recovery_counts_from_the_last_breach_not_the_first_good_run() -> None:
    times = [float(t) for t in range(0, 105, 5)]
    values = [1.0] * len(times)
    for t in (15, 20, 55):  # outage, a held recovery at 25, then broken again at 55
        values[times.index(float(t))] = 0.0
    assert sli.recovery_time(times, values, 0.99, 10.0, 3, 100.0) == 60.0 - 10.0
    # a breach after the horizon belongs to whatever comes next
    assert sli.recovery_time(times, values, 0.99, 10.0, 3, 50.0) == 25.0 - 10.0
    assert sli.recovery_time(times, [1.0] * len(times), 0.99, 10.0, 3, 100.0) == 0.0
    # back, but not held for three samples before the horizon
    assert sli.recovery_time(times, values, 0.99, 10.0, 3, 65.0) is None


@given(
    value=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    limit=st.floats(min_value=0, max_value=1e6),
    pct=st.floats(min_value=0, max_value=500),
)
def test_criteria_absolute_and_relative(value: float, limit: float, pct: float) -> None:
    assert Criterion.parse(f"<={limit!r}").holds(value, None) == (value <= limit)
    rel = Criterion.parse(f"<=+{pct!r}%")
    assert rel.holds(value, None) is None  # no baseline: the criterion does not apply
    assert rel.holds(value, limit) == (value <= limit + limit * pct / 100)


statuses = st.sampled_from(
    [Status.PASS, Status.WARNING, Status.FAIL, Status.NOT_MEASURED, Status.NO_DATA, None])
scored = st.builds(
    Scored, status=statuses, weight=st.floats(min_value=0.1, max_value=10), key=st.booleans()
)


@given(checks=st.lists(scored, max_size=30))
def test_gate_score_bounds_and_key_failures(checks: list[Scored]) -> None:
    outcome = gate_outcome(checks, 90, 75)
    if outcome.score is not None:
        assert 0 <= outcome.score <= 100
    if any(c.key and c.status is Status.FAIL for c in checks):
        assert outcome.status is Status.FAIL
    if checks and all(c.status is Status.PASS for c in checks):
        assert outcome.status is Status.PASS and outcome.score == 100


@given(checks=st.lists(scored, min_size=1, max_size=30), data=st.data())
def test_improving_a_check_never_lowers_the_score(
    checks: list[Scored], data: st.DataObject
) -> None:
    i = data.draw(st.integers(min_value=0, max_value=len(checks) - 1))
    assume(checks[i].status in (Status.FAIL, Status.WARNING))
    better = list(checks)
    better[i] = Scored(Status.PASS, checks[i].weight, checks[i].key)
    before, after = gate_outcome(checks, 90, 75), gate_outcome(better, 90, 75)
    assert before.score is not None and after.score is not None
    assert after.score >= before.score
    order = [Status.FAIL, Status.WARNING, Status.PASS]
    assert order.index(after.status) >= order.index(before.status)


@given(value=st.floats(min_value=0, max_value=100), limit=st.floats(min_value=0, max_value=100))
def test_check_status_warning_band(value: float, limit: float) -> None:
    status = check_status(
        value, [Criterion.parse(f"<={limit!r}")], [Criterion.parse(f"<={limit * 2!r}")]
    )
    expected = (
        Status.PASS if value <= limit else Status.WARNING if value <= limit * 2 else Status.FAIL
    )
    assert status is expected
    assert check_status(None, [Criterion.parse("<=1")]) is None


@given(checks=st.lists(scored, max_size=30))
def test_only_pass_warning_fail_are_scored(checks: list[Scored]) -> None:
    outcome = gate_outcome(checks, 90, 75)
    scored = [c for c in checks if c.status in (Status.PASS, Status.WARNING, Status.FAIL)
              or (c.status is None and c.key)]
    assert outcome.scored == len(scored)
    # reported-only statuses never change the score
    extra = [Scored(Status.NOT_MEASURED, 5.0, True), Scored(Status.NO_DATA, 5.0, False)]
    assert gate_outcome(checks + extra, 90, 75) == outcome


def test_a_key_check_without_status_fails_the_gate_and_a_non_key_one_is_no_data() -> None:
    assert gate_outcome([Scored(None, 1.0, True)], 90, 75).status is Status.FAIL
    non_key = gate_outcome([Scored(None, 1.0, False), Scored(Status.PASS, 1.0, False)], 90, 75)
    assert non_key.status is Status.PASS and non_key.scored == 1


def _transition(op: str, seconds: float, to_state: str) -> Event:
    return Event(operation_id=op, time=T0 + timedelta(seconds=seconds), kind="transition",
                 to_state=to_state)


def test_queue_age_counts_blocked_waiting_and_stops_at_dispatch() -> None:
    # node pool exhausted: queued, blocked (no eligible destination up), queued, dispatched
    events = {"op": [_transition("op", 0, "accepted"), _transition("op", 1, "queued"),
                     _transition("op", 2, "blocked"), _transition("op", 50, "queued"),
                     _transition("op", 51, "dispatched"), _transition("op", 52, "running")]}
    assert sli.queued_intervals(events, T0.timestamp() + 100) == [
        ("op", T0.timestamp() + 1, T0.timestamp() + 51)]
    # blocked for good: still waiting at the snapshot
    stuck = {"op": [_transition("op", 1, "queued"), _transition("op", 2, "blocked")]}
    assert sli.queued_intervals(stuck, T0.timestamp() + 100) == [
        ("op", T0.timestamp() + 1, T0.timestamp() + 100)]
    # a retry backoff is not waiting for capacity
    backoff = {"op": [_transition("op", 1, "retrying"), _transition("op", 9, "queued"),
                      _transition("op", 10, "dispatched")]}
    assert sli.queued_intervals(backoff, T0.timestamp() + 100) == [
        ("op", T0.timestamp() + 9, T0.timestamp() + 10)]


@pytest.mark.parametrize(
    ("criterion", "text"),
    [
        (Criterion.at_most(60.0), "<=60.0"),
        (Criterion.at_most(0), "<=0"),
        (Criterion.at_least(0.999), ">=0.999"),
        (Criterion.relative_at_most(10), "<=+10%"),
        (Criterion.relative_at_most(12.5), "<=+12.5%"),
    ],
)
def test_typed_criteria_read_as_written_and_parse_back(criterion: Criterion, text: str) -> None:
    # the checks build criteria typed; the text in every output is rendered from them, and a
    # person writing the same text gets the same criterion
    assert str(criterion) == text
    assert Criterion.parse(text) == criterion


def _attempt(n: int, started: bool) -> Attempt:
    at = T0 + timedelta(seconds=10 * n)
    return Attempt(id=f"a{n}", operation_id="op", number=n, state="lost", created_at=at,
                   started_at=at if started else None)


def _step(attempt: str, kind: str, **data: float) -> Event:
    return Event(operation_id="op", attempt_id=attempt, time=T0, kind=kind, data=data)


def test_an_attempt_that_never_started_recomputed_nothing() -> None:
    # Measured on a game day: attempt 1 reached step 15 (checkpoint at 10); attempt 2 was
    # assigned to an agent that was already down and lost before it was claimed; attempt 3
    # resumed from step 10. Five steps were recomputed, not 15 + 5.
    attempts = [_attempt(1, True), _attempt(2, False), _attempt(3, True)]
    events = [_step("a1", "checkpoint_written", step=10), _step("a1", "progress", step=15),
              _step("a3", "resumed", from_step=10), _step("a3", "progress", step=20)]
    losses = sli.checkpoint_progress_loss(attempts, events, 10, sli.ObjectIndex())
    assert [(x.attempt_id, x.lost_steps, x.intervals) for x in losses] == [("a3", 5.0, 0.5)]


def test_an_attempt_that_ran_from_scratch_after_a_lost_one_is_measured_in_full() -> None:
    attempts = [_attempt(1, True), _attempt(2, False), _attempt(3, True)]
    events = [_step("a1", "progress", step=15), _step("a3", "progress", step=20)]
    losses = sli.checkpoint_progress_loss(attempts, events, 10, sli.ObjectIndex())
    assert [(x.attempt_id, x.lost_steps) for x in losses] == [("a3", 15.0)]


def test_an_attempt_whose_start_was_not_recorded_but_made_progress_counts() -> None:
    attempts = [_attempt(1, True), _attempt(2, False)]
    events = [_step("a1", "progress", step=15), _step("a2", "progress", step=3)]
    losses = sli.checkpoint_progress_loss(attempts, events, 10, sli.ObjectIndex())
    assert [(x.attempt_id, x.lost_steps) for x in losses] == [("a2", 15.0)]


def test_an_attempt_killed_before_it_resumed_recomputed_nothing() -> None:
    # Measured on an upgrade game day: attempt 1 reached step 174 (checkpoint at 170); attempt
    # 2's workload started and was killed 0.3 s later by its agent's drain, before it resumed or
    # reported a step; attempt 3 resumed from 170. Four steps were recomputed, not 174 + 4.
    attempts = [_attempt(1, True), _attempt(2, True), _attempt(3, True)]
    events = [_step("a1", "checkpoint_written", step=170), _step("a1", "progress", step=174),
              _step("a3", "resumed", from_step=170), _step("a3", "progress", step=180)]
    losses = sli.checkpoint_progress_loss(attempts, events, 10, sli.ObjectIndex())
    assert [(x.attempt_id, x.lost_steps) for x in losses] == [("a3", 4.0)]


def test_an_attempt_that_restarted_from_scratch_and_was_killed_still_counts() -> None:
    # the other side: progress from step 1 says it did not resume from the checkpoint
    attempts = [_attempt(1, True), _attempt(2, True), _attempt(3, True)]
    events = [_step("a1", "checkpoint_written", step=170), _step("a1", "progress", step=174),
              _step("a2", "progress", step=1),
              _step("a3", "resumed", from_step=170), _step("a3", "progress", step=180)]
    losses = sli.checkpoint_progress_loss(attempts, events, 10, sli.ObjectIndex())
    assert [(x.attempt_id, x.lost_steps) for x in losses] == [("a2", 174.0), ("a3", 4.0)]
