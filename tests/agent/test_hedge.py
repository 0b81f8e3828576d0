"""Hedged heartbeats: a call that stays silent is sent again alongside on another connection and
the first answer wins; a slow answer is still taken; a failure or a refusal is not repeated
inside the round (controlplane/agent/hedge.py)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
from agenttest import gray_http_server

from controlplane.agent.api import AgentApi, ApiUnavailable, LeaseLost
from controlplane.agent.hedge import hedged


def _scripted(*behaviours: tuple[float, object]):
    """A call whose n-th invocation sleeps, then returns or raises its scripted outcome."""
    counter = itertools.count()
    calls: list[float] = []

    def call() -> object:
        n = next(counter)
        calls.append(time.monotonic())
        delay, outcome = behaviours[min(n, len(behaviours) - 1)]
        time.sleep(delay)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return call, calls


def test_a_silent_call_is_hedged_and_the_hedge_answers() -> None:
    call, calls = _scripted((5.0, ApiUnavailable("silent")), (0.0, "second"))
    started = time.monotonic()
    assert hedged(call, retry_on=ApiUnavailable, every=0.2, within=1.0) == "second"
    took = time.monotonic() - started
    assert len(calls) == 2 and 0.15 < took < 0.6, (len(calls), took)


def test_a_slow_first_answer_still_wins_when_the_hedges_fail() -> None:
    call, calls = _scripted((0.5, "first"), (0.0, ApiUnavailable("reset")))
    assert hedged(call, retry_on=ApiUnavailable, every=0.1, within=0.3) == "first"
    assert len(calls) >= 2


def test_a_failure_at_once_is_not_repeated_inside_the_round() -> None:
    call, calls = _scripted((0.0, ApiUnavailable("refused")))
    with pytest.raises(ApiUnavailable, match="refused"):
        hedged(call, retry_on=ApiUnavailable, every=0.1, within=1.0)
    assert len(calls) == 1


def test_a_refusal_is_an_answer_and_raised_at_once() -> None:
    call, calls = _scripted((5.0, ApiUnavailable("silent")), (0.0, LeaseLost("409")))
    started = time.monotonic()
    with pytest.raises(LeaseLost):
        hedged(call, retry_on=ApiUnavailable, every=0.1, within=1.0)
    assert time.monotonic() - started < 0.5 and len(calls) == 2


def test_all_silent_gives_up_after_the_round_and_the_last_deadline() -> None:
    call, calls = _scripted((0.3, ApiUnavailable("timeout")))
    started = time.monotonic()
    with pytest.raises(ApiUnavailable):
        hedged(call, retry_on=ApiUnavailable, every=0.1, within=0.3)
    took = time.monotonic() - started
    # calls at 0, 0.1, 0.2 (the round), the last ends 0.3 later: never a call after `within`
    assert len(calls) == 3 and 0.45 < took < 0.9, (len(calls), took)


def test_bad_pacing_is_refused() -> None:
    with pytest.raises(ValueError, match="every"):
        hedged(lambda: 1, retry_on=ApiUnavailable, every=0.0, within=1.0)


@pytest.fixture
def first_connection_silent() -> Iterator[int]:
    """The first connection accepted and never answered; later ones get a heartbeat answer."""
    with gray_http_server(silent=1, answer_json=b'{"cancel": false, "lease_expires_at": null}') as port:
        yield port


def test_a_heartbeat_that_meets_a_silent_connection_gets_through_on_another(
        first_connection_silent: int) -> None:
    api = AgentApi(f"http://127.0.0.1:{first_connection_silent}", "token")
    api.deadline = 1.0  # a 5 s lease
    started = time.monotonic()
    reply = api.attempt_heartbeat("att-1", 1, None)
    took = time.monotonic() - started
    assert reply.cancel is False
    # answered by the hedge after half the deadline, not after the silent call's deadline
    assert 0.4 < took < 0.9, f"heartbeat took {took:.2f} s"
    api.close()
