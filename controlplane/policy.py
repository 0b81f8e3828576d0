"""Retry policy: pure functions deciding retry vs fail, and the backoff between attempts."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from controlplane import defects


class ErrorKind(StrEnum):
    TRANSIENT = "transient"  # may succeed elsewhere or later: lost node, registry unreachable
    DETERMINISTIC = "deterministic"  # will fail again: image not found, invalid input, timeout


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay_seconds: float
    reason: str


def backoff_seconds(retry_number: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Exponential backoff for the n-th retry (1-based): base, 2*base, 4*base ... capped."""
    if retry_number < 1:
        raise ValueError("retry_number starts at 1")
    return float(min(cap, base * 2 ** (retry_number - 1)))


def decide_retry(
    *, error_kind: ErrorKind | str, attempts_made: int, max_retries: int, base: float = 1.0,
    cap: float = 60.0,
) -> RetryDecision:
    """Whether an operation whose attempt just failed gets another attempt.

    ``attempts_made`` counts the attempt that just ended; ``max_retries`` retries are allowed on
    top of the first attempt. Deterministic errors are never retried blindly.
    """
    if ErrorKind(error_kind) is ErrorKind.DETERMINISTIC:
        return RetryDecision(False, 0.0, "deterministic error: not retried")
    retries_used = attempts_made - 1
    if retries_used >= max_retries and not defects.enabled("retries-unbounded"):
        return RetryDecision(False, 0.0, f"retries exhausted ({max_retries} allowed)")
    n = retries_used + 1
    return RetryDecision(True, backoff_seconds(n, base, cap), f"retry {n} of {max_retries}")
