"""slo/confidence.py: the one-sided Clopper-Pearson lower bound of a ratio SLI, its
classification against the target and the events a target needs (pure math)."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo.confidence import (
    _bisect,
    classify,
    demonstrate,
    events_needed,
    failure_rate_upper_bound,
    lower_bound,
    percent_floor,
)

TARGETS = (0.9, 0.95, 0.99, 0.999, 0.9999, 0.99999)


def _tail(good: int, total: int, p: float) -> float:
    """P(X >= good), X ~ Binomial(total, p), term by term with exact binomial coefficients:
    independent of the module's log-space sum."""
    return math.fsum(math.comb(total, i) * p**i * (1 - p) ** (total - i)
                     for i in range(good, total + 1))


@st.composite
def counts(draw: st.DrawFn, max_total: int = 400) -> tuple[int, int]:
    total = draw(st.integers(1, max_total))
    return draw(st.integers(0, total)), total


# --------------------------------------------------------------------------- known values


def test_all_good_is_the_closed_form() -> None:
    assert lower_bound(120, 120) == 0.05 ** (1 / 120)
    assert lower_bound(120, 120) == pytest.approx(0.97534, abs=5e-6)
    assert lower_bound(1, 1) == pytest.approx(0.05)
    # the rule of three: 0 failures in n bound the failure rate at about 3/n
    assert failure_rate_upper_bound(0, 30_000) == pytest.approx(3 / 30_000, rel=0.002)


def test_known_clopper_pearson_values() -> None:
    # 5 % quantiles of Beta(x, n - x + 1), as published (e.g. the 90 % two-sided interval)
    assert lower_bound(7, 10) == pytest.approx(0.393376, abs=1e-6)
    assert lower_bound(0, 5) == 0.0
    assert lower_bound(5, 10) == pytest.approx(0.222441, abs=1e-6)
    # 1 failure: the upper bound of the failure rate is about 4.74 / n
    assert failure_rate_upper_bound(1, 100_000) == pytest.approx(4.7439 / 100_000, rel=1e-3)


def test_thirty_thousand_clean_events_demonstrate_four_nines() -> None:
    d = demonstrate(30_000, 30_000, 0.9999)
    assert d.classification == "demonstrated"
    assert d.lower_bound >= 0.9999 and d.events_needed == 29_956
    assert d.text == "demonstrated (n=30,000, 95 % lower bound 99.99 %)"


def test_a_hundred_and_twenty_events_are_consistent_not_demonstrated() -> None:
    d = demonstrate(120, 120, 0.9999)
    assert (d.classification, d.events, d.failures, d.events_needed) == (
        "consistent", 120, 0, 29_956)
    assert d.text == ("consistent, not demonstrated (n=120, 95 % lower bound 97.53 %; "
                      "needs >= 29,956 events)")
    five_nines = demonstrate(120, 120, 0.99999)
    assert five_nines.events_needed == 299_572
    assert "97.534 %" in five_nines.text  # a decimal more: the target has one more


@pytest.mark.parametrize(("target", "needed"), [
    (0.99, 299), (0.999, 2_995), (0.9999, 29_956), (0.99999, 299_572)])
def test_events_needed_is_the_first_n_that_demonstrates(target: float, needed: int) -> None:
    assert events_needed(target) == needed == math.ceil(math.log(0.05) / math.log(target))
    assert lower_bound(needed, needed) >= target > lower_bound(needed - 1, needed - 1)
    assert demonstrate(needed, needed, target).classification == "demonstrated"
    assert demonstrate(needed - 1, needed - 1, target).classification == "consistent"


def test_violated_is_decided_by_the_point_estimate() -> None:
    d = demonstrate(4_260, 4_360, 0.999)
    assert d.classification == "violated" and d.events_needed is None
    assert d.text.startswith("violated (n=4,360, 95 % lower bound ")
    # 1 failure in 20,000 meets 0.9999 (0.99995) without showing it
    one = demonstrate(19_999, 20_000, 0.9999)
    assert one.classification == "consistent" and one.events_needed > 30_000


@pytest.mark.parametrize("bad", [
    lambda: lower_bound(3, 2), lambda: lower_bound(0, 0), lambda: lower_bound(-1, 2),
    lambda: lower_bound(1, 2, confidence=1.0), lambda: lower_bound(1, 2, confidence=0.3),
    lambda: events_needed(1.0), lambda: events_needed(0.99, failures=-1),
    lambda: demonstrate(1, 1, 0.0)])
def test_nonsense_is_refused(bad) -> None:
    with pytest.raises(ValueError):
        bad()


# --------------------------------------------------------------------------- properties


@settings(max_examples=200, deadline=None)
@given(counts(max_total=60))
def test_the_bound_is_where_the_binomial_tail_is_five_percent(c: tuple[int, int]) -> None:
    good, total = c
    bound = lower_bound(good, total)
    if good == 0:
        assert bound == 0.0
        return
    assert _tail(good, total, bound) == pytest.approx(0.05, rel=1e-6, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(counts())
def test_the_bound_is_monotone_in_good(c: tuple[int, int]) -> None:
    good, total = c
    if good < total:
        assert lower_bound(good, total) < lower_bound(good + 1, total)


@settings(max_examples=200, deadline=None)
@given(counts(max_total=100_000))
def test_the_bound_is_never_above_the_point_estimate(c: tuple[int, int]) -> None:
    good, total = c
    bound = lower_bound(good, total)
    assert 0.0 <= bound <= good / total
    if good:
        assert bound < good / total


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 30), st.integers(1, 5_000))
def test_more_clean_events_raise_the_bound(failures: int, extra: int) -> None:
    total = failures + extra
    assert lower_bound(total - failures, total) < lower_bound(total + 1 - failures, total + 1)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 2_000_000))
def test_the_bisection_finds_the_closed_form(total: int) -> None:
    exact = -math.expm1(math.log(0.05) / total)
    assert _bisect(0, total, 0.05) == pytest.approx(exact, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(counts(max_total=5_000), st.sampled_from(TARGETS))
def test_classification_follows_its_definition(c: tuple[int, int], target: float) -> None:
    good, total = c
    d = demonstrate(good, total, target)
    assert d.classification == classify(good, total, target, d.lower_bound)
    if good / total < target:
        assert d.classification == "violated" and d.events_needed is None
    elif d.lower_bound >= target:
        assert d.classification == "demonstrated" and d.events_needed <= total
    else:
        assert d.classification == "consistent" and d.events_needed > total
        assert "consistent, not demonstrated" in d.text and f"{d.events_needed:,}" in d.text


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5), st.sampled_from(TARGETS[:5]))
def test_events_needed_is_minimal(failures: int, target: float) -> None:
    n = events_needed(target, failures)
    assert lower_bound(n - failures, n) >= target
    assert n - 1 <= failures or lower_bound(n - 1 - failures, n - 1) < target


@settings(max_examples=200, deadline=None)
@given(counts(max_total=400_000), st.sampled_from(TARGETS))
def test_the_percent_shown_never_exceeds_the_bound(c: tuple[int, int], target: float) -> None:
    good, total = c
    bound = lower_bound(good, total)
    shown = Decimal(percent_floor(bound, target).removesuffix(" %"))
    assert shown <= Decimal(bound) * 100
    if bound < target:  # a bound short of the target never reads as reaching it
        assert shown < Decimal(repr(target)) * 100
