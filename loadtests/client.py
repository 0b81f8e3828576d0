"""Client behaviour that needs no Locust: retry decisions, backoff, artifact locations.

Kept apart from the locustfile so it is unit-tested in the pytest process (which must never
import locust).
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import quote

from loadtests.scenario import SubmitRetry


class SubmitOutcome(str, Enum):
    ACKED = "acked"            # 201 or 200 (duplicate of the same key): in the ledger
    ABANDONED = "abandoned"    # retries exhausted (attempts, deadline or budget) without an ack
    REJECTED = "rejected"      # a 4xx that retrying cannot fix (401/403/409/422 ...)
    INTERRUPTED = "interrupted"  # the load run stopped while this submission was in flight


def is_ack(status: int) -> bool:
    return status in (200, 201)


def is_retryable(status: int) -> bool:
    """Transport error (0), timeout, 5xx and 429 may succeed later *with the same key*."""
    return status == 0 or status >= 500 or status in (408, 429)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for: delta-seconds or an HTTP-date (RFC 9110
    10.2.3); None when absent or unreadable. ``now``: wall-clock time, for the date form."""
    if not value or not value.strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


@dataclass
class RetryBudget:
    """Retries of one client process, as a token bucket: each first attempt deposits
    ``ratio`` of a token, time deposits ``min_per_s`` (the floor: a client sending little may
    still ride out an outage), a retry takes one token, and the bucket holds ``burst_s``
    seconds of the floor. So retries add at most ``ratio`` to the requests sent, plus the
    floor: an overloaded server is not answered with a retry storm (metastable failures)."""

    ratio: float = 0.1
    min_per_s: float = 5.0
    burst_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.capacity
        self._last = self.clock()

    @property
    def capacity(self) -> float:
        return max(1.0, self.min_per_s * self.burst_s)

    def deposit(self) -> None:
        """One first attempt (a new logical request) was sent."""
        self.tokens = min(self.capacity, self.tokens + self.ratio)

    def withdraw(self) -> bool:
        """May one retry be sent now? Takes its token if so."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.min_per_s)
        self._last = now
        if self.tokens < 1 - 1e-9:  # ten deposits of 0.1 make 0.999...: one token
            return False
        self.tokens -= 1
        return True


@dataclass
class Backoff:
    """Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And
    Jitter"), at least the server's ``Retry-After``, bounded by attempts, by a deadline and by
    the process's retry budget. One per logical request: making it counts its first attempt.
    """

    policy: SubmitRetry
    started: float = field(default_factory=time.monotonic)
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)
    budget: RetryBudget | None = None
    clock: Callable[[], float] = time.monotonic
    gave_up: str | None = None  # why next_delay said None: attempts | deadline | budget

    def __post_init__(self) -> None:
        if self.budget is not None:
            self.budget.deposit()

    def next_delay(self, retry_after: float | None = None) -> float | None:
        """Seconds to sleep before the next attempt, or None when it must not be made.
        ``retry_after``: what the failed answer's Retry-After asked for, if anything."""
        self.attempts += 1
        if self.attempts >= self.policy.max_attempts:
            self.gave_up = "attempts"
            return None
        cap = min(self.policy.max_backoff_s, self.policy.base_s * 2 ** (self.attempts - 1))
        # the jitter is added to Retry-After, not maxed with it: requests refused together
        # must not come back together
        delay = (retry_after or 0.0) + self.rng.uniform(0, cap)
        remaining = self.policy.deadline - (self.clock() - self.started)
        if remaining <= delay:
            self.gave_up = "deadline"
            return None
        if self.budget is not None and not self.budget.withdraw():
            self.gave_up = "budget"
            return None
        return delay


@dataclass(frozen=True)
class ArtifactRef:
    url: str
    bucket: str
    key: str
    file: str
    sha256: str | None


def _parse_s3_uri(uri: str) -> tuple[str, str] | None:
    if not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[5:].partition("/")
    return (bucket, key) if bucket and key else None


def artifact_refs(result: dict[str, Any] | None, s3_endpoint: str) -> list[ArtifactRef]:
    """Downloadable artifacts of a succeeded operation, as path-style URLs on the endpoint.

    Understands our control plane's result (`bucket` + `artifacts_prefix` + `files` with
    sha256) and any top-level ``s3://bucket/key`` string value (other adapters)."""
    if not isinstance(result, dict):
        return []
    base = s3_endpoint.rstrip("/")
    found: dict[tuple[str, str], str | None] = {}
    bucket, prefix, files = result.get("bucket"), result.get("artifacts_prefix"), result.get("files")
    if isinstance(bucket, str) and isinstance(prefix, str) and isinstance(files, dict):
        for name, meta in files.items():
            sha = meta.get("sha256") if isinstance(meta, dict) else None
            found[(bucket, prefix + name)] = sha if isinstance(sha, str) else None
    for value in result.values():
        parsed = _parse_s3_uri(value) if isinstance(value, str) else None
        if parsed and not parsed[1].endswith("/"):
            found.setdefault(parsed, None)
    return [ArtifactRef(url=f"{base}/{quote(b)}/{quote(k)}", bucket=b, key=k,
                        file=k.rsplit("/", 1)[-1], sha256=sha)
            for (b, k), sha in sorted(found.items())]
