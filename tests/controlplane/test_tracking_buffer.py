"""The tracking buffer and policy (pure): what leaves the buffer and what is counted."""

from __future__ import annotations

import pytest

from controlplane.workload.tracking_buffer import MetricPoint, PointBuffer, TrackingPolicy


def _points(n: int) -> list[MetricPoint]:
    return [MetricPoint("loss", 1.0 / (i + 1), i + 1, 1000 + i) for i in range(n)]


def test_a_point_leaves_only_when_acknowledged() -> None:
    buf = PointBuffer(100)
    for p in _points(5):
        buf.add(p)
    batch = buf.peek(3)
    assert len(buf) == 5  # peeking (a send in flight) keeps them
    buf.acknowledge(batch)
    assert (len(buf), buf.acknowledged, buf.peek(10)) == (2, 3, _points(5)[3:])


def test_the_bound_drops_the_oldest_and_counts_it() -> None:
    buf = PointBuffer(3)
    pts = _points(5)
    in_flight = None
    for i, p in enumerate(pts):
        buf.add(p)
        if i == 1:
            in_flight = buf.peek(2)
    assert (buf.logged, buf.dropped, buf.peek(10)) == (5, 2, pts[2:])
    assert in_flight is not None
    buf.acknowledge(in_flight)  # already pushed out: nothing else is removed
    assert (len(buf), buf.acknowledged) == (3, 0)


def test_refused_points_are_counted_apart() -> None:
    buf = PointBuffer(10)
    for p in _points(4):
        buf.add(p)
    buf.refuse(buf.peek(4))
    assert (len(buf), buf.refused, buf.acknowledged) == (0, 4, 0)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("batch_points", 1001, "batch_points: 1001 > 1000"),
    ("max_points", 0, "max_points: 0, expected >= 1"),
    ("finish_wait_seconds", 0, "finish_wait_seconds: 0, expected > 0"),
])
def test_a_bad_policy_is_refused_naming_the_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrackingPolicy(**{field: value}).validate()  # type: ignore[arg-type]


def test_backoff_caps_double_to_the_max() -> None:
    policy = TrackingPolicy(initial_backoff=0.2, max_backoff=2.0)
    assert [policy.backoff_cap(n) for n in range(6)] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert policy.backoff_cap(10_000) == 2.0
