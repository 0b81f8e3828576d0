"""The training side's tracking buffer: what the trainer handed over and MLflow has not yet
acknowledged (pure; no I/O, no threads: controlplane/workload/tracking.py drives it).

The promise (docs/tracking.md): the trainer's ``log_metric`` never waits for tracking; a point
leaves the buffer only when MLflow acknowledged the batch that carried it; a point is identified
by (key, step, timestamp), fixed when the trainer logs it, so a batch sent again after a lost
answer is the same rows to MLflow, never new ones. Only when more than ``max_points`` wait is
the oldest point dropped, and every drop is counted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class TrackingPolicy:
    """The declared policy of the tracking sink (every field is a bound the trainer relies on)."""

    max_points: int = 100_000  # buffered beyond this, the oldest point is dropped (counted)
    batch_points: int = 1000  # MLflow's log-batch takes at most 1,000 metrics per call
    flush_seconds: float = 0.5  # how often the sender looks at the buffer
    call_timeout: float = 3.0  # one REST call waits this long for its answer at most
    initial_backoff: float = 0.2  # retries back off 0.2 s doubling to max_backoff, full jitter
    max_backoff: float = 2.0
    finish_wait_seconds: float = 120.0  # at the end, training waits this long for tracking

    def validate(self) -> None:
        for name in ("max_points", "batch_points"):
            if getattr(self, name) < 1:
                raise ValueError(f"tracking policy {name}: {getattr(self, name)}, expected >= 1")
        if self.batch_points > 1000:
            raise ValueError(f"tracking policy batch_points: {self.batch_points} > 1000, "
                             "MLflow's log-batch limit")
        for name in ("flush_seconds", "call_timeout", "initial_backoff", "max_backoff",
                     "finish_wait_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"tracking policy {name}: {getattr(self, name)}, expected > 0")

    def backoff_cap(self, retry: int) -> float:
        """Upper bound of the ``retry``-th sleep (0 for the first); the sleep is drawn in it."""
        return min(self.max_backoff, self.initial_backoff * 2.0 ** min(retry, 64))


@dataclass(frozen=True)
class MetricPoint:
    key: str
    value: float
    step: int
    timestamp_ms: int  # fixed when logged: with key and step, the point's identity in MLflow

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "value": self.value, "step": self.step,
                "timestamp": self.timestamp_ms}


class PointBuffer:
    """Points in the order logged. ``peek`` a batch, ``acknowledge`` it once MLflow took it."""

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self._points: deque[MetricPoint] = deque()
        self.logged = 0  # handed over by the trainer
        self.acknowledged = 0  # taken by MLflow
        self.dropped = 0  # pushed out by the bound (counted, never silent)
        self.refused = 0  # MLflow said no to them (a 4xx)

    def __len__(self) -> int:
        return len(self._points)

    def add(self, point: MetricPoint) -> None:
        self.logged += 1
        self._points.append(point)
        while len(self._points) > self.max_points:
            self._points.popleft()
            self.dropped += 1

    def peek(self, n: int) -> list[MetricPoint]:
        return [self._points[i] for i in range(min(n, len(self._points)))]

    def _remove(self, batch: list[MetricPoint]) -> int:
        """Remove ``batch`` from the front, as far as it is still there (the bound may have
        pushed some of it out meanwhile); how many were removed."""
        n = 0
        for point in batch:
            if self._points and self._points[0] == point:
                self._points.popleft()
                n += 1
        return n

    def acknowledge(self, batch: list[MetricPoint]) -> None:
        """MLflow took ``batch``."""
        self.acknowledged += self._remove(batch)

    def refuse(self, batch: list[MetricPoint]) -> None:
        """MLflow answered ``batch`` with a 4xx: sending it again cannot help (counted)."""
        self.refused += self._remove(batch)

    def discard(self, batch: list[MetricPoint]) -> None:
        """SEEDED DEFECT tracking-flush-drops-batch: a batch whose send failed is thrown away,
        uncounted, as if it had been sent."""
        self._remove(batch)
