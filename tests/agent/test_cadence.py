"""The agent loop's timing rules (controlplane/agent/cadence.py)."""

from __future__ import annotations

import pytest

from controlplane.agent.cadence import claim_wait, next_claim_at, sleep_seconds


def test_claim_wait_stays_inside_the_heartbeat_interval() -> None:
    # the claim's query is the agent's only heartbeat while it waits on the server
    assert claim_wait(5 / 3, None) == pytest.approx(5 / 3 - 0.1)
    assert claim_wait(5 / 3, 30.0) == pytest.approx(5 / 3 - 0.1)
    assert claim_wait(5.0, 1.0) == 1.0
    assert claim_wait(0.05, None) == 0.0  # too short to wait at all: plain polling
    assert claim_wait(5.0, 0.0) == 0.0  # long polling switched off


def test_next_claim_follows_work_at_once_and_paces_empty_answers() -> None:
    assert next_claim_at(100.0, claimed=1, poll_seconds=0.5) == 100.0
    # paced from the start of the call: an immediate empty answer (API without long poll)
    # keeps the old 0.5 s pace, and a long poll that returned at 101.5 is followed at once
    assert next_claim_at(100.0, claimed=0, poll_seconds=0.5) == 100.5


def test_sleep_until_the_earliest_deadline_within_bounds() -> None:
    assert sleep_seconds(10.0, [10.3, 11.0], cap=0.5) == pytest.approx(0.3)
    assert sleep_seconds(10.0, [12.0, 11.0], cap=0.5) == 0.5
    assert sleep_seconds(10.0, [9.0], cap=0.5) == 0.0  # overdue: no sleep, never negative
    assert sleep_seconds(10.0, [], cap=0.5) == 0.5
