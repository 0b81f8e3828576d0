"""The blocked sweep (controlplane/store/scheduling.py) reads again only the blocked operations
whose routing would change: a group (queue, the spec's routed part, pinned agent, stated reason)
is routed once for all its operations. Real PostgreSQL; no agent process, agents are rows."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from controlplane.store import scheduling

NO_AGENTS = "no eligible destination (no agents)"
CPU_IMAGE = "127.0.0.1:5000/ml/trainer:1.0"
GPU = {"workload": {"image": CPU_IMAGE}, "resources": {"accelerator": {"type": "a100",
                                                                        "count": 1}}}
CPU = {"workload": {"image": CPU_IMAGE}, "args": ["differs", "per", "op"]}


def _add(conn: psycopg.Connection, project: str, key: str, spec: dict, n: int,
         reason: str = NO_AGENTS, queue: str = "default") -> None:
    conn.execute(
        "INSERT INTO operations (project_id, idempotency_key, payload_hash, name, queue, spec,"
        " state, state_reason, pending_reason, max_retries, timeout_seconds)"
        " SELECT %s, %s || g, 'h', 'n', %s, %s::jsonb || jsonb_build_object('name', 'n' || g),"
        " 'blocked', %s, 'no_eligible_destination', 0, 60 FROM generate_series(1, %s) g",
        (project, key, queue, json.dumps(spec), reason, n))


@pytest.fixture
def backlog(pg_dsn: str) -> str:
    """2,000 GPU and 1,000 CPU operations blocked while there was no agent; 5 CPU ones with a
    reason stated by an older fleet."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        project = conn.execute("INSERT INTO projects (name) VALUES ('p') RETURNING id"
                               ).fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO queues (name, priority, concurrency) VALUES ('default', 0, 100)"
                     " ON CONFLICT DO NOTHING")
        _add(conn, project, "gpu-", GPU, 2000)
        _add(conn, project, "cpu-", CPU, 1000)
        _add(conn, project, "old-", CPU, 5, reason="no eligible destination (a: gone)")
        conn.execute("VACUUM ANALYZE operations")
    return pg_dsn


def _sweep(dsn: str) -> scheduling.PassStats:
    """One sweep to its end (a batch per pass while it resumes); the passes' stats summed."""
    async def go() -> scheduling.PassStats:
        total = scheduling.PassStats()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            stats, fleet, resume = await scheduling.schedule(
                conn, alive_seconds=30, lease_seconds=30, last_fleet=None)  # a sweep
            while True:
                total.swept += stats.swept
                total.blocked += stats.blocked
                total.dispatched += stats.dispatched
                if resume is None:
                    return total
                stats, fleet, resume = await scheduling.schedule(
                    conn, alive_seconds=30, lease_seconds=30, last_fleet=fleet,
                    blocked_after=resume)
    return asyncio.run(go())


def _counts(dsn: str) -> dict[tuple[str, str, str], int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT left(idempotency_key, 3), state, state_reason, count(*)"
                            " FROM operations GROUP BY 1, 2, 3").fetchall()
    return {(k, s, r): n for k, s, r, n in rows}


def _events(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]


def test_a_sweep_over_an_unchanged_fleet_reads_only_the_stale_reasons(backlog: str) -> None:
    stats = _sweep(backlog)
    assert stats.swept == 5  # the five with an older fleet's reason, not the 3,000
    assert stats.blocked == 3005
    assert _counts(backlog) == {("gpu", "blocked", NO_AGENTS): 2000,
                                ("cpu", "blocked", NO_AGENTS): 1000,
                                ("old", "blocked", NO_AGENTS): 5}
    assert _events(backlog) == 0  # a reason restated is no transition
    assert _sweep(backlog).swept == 0  # and the next sweep reads none


def test_a_new_agent_unblocks_the_work_it_can_run_and_restates_the_rest(backlog: str) -> None:
    _sweep(backlog)
    with psycopg.connect(backlog, autocommit=True) as conn:
        conn.execute("INSERT INTO agents (name, pool, zone, region, cpu_slots, last_heartbeat_at)"
                     " VALUES ('cpu-1', 'cpu', 'z', 'r', 4, now())")
    stats = _sweep(backlog)
    # every group changed: the CPU work can run, and the GPU work's reason names the new agent
    assert stats.swept == 3005
    assert len(stats.dispatched) == 4  # the agent's four slots; the other CPU work waits
    counts = _counts(backlog)
    assert sum(n for (k, s, _), n in counts.items() if k in ("cpu", "old") and s == "blocked") == 0
    gpu = {(s, r): n for (k, s, r), n in counts.items() if k == "gpu"}
    assert gpu == {("blocked", "no eligible destination (cpu-1: accelerator none != a100)"): 2000}
    assert _sweep(backlog).swept == 0  # settled: the next sweep reads none again
