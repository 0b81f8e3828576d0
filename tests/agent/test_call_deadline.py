"""The agent's API calls give up well within the lease (gray network: a connection that is
accepted and then never answers must not cost the lease)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from agenttest import gray_http_server

from controlplane import defects
from controlplane.agent.api import TRIES_PER_LEASE, AgentApi, ApiUnavailable, call_deadline


def test_a_call_waits_a_fifth_of_the_lease_at_most_the_usual_timeout() -> None:
    assert call_deadline(5.0, 3.0) == pytest.approx(5.0 / TRIES_PER_LEASE)
    assert call_deadline(60.0, 3.0) == 3.0  # a long lease keeps the client's own timeout
    assert call_deadline(5.0, None) == pytest.approx(1.0)


def test_the_seeded_defect_waits_longer_than_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(defects.ENV, "deadline-beyond-lease")
    defects.active.cache_clear()
    try:
        assert call_deadline(5.0, 3.0) == 10.0
    finally:
        monkeypatch.delenv(defects.ENV)
        defects.active.cache_clear()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts connections and reads requests, and never answers (a silent connection)."""
    with gray_http_server(silent=None) as port:
        yield port


def test_after_registration_a_silent_connection_is_given_up_within_the_deadline(
        silent_server: int) -> None:
    register = httpx.MockTransport(lambda request: httpx.Response(
        200, json={"agent_id": "a1", "lease_seconds": 2.0, "heartbeat_seconds": 0.7}))
    api = AgentApi("http://127.0.0.1:1", "token", transport=register)
    api.register("cpu-1", "cpu", "zone-a", "region-1", {})
    assert api.deadline == pytest.approx(2.0 / TRIES_PER_LEASE)
    # the same client settings against a server that never answers
    silent = AgentApi(f"http://127.0.0.1:{silent_server}", "token")
    silent.deadline = api.deadline
    started = time.monotonic()
    with pytest.raises(ApiUnavailable, match="Timeout"):
        silent.attempt_heartbeat("att-1", 1, None)
    took = time.monotonic() - started
    assert took < 2.0 / 2, f"a heartbeat waited {took:.2f} s on a silent connection (lease 2 s)"
    silent.close()
    api.close()
