"""The injectable wall clock (controlplane/clock.py) and the rule it exists to test: leases,
renewals and backoffs are measured on the database's clock, whatever the process's clock says;
the agent's clock is only recorded. The seeded defect ``lease-from-agent-clock`` breaks that."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from controlplane import clock, defects, logs
from controlplane.store import agents as agent_store
from controlplane.store import auth, operations, scheduling

LEASE = 5.0
SKEW = -30.0


@pytest.fixture
def offset_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(clock, "RECHECK_SECONDS", 0.0)
    path = tmp_path / "offset.json"
    clock.configure(str(path))
    yield path
    clock.configure(None)


def _write(path: Path, body: Any) -> None:
    path.write_text(body if isinstance(body, str) else json.dumps(body))


# --------------------------------------------------------------------------- the clock itself


def test_without_a_file_the_clock_is_the_true_time() -> None:
    clock.configure(None)
    assert clock.offset() == 0.0
    assert abs(clock.wall() - time.time()) < 0.05


def test_the_offset_follows_the_file_forward_backward_and_back(offset_file: Path) -> None:
    assert clock.offset() == 0.0  # no file yet
    _write(offset_file, {"offset_seconds": 30})
    assert clock.offset() == 30.0 and abs(clock.wall() - time.time() - 30) < 0.05
    _write(offset_file, {"offset_seconds": -30.5})
    assert clock.offset() == -30.5
    assert abs(clock.utcnow().timestamp() - (time.time() - 30.5)) < 0.05
    offset_file.unlink()
    assert clock.offset() == 0.0


def test_a_broken_file_keeps_the_last_offset(offset_file: Path) -> None:
    _write(offset_file, {"offset_seconds": 12})
    assert clock.offset() == 12.0
    for broken in ("{not json", {"offset_seconds": "12"}, {"offset": 1}, {"offset_seconds": True}):
        _write(offset_file, broken)
        assert clock.offset() == 12.0, broken


def test_the_file_is_looked_at_once_per_recheck_interval(offset_file: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _write(offset_file, {"offset_seconds": 1})
    monkeypatch.setattr(clock, "RECHECK_SECONDS", 60.0)
    clock.configure(str(offset_file))
    assert clock.offset() == 1.0
    _write(offset_file, {"offset_seconds": 2})
    assert clock.offset() == 1.0  # cached: not looked at again within the interval


def test_monotonic_time_is_never_offset(offset_file: Path) -> None:
    # the agent's self-fencing deadline is monotonic; a clock step must not move it
    _write(offset_file, {"offset_seconds": -3600})
    assert clock.offset() == -3600.0
    assert not hasattr(clock, "monotonic")


def test_a_change_is_logged_as_json_lines_stamped_by_this_clock_without_deadlock(
        offset_file: Path) -> None:
    """The API and the reconciler log through logs.JsonFormatter, which reads this clock: a
    change logged while the clock held its lock waited on that lock for good (a CI run hung)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(logs.JsonFormatter())
    clock.log.addHandler(handler)
    readings: list[float] = []

    def change() -> None:
        for body in ({"offset_seconds": 30}, "{not json", {"offset_seconds": -30}):
            _write(offset_file, body)
            readings.append(clock.offset())

    try:
        worker = threading.Thread(target=change, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "clock.offset() deadlocked while logging a change"
    finally:
        clock.log.removeHandler(handler)
    assert readings == [30.0, 30.0, -30.0]
    said = [json.loads(line) for line in lines]
    assert [x["message"].split(" (")[0] for x in said] == [
        "wall clock offset now +30.000s", f"{offset_file}: unusable clock offset file",
        "wall clock offset now -30.000s"]
    assert said[0]["action"] == "clock_offset" and said[0]["offset_seconds"] == 30


# --------------------------------------------------------------------------- leases on the database


def _ready(dsn: str) -> tuple[str, str]:
    """A project, an agent and one operation dispatched to it; returns (agent id, op id)."""
    with psycopg.connect(dsn) as conn:
        auth.seed(conn, {"projects": [{"name": "p", "token": "t" * 20}],
                         "queues": [{"name": "default"}]})
        project = str(conn.execute("SELECT id FROM projects").fetchone()[0])

    async def run() -> tuple[str, str]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            agent = await agent_store.register(conn, {
                "name": "cpu-1", "pool": "cpu", "zone": "zone-a", "region": "region-1",
                "capabilities": {"cpu_slots": 4}})
            spec = {"name": "x", "queue": "default", "priority": 0, "max_retries": 3,
                    "timeout_seconds": 600, "workload": {"image": "a:1"}}
            res = await operations.submit(conn, project_id=project, key="k", spec=spec,
                                          actor="test")
            stats, _, _ = await scheduling.schedule(conn, alive_seconds=60, lease_seconds=LEASE)
            assert len(stats.dispatched) == 1
            return agent, str(res.operation["id"])

    return asyncio.run(run())


def _claim_and_renew(dsn: str, agent: str, agent_time: float) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            [row] = await agent_store.claim(conn, agent, 1, LEASE, agent_time=agent_time)
            cur = await conn.execute(
                "SELECT extract(epoch FROM lease_expires_at - claimed_at)::float8,"
                " extract(epoch FROM now())::float8 FROM attempts WHERE id = %s",
                (row["attempt_id"],))
            granted, db_now = await cur.fetchone()  # type: ignore[misc]
            cur = await conn.execute("SELECT data FROM events WHERE kind = 'claimed'")
            [(event,)] = await cur.fetchall()
            out = await agent_store.attempt_heartbeat(conn, str(row["attempt_id"]),
                                                      row["fencing_token"], None, LEASE,
                                                      agent_time=agent_time)
            renewed = out["lease_expires_at"].timestamp() - db_now
            return {"granted": granted, "event": event, "renewed": renewed}

    return asyncio.run(run())


def test_a_skewed_agent_gets_the_full_lease_on_the_database_clock(pg_dsn: str) -> None:
    agent, _ = _ready(pg_dsn)
    out = _claim_and_renew(pg_dsn, agent, time.time() + SKEW)
    assert out["granted"] == pytest.approx(LEASE, abs=0.01)
    assert out["renewed"] == pytest.approx(LEASE, abs=0.5)
    # the agent's clock is recorded, with the lease as granted (lease-granted-once reads these)
    assert out["event"]["agent_clock_offset"] == pytest.approx(SKEW, abs=1.0)
    assert out["event"]["lease_seconds"] == LEASE and out["event"]["lease_expires_at"]


def test_seeded_defect_lease_from_agent_clock_grants_a_lease_already_expired(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defects, "active", lambda: frozenset({"lease-from-agent-clock"}))
    agent, _ = _ready(pg_dsn)
    out = _claim_and_renew(pg_dsn, agent, time.time() + SKEW)
    assert out["granted"] == pytest.approx(LEASE + SKEW, abs=1.0)  # 25 s in the past
    assert out["renewed"] == pytest.approx(LEASE + SKEW, abs=1.0)


def test_retry_backoff_is_measured_on_the_database_clock(pg_dsn: str, offset_file: Path) -> None:
    """The reconciler's clock 30 s fast (or slow) must not delay (or skip) a retry's backoff."""
    agent, op_id = _ready(pg_dsn)
    _claim_and_renew(pg_dsn, agent, time.time())

    async def expire_with_skew(offset: float) -> float:
        _write(offset_file, {"offset_seconds": offset})
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await conn.execute("UPDATE attempts SET lease_expires_at = now() - interval '1s'"
                               " WHERE state IN ('dispatched', 'running')")
            stats = await scheduling.expire_leases(conn, retry_base=1.0)
            assert stats.retried == 1
            cur = await conn.execute(
                "SELECT extract(epoch FROM next_eligible_at - now())::float8 FROM operations"
                " WHERE id = %s", (op_id,))
            return (await cur.fetchone())[0]  # type: ignore[index]

    delay = asyncio.run(expire_with_skew(30.0))
    assert 0 < delay <= 2.0, delay  # the policy's first backoff, not 30 s more
