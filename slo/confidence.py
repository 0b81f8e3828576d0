"""What a ratio SLI's events demonstrate (pure): the one-sided lower confidence bound of its
success ratio, compared with the objective's target.

A ratio SLI of `good` out of `total` events passes on its point estimate good/total. With few
events that proves little: 0 failures in n events only bounds the failure rate at about 3/n at
95 % (the rule of three), so 120 clean submissions cannot show 99.999 %.

Method: the Clopper-Pearson exact bound. The one-sided 95 % lower bound L of the success ratio
is the p at which `good` or more successes in `total` trials would happen with probability
0.05: P(X >= good | total, L) = 0.05, X ~ Binomial(total, L). Equivalently L is the 5 %
quantile of Beta(good, total - good + 1). It is found by bisection on the failure rate over the
binomial CDF of the failures, P(F <= failures), F ~ Binomial(total, 1 - p), summed exactly in
log space (no SciPy). Special cases: good == total gives L = 0.05 ** (1 / total) exactly; good
== 0 gives L = 0. Bisection stops at adjacent floats and keeps the conservative end.

One-sided on purpose: the question is only "is the success ratio at least the target?", so all
5 % of the error is put below the bound (a two-sided 95 % interval would use 2.5 %). The bound
assumes independent events; failures that come in bursts (one fault, many requests) make the
real uncertainty larger, never smaller.

Classification against the target:
  demonstrated  L >= target: the events show the objective at 95 % confidence;
  consistent    good/total >= target > L: the run met the objective but is too small to show
                it ("consistent, not demonstrated"); scored as a pass, never shown as a bare one;
  violated      good/total < target: the objective was missed (the gate's rules apply).

Events needed: the smallest n whose bound reaches the target with the failures observed so far
and no more; with none, n >= ln(0.05) / ln(target) (29,956 events for 0.9999, 299,572 for
0.99999).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Literal

import numpy as np

CONFIDENCE = 0.95
Classification = Literal["demonstrated", "consistent", "violated"]
DEMONSTRATED: Classification = "demonstrated"
CONSISTENT: Classification = "consistent"
VIOLATED: Classification = "violated"
_MAX_BISECTIONS = 2000  # never reached: floats run out after ~1,100 halvings of [0, 1]


def _check_confidence(confidence: float) -> float:
    # below 0.5 the "lower" bound would sit above the point estimate
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    return round(1.0 - confidence, 12)  # 0.05, not 0.050000000000000044


def _check_counts(good: int, total: int) -> None:
    if total <= 0 or good < 0 or good > total:
        raise ValueError(f"need 0 <= good <= total and total > 0, got good={good} total={total}")


def _check_target(target: float) -> None:
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1), got {target}")


def _log_binomial_cdf(k: int, n: int, q: float) -> float:
    """ln P(F <= k) for F ~ Binomial(n, q), 0 < q < 1, 0 <= k < n, summed over the shorter
    tail (the complement when k is past the middle) in log space."""
    if k > n // 2:
        # P(F <= k) = 1 - P(S <= n - k - 1) with S = n - F ~ Binomial(n, 1 - q)
        upper = math.exp(_log_binomial_cdf(n - k - 1, n, 1.0 - q))
        return math.log1p(-upper) if upper < 1.0 else -math.inf
    j = np.arange(1, k + 1, dtype=np.float64)
    log_choose = np.concatenate(([0.0], np.cumsum(np.log(n - j + 1) - np.log(j))))
    j = np.arange(k + 1, dtype=np.float64)
    terms = log_choose + j * math.log(q) + (n - j) * math.log1p(-q)
    top = float(terms.max())
    return top + math.log(float(np.exp(terms - top).sum()))


def failure_rate_upper_bound(failures: int, total: int, confidence: float = CONFIDENCE) -> float:
    """One-sided upper confidence bound of the failure rate: the q with P(F <= failures) =
    1 - confidence. Bisection; the bound returned is never below the exact one."""
    alpha = _check_confidence(confidence)
    _check_counts(total - failures, total)
    if failures == 0:
        return -math.expm1(math.log(alpha) / total)  # 1 - alpha ** (1 / n), exactly
    if failures == total:
        return 1.0
    return _bisect(failures, total, alpha)


def _bisect(failures: int, total: int, alpha: float) -> float:
    """The q with P(F <= failures) = alpha, to adjacent floats; the upper end, so the bound on
    the success ratio derived from it is never above the exact one."""
    log_alpha = math.log(alpha)
    lo, hi = 0.0, 1.0  # P(F <= failures) falls with q: above alpha at lo, at most alpha at hi
    for _ in range(_MAX_BISECTIONS):
        mid = (lo + hi) / 2.0
        if mid <= lo or mid >= hi:
            break
        if _log_binomial_cdf(failures, total, mid) > log_alpha:
            lo = mid
        else:
            hi = mid
    return hi


def lower_bound(good: int, total: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson lower confidence bound of the success ratio good/total."""
    alpha = _check_confidence(confidence)
    _check_counts(good, total)
    if good == total:
        return alpha ** (1.0 / total)
    return 1.0 - failure_rate_upper_bound(total - good, total, confidence)


