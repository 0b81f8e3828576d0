"""Error-budget arithmetic (pure). Ratios are in [0, 1]; "consumed" is a fraction of the
budget of one whole SLO window (1.0 = the window's budget is gone)."""

from __future__ import annotations


def sli_value(good: int, total: int) -> float | None:
    """Share of good events; None when there were no events (no data is not a failure)."""
    if total < 0 or good < 0 or good > total:
        raise ValueError(f"need 0 <= good <= total, got good={good} total={total}")
    return None if total == 0 else good / total


def error_ratio(good: int, total: int) -> float | None:
    value = sli_value(good, total)
    return None if value is None else 1.0 - value


def burn_rate(err_ratio: float, target: float) -> float:
    """How many times faster than sustainable the budget burns (1.0 = exactly on budget)."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1), got {target}")
    return err_ratio / (1.0 - target)


def budget_consumed(rate: float, duration_seconds: float, window_seconds: float) -> float:
    """Share of a whole window's budget spent by burning at `rate` for `duration_seconds`.

    Occurrences budgets assume traffic is spread evenly over the window, which is what the
    burn-rate alerts assume too; the run is a sample of the window."""
    if window_seconds <= 0 or duration_seconds < 0:
        raise ValueError("window must be > 0 and duration >= 0")
    return rate * duration_seconds / window_seconds


def objective_met(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


def scaled_window(
    default_seconds: float,
    slo_window_seconds: float,
    floor_seconds: float,
    reference_window_seconds: float = 30 * 86400.0,
) -> float:
    """Burn-rate alert window scaled from the 30d reference to the SLO window, never below
    `floor_seconds` (rate() needs several scrapes). Scaling keeps each window pair spending
    the same share of budget as the SRE-workbook defaults."""
    return max(floor_seconds, default_seconds * slo_window_seconds / reference_window_seconds)


def value_at_full_budget(target: float, duration_seconds: float, window_seconds: float) -> float:
    """The SLI value that, held for `duration_seconds`, spends exactly one window's budget.
    A run worse than the target but better than this still fits the window (a warning)."""
    if duration_seconds <= 0:
        return target
    return max(0.0, 1.0 - (1.0 - target) * window_seconds / duration_seconds)


def remaining_budget(err_ratio: float, target: float) -> float:
    """Share of a window's error budget left when the window's error ratio is `err_ratio`
    (1.0 = untouched, 0.0 = spent, negative = overspent)."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1), got {target}")
    if err_ratio < 0:
        raise ValueError(f"error ratio must be >= 0, got {err_ratio}")
    return 1.0 - err_ratio / (1.0 - target)


def remaining_after_runs(samples: list[tuple[float, float]], target: float,
                         window_seconds: float) -> float:
    """Share of one window's budget left after the runs `samples` = (SLI value, seconds) each,
    every run's value held for its duration and nothing spent outside them (see
    slo/budget_gate.py for what that assumes)."""
    spent = sum(budget_consumed(burn_rate(1.0 - value, target), seconds, window_seconds)
                for value, seconds in samples)
    return 1.0 - spent
