"""The load client's retries (loadtests/client.py): full jitter, at least the server's
Retry-After, and a per-process retry budget that keeps retries to about a tenth of the
requests sent plus a small floor. Seeded rng and a fake clock: nothing sleeps."""

from __future__ import annotations

import random
import subprocess
import sys
from email.utils import formatdate

import pytest

from loadtests.client import Backoff, RetryBudget, parse_retry_after
from loadtests.scenario import SubmitRetry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def backoff(clock: Clock, budget: RetryBudget | None = None, **policy: float) -> Backoff:
    return Backoff(SubmitRetry(**{"max_attempts": 1000, "base_s": 0.1, "max_backoff_s": 2.0,
                                  "deadline": 60.0, **policy}),  # type: ignore[arg-type]
                   started=clock(), rng=random.Random(7), budget=budget, clock=clock)


def test_full_jitter_draws_from_zero_to_the_capped_exponential() -> None:
    clock = Clock()
    firsts = [backoff(clock).next_delay() for _ in range(200)]  # cap 0.1 s
    assert all(d is not None and 0 <= d <= 0.1 for d in firsts)
    # equal jitter never goes below half the cap; full jitter spreads over all of it
    assert sum(d < 0.05 for d in firsts if d is not None) > 60
    b = backoff(clock)
    delays = [b.next_delay() for _ in range(12)]
    caps = [min(2.0, 0.1 * 2 ** i) for i in range(12)]
    assert all(d is not None and 0 <= d <= c for d, c in zip(delays, caps, strict=True))
    assert max(d for d in delays if d is not None) > 1.0  # the cap did grow to 2 s


def test_retry_after_is_waited_at_least_plus_jitter_within_the_deadline() -> None:
    clock = Clock()
    b = backoff(clock)
    delays = [b.next_delay(retry_after=3.0) for _ in range(20)]
    assert all(d is not None and 3.0 <= d <= 5.0 for d in delays)
    assert len({round(d, 6) for d in delays if d is not None}) == 20  # not all at once
    late = backoff(clock, deadline=10.0)
    clock.now += 8.0
    assert late.next_delay(retry_after=3.0) is None and late.gave_up == "deadline"


def test_attempts_still_bound_the_retries() -> None:
    b = backoff(Clock(), max_attempts=3)
    assert [b.next_delay() is not None for _ in range(3)] == [True, True, False]
    assert b.gave_up == "attempts"


@pytest.mark.parametrize(("value", "seconds"), [
    ("2", 2.0), (" 1 ", 1.0), ("0.5", 0.5), ("-3", 0.0), ("", None), (None, None),
    ("soon", None), ("nan", None), ("inf", None)])
def test_parse_retry_after_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_parse_retry_after_http_date() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0


def test_the_budget_keeps_retries_to_a_tenth_of_the_requests_when_everything_fails() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=0.1, min_per_s=0.0, clock=clock)  # no floor: the ratio alone
    sent = retries = 0
    for _ in range(1000):  # each request fails; its submitter retries while it may
        b = backoff(clock, budget)
        sent += 1
        while b.next_delay() is not None:
            retries += 1
        assert b.gave_up == "budget"
    # a tenth of the requests, plus the one token a full bucket starts with
    assert 0.1 * sent - 1 <= retries <= 0.1 * sent + 1


def test_the_floor_lets_a_quiet_client_ride_out_an_outage_and_no_more() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=0.0, min_per_s=2.0, burst_s=5.0, clock=clock)  # the floor alone
    assert sum(budget.withdraw() for _ in range(20)) == 10  # a full bucket: 5 s of the floor
    allowed = 0
    for _ in range(300):  # 30 s of retries asked every 0.1 s
        clock.now += 0.1
        allowed += budget.withdraw()
    assert 58 <= allowed <= 60  # the floor, 2/s
    b = backoff(clock, budget)  # a refused retry is abandoned, and says why
    assert b.next_delay() is None and b.gave_up == "budget"


def test_the_client_module_stays_free_of_network_libraries() -> None:
    # it is imported inside the Locust process, where requests/boto3 break gevent's patching
    code = ("import sys, loadtests.client; bad = {'requests', 'boto3', 'httpx', 'aiohttp', "
            "'urllib3'} & set(sys.modules); print(sorted(bad)); sys.exit(bool(bad))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
