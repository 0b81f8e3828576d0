"""Property tests for the pure math: budget, burn rates, durability, series, Keptn scoring."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import assume, given
from hypothesis import strategies as st

from slo import budget, sli
from slo.evidence import LedgerEntry, Operation
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


@given(
    values=st.lists(
        st.one_of(st.none(), st.floats(min_value=0, max_value=1)), min_size=1, max_size=80
    ),
    target=st.floats(min_value=0.5, max_value=0.999),
    hold=st.integers(min_value=1, max_value=5),
)
def test_recovery_time_holds_for_n_samples(
    values: list[float | None], target: float, hold: int
) -> None:
    times = [float(i) for i in range(len(values))]
    rec = sli.recovery_time(times, values, target, 0.0, hold)
    breach = sli.first_breach(times, values, target, 0.0)
    if breach is None:
        assert rec == 0.0
    elif rec is not None:
        i = int(rec)
        assert rec > breach
        window = [v for v in values[i:] if v is not None][:hold]
        assert len(window) == hold and all(v >= target for v in window)


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


statuses = st.sampled_from([Status.PASS, Status.WARNING, Status.FAIL, None])
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
