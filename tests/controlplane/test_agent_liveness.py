"""The fleet record routed-to-live-agents judges (controlplane/store/agents.py): an agent heard
again after a silence longer than its liveness timeout, by a heartbeat or a new registration,
on a real PostgreSQL, read back by the adapter's snapshot query; and the seeded defects of the
outcome invariants that sit in the store and the token cache."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from controlplane import defects
from controlplane.api.deps import TokenCache
from controlplane.store import agents, auth
from platforms.controlplane import _LIVENESS_SQL

REG = {"name": "gpu-1", "pool": "gpu", "zone": "zone-a", "region": "region-1",
       "capabilities": {"cpu_slots": 2, "accelerator_type": "sim-a100", "accelerator_count": 1}}


def _run(dsn: str, fn: Any) -> Any:
    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await fn(conn)
    return asyncio.run(go())


def _silence(dsn: str, seconds: float) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE agents SET last_heartbeat_at = now() - make_interval(secs => %s)",
                     (seconds,))


def _records(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(_LIVENESS_SQL, {"since": "1970-01-01T00:00:00Z"}).fetchall()


@pytest.fixture
def defect(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def switch(name: str) -> None:
        monkeypatch.setenv(defects.ENV, name)
        defects.active.cache_clear()
    yield switch
    monkeypatch.delenv(defects.ENV, raising=False)
    defects.active.cache_clear()


def test_a_heartbeat_after_a_silence_longer_than_the_timeout_is_recorded(pg_dsn: str) -> None:
    agent_id = _run(pg_dsn, lambda c: agents.register(c, REG, 5.0))
    assert _records(pg_dsn) == []  # a new agent was never silent
    _silence(pg_dsn, 3)
    _run(pg_dsn, lambda c: agents.heartbeat(c, agent_id, 5.0))
    assert _records(pg_dsn) == []  # within its timeout: nothing was known dead
    _silence(pg_dsn, 40)
    _run(pg_dsn, lambda c: agents.heartbeat(c, agent_id, 5.0))
    [r] = _records(pg_dsn)
    assert r["agent"] == "gpu-1" and r["timeout_seconds"] == 5.0
    with psycopg.connect(pg_dsn) as conn:
        gap = conn.execute("SELECT extract(epoch FROM %s::timestamptz - %s::timestamptz)",
                           (r["time"], r["silent_since"])).fetchone()
    assert gap is not None and 39 < float(gap[0]) < 60


def test_a_restarted_agent_registering_again_after_a_silence_is_recorded(pg_dsn: str) -> None:
    _run(pg_dsn, lambda c: agents.register(c, REG, 5.0))
    _silence(pg_dsn, 30)
    _run(pg_dsn, lambda c: agents.register(c, REG, 5.0))
    assert [r["agent"] for r in _records(pg_dsn)] == ["gpu-1"]
    # without a timeout (a caller that does not judge liveness) nothing is recorded
    _silence(pg_dsn, 30)
    _run(pg_dsn, lambda c: agents.register(c, REG))
    assert len(_records(pg_dsn)) == 1


def test_seeded_defect_agent_revocation_ignored_accepts_a_revoked_agent_token_only(
        pg_dsn: str, defect: Any) -> None:
    with psycopg.connect(pg_dsn) as conn:
        auth.seed(conn, {"queues": [], "projects": [{"name": "team-b",
                                                     "token": "user-token-0123456789"}],
                         "agent_tokens": ["agent-token-0123456789"]})
        for token in ("user-token-0123456789", "agent-token-0123456789"):
            auth.revoke(conn, token=token)

    def lookup(token: str) -> Any:
        return _run(pg_dsn, lambda c: auth.lookup(c, token))

    for token in ("user-token-0123456789", "agent-token-0123456789"):
        with pytest.raises(auth.TokenRefused, match="revoked"):
            lookup(token)
    defect("agent-revocation-ignored")
    assert lookup("agent-token-0123456789").role == "agent"
    with pytest.raises(auth.TokenRefused, match="revoked"):
        lookup("user-token-0123456789")


def test_seeded_defect_revocation_cached_keeps_a_token_past_the_cache_ttl(defect: Any) -> None:
    p = auth.Principal("agent", expires_at=datetime.now(UTC) + timedelta(days=30))
    healthy = TokenCache(ttl=0.05)
    healthy.put("t", p)
    defect("revocation-cached")
    broken = TokenCache(ttl=0.05)
    broken.put("t", p)
    time.sleep(0.1)
    assert healthy.get("t") is None and broken.get("t") is p
