"""ObjectStore._with_retry (controlplane/storage.py): capped exponential backoff with full jitter,
bounded by the deadline, with throttling counted apart from unreachability. No server: a fake
client raises what botocore raises, a fake clock advances by the recorded sleeps."""

from __future__ import annotations

import logging
import random
import statistics
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from controlplane import storage


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


class FakeClient:
    """put_object raises the queued errors in turn, then succeeds."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = list(errors)
        self.calls = 0

    def put_object(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {}


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def _store(errors: list[Exception], policy: storage.RetryPolicy | None = None,
           seed: int | None = 7) -> tuple[storage.ObjectStore, FakeClient, FakeTime]:
    client, fake = FakeClient(errors), FakeTime()
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    store = storage.ObjectStore(client, "b", policy or storage.RetryPolicy(), rng=rng,
                                sleep=fake.sleep, clock=fake.clock)
    return store, client, fake


def test_caps_double_up_to_max_backoff() -> None:
    policy = storage.RetryPolicy(initial_backoff=0.2, max_backoff=2.0)
    assert [policy.cap(n) for n in range(7)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 2, 2, 2])
    assert policy.cap(5000) == 2.0  # no overflow however long the outage
    assert storage.full_jitter(1.6, 0.0) == 0.0 and storage.full_jitter(1.6, 0.5) == 0.8


def test_backoff_sleep_never_runs_past_the_deadline() -> None:
    policy = storage.RetryPolicy(deadline_seconds=5.0)
    assert storage.backoff_sleep(policy, 10, 0.99, elapsed=4.5) == pytest.approx(0.5)
    assert storage.backoff_sleep(policy, 10, 0.5, elapsed=1.0) == pytest.approx(1.0)
    assert storage.backoff_sleep(storage.RetryPolicy(), 10, 0.99, elapsed=1e6) == pytest.approx(1.98)


def test_slowdown_retried_with_full_jitter_then_succeeds() -> None:
    n = 200
    store, client, fake = _store([_client_error("SlowDown", 503)] * n)
    store.put("k", b"x")
    assert client.calls == n + 1 and len(fake.sleeps) == n
    caps = [store.retry.cap(i) for i in range(n)]
    assert all(0.0 <= s <= c for s, c in zip(fake.sleeps, caps, strict=True))
    assert max(fake.sleeps) <= store.retry.max_backoff
    assert len(set(fake.sleeps)) > n // 2, "sleeps should not repeat: they are drawn"
    # uniform over [0, cap]: each sleep is on average half its cap
    ratio = statistics.mean(s / c for s, c in zip(fake.sleeps, caps, strict=True))
    assert 0.4 < ratio < 0.6, ratio
    assert 0.4 * sum(caps) < sum(fake.sleeps) < 0.6 * sum(caps)
    assert store.retry_counts == {storage.THROTTLED: n}


def test_two_stores_do_not_retry_in_lockstep() -> None:
    """The default generator: two clients meeting the same brownout draw different sleeps."""
    sleeps = []
    for _ in range(2):
        store, _, fake = _store([_client_error("SlowDown", 503)] * 8, seed=None)
        store.put("k", b"x")
        sleeps.append(fake.sleeps)
    assert sleeps[0] != sleeps[1]
    assert isinstance(storage.ObjectStore(FakeClient([]), "b").rng, random.SystemRandom)


def test_deadline_ends_the_loop() -> None:
    policy = storage.RetryPolicy(initial_backoff=0.2, max_backoff=2.0, deadline_seconds=5.0)
    store, client, fake = _store([_client_error("SlowDown", 503)] * 1000, policy)
    with pytest.raises(storage.StorageUnavailable, match=r"put k: gave up after \d+ tries"):
        store.put("k", b"x")
    # the last try happens at the deadline, not a whole backoff after it
    assert fake.now == pytest.approx(5.0)
    assert client.calls == len(fake.sleeps) + 1


@pytest.mark.parametrize(("code", "status"), [("AccessDenied", 403), ("InvalidArgument", 400)])
def test_client_errors_not_retried(code: str, status: int) -> None:
    store, client, fake = _store([_client_error(code, status)])
    with pytest.raises(storage.StorageError, match=code) as info:
        store.put("k", b"x")
    assert not isinstance(info.value, storage.StorageUnavailable)
    assert client.calls == 1 and fake.sleeps == [] and not store.retry_counts


def test_missing_key_is_object_missing_at_once() -> None:
    store, client, fake = _store([_client_error("NoSuchKey", 404)])
    with pytest.raises(storage.ObjectMissing):
        store.put("k", b"x")
    assert client.calls == 1 and fake.sleeps == []


def test_throttling_counted_apart_from_unreachability(caplog: pytest.LogCaptureFixture) -> None:
    errors: list[Exception] = [
        _client_error("SlowDown", 503), _client_error("InternalError", 500),
        _client_error("RequestTimeout", 400), EndpointConnectionError(endpoint_url="http://x"),
        _client_error("SlowDown", 503),
    ]
    heard: list[tuple[str, int, str]] = []
    store, client, fake = _store(errors)
    store.on_retry = lambda what, n, exc: heard.append((what, n, storage.failure_kind(exc)))
    with caplog.at_level(logging.WARNING, logger="controlplane.storage"):
        store.put("k", b"x")
    assert client.calls == 6 and len(fake.sleeps) == 5
    assert heard == [("put k", 1, "throttled"), ("put k", 2, "server_error"),
                     ("put k", 3, "server_error"), ("put k", 4, "unreachable"),
                     ("put k", 5, "throttled")]
    assert store.retry_counts == {"throttled": 2, "server_error": 2, "unreachable": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5 and lines[0].startswith("storage put k failed (try 1, throttled), "
                                                   "retrying in ")