def classify(good: int, total: int, target: float, bound: float) -> Classification:
    """Point estimate first (the gate's own rule), then the bound."""
    if good / total < target:
        return VIOLATED
    return DEMONSTRATED if bound >= target else CONSISTENT


def events_needed(target: float, failures: int = 0, confidence: float = CONFIDENCE) -> int:
    """Smallest number of events whose lower bound reaches `target` when `failures` of them
    failed (no more than observed). With none: ceil(ln(1 - confidence) / ln(target))."""
    alpha = _check_confidence(confidence)
    _check_target(target)
    if failures < 0:
        raise ValueError(f"failures must be >= 0, got {failures}")

    def shown(n: int) -> bool:
        return lower_bound(n - failures, n, confidence) >= target

    # zero failures: the closed form, nudged to the exact integer float rounding may miss
    lo = max(failures + 1, math.ceil(math.log(alpha) / math.log(target)))
    while lo > failures + 1 and shown(lo - 1):
        lo -= 1
    if shown(lo):
        return lo
    hi = lo * 2
    while not shown(hi):  # ends: with the failures fixed the bound tends to 1
        if hi > 2**53:
            raise ArithmeticError(f"no event count demonstrates {target} with {failures} failures")
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # not shown at lo, shown at hi
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if shown(mid) else (mid, hi)
    return hi


def percent_floor(value: float, target: float) -> str:
    """`value` in percent, rounded down (a lower bound stays a lower bound), with as many
    decimals as the target needs and at least two: 0.97534 -> "97.53 %" for 0.9999."""
    exponent = Decimal(repr(target)).normalize().as_tuple().exponent
    decimals = min(max(2, -int(exponent) - 2), 10)
    # Decimal(value) is the float's exact value: floored, the text never exceeds it
    shown = (Decimal(value) * 100).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_FLOOR)
    return f"{shown} %"


@dataclass(frozen=True)
class Demonstration:
    """What `total` events with `failures` bad ones show about a target. `events_needed` is
    None when the objective is violated (no number of further events would fix this run)."""

    classification: Classification
    events: int
    failures: int
    confidence: float
    lower_bound: float
    events_needed: int | None
    text: str


def describe(classification: Classification, events: int, bound: float, target: float,
             needed: int | None, confidence: float = CONFIDENCE) -> str:
    """e.g. "consistent, not demonstrated (n=120, 95 % lower bound 97.53 %; needs >= 29,956
    events)": how every output says it."""
    head = "consistent, not demonstrated" if classification == CONSISTENT else classification
    tail = f"; needs >= {needed:,} events" if classification == CONSISTENT else ""
    return (f"{head} (n={events:,}, {confidence * 100:g} % lower bound "
            f"{percent_floor(bound, target)}{tail})")


def demonstrate(good: int, total: int, target: float,
                confidence: float = CONFIDENCE) -> Demonstration:
    _check_target(target)
    bound = lower_bound(good, total, confidence)
    classification = classify(good, total, target, bound)
    failures = total - good
    needed = None if classification == VIOLATED else events_needed(target, failures, confidence)
    return Demonstration(classification, total, failures, confidence, bound, needed,
                         describe(classification, total, bound, target, needed, confidence))
