"""Held queues (controlplane/store/queues.py) against real PostgreSQL: the scheduler never
reads a held queue's work (it stays accepted, routed by no pass, and a pass reads none of its
rows), a held queue has no queue age, and its work is canceled in bulk, each operation with its transition event, while a
queue that is not held is refused."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from controlplane.store import Conflict, NotFound, scheduling
from controlplane.store import queues as queue_store

SPEC = {"workload": {"image": "127.0.0.1:5000/ml/trainer:1.0"}}
HELD = 20_000


@pytest.fixture
def held(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        project = conn.execute("INSERT INTO projects (name) VALUES ('p') RETURNING id"
                               ).fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO queues (name, priority, concurrency) VALUES"
                     " ('default', 0, 16), ('held', -100, 0) ON CONFLICT DO NOTHING")
        for queue, n in (("held", HELD), ("default", 3)):
            conn.execute(
                "INSERT INTO operations (project_id, idempotency_key, payload_hash, name, queue,"
                " spec, state, max_retries, timeout_seconds, waiting_since)"
                " SELECT %s, %s || g, 'h', 'n', %s, %s, 'accepted', 0, 60,"
                " now() - interval '1 hour' FROM generate_series(1, %s) g",
                (project, queue, queue, json.dumps(SPEC), n))
        conn.execute("VACUUM ANALYZE operations")
    return pg_dsn


def _run(dsn: str, work):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await work(conn)
    return asyncio.run(go())


def _states(dsn: str) -> dict[tuple[str, str], int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT queue, state, count(*) FROM operations"
                            " GROUP BY queue, state").fetchall()
    return {(q, s): n for q, s, n in rows}


def test_the_scheduler_never_reads_a_held_queue_and_it_has_no_queue_age(held: str) -> None:
    async def fetched(conn: psycopg.AsyncConnection) -> int:
        cur = await conn.execute("SELECT coalesce(idx_tup_fetch, 0) + seq_tup_read FROM"
                                 " pg_stat_xact_user_tables WHERE relname = 'operations'")
        return int((await cur.fetchone())[0])  # type: ignore[index]

    async def one_pass(conn: psycopg.AsyncConnection):  # type: ignore[no-untyped-def]
        async with conn.transaction():
            before = await fetched(conn)
            stats, _, _ = await scheduling.schedule(conn, alive_seconds=10, lease_seconds=30)
            return stats, await fetched(conn) - before, await scheduling.gauges(
                conn, 60.0, finished=False)

    stats, rows_read, gauges = _run(held, one_pass)
    # the default queue's 3 (and their index entries), never the held backlog: 20,009
    # through operations_waiting alone
    assert rows_read < 100, rows_read
    # no agents: the default queue's work is blocked, the held queue's untouched
    assert stats.blocked == 3
    assert _states(held) == {("default", "blocked"): 3, ("held", "accepted"): HELD}
    assert set(gauges["queue_age"]) == {"default"} and gauges["queue_age"]["default"] > 3000
    assert gauges["states"]["accepted"] == HELD


def test_a_held_queue_is_canceled_in_bulk_with_events_and_only_a_held_one(held: str) -> None:
    async def cancel(conn: psycopg.AsyncConnection) -> list[int]:
        done = []
        for _ in range(3):
            done.append(await queue_store.cancel_held(conn, "held", actor="t", reason="r",
                                                      limit=15_000))
        return done

    assert _run(held, cancel) == [15_000, HELD - 15_000, 0]
    assert _states(held) == {("default", "accepted"): 3, ("held", "canceled"): HELD}
    with psycopg.connect(held) as conn:
        events = conn.execute("SELECT count(*), count(DISTINCT operation_id) FROM events"
                              " WHERE from_state = 'accepted' AND to_state = 'canceled'"
                              " AND actor = 't' AND reason = 'r'").fetchone()
    assert events == (HELD, HELD)
    with pytest.raises(Conflict, match="'default' is not held"):
        _run(held, lambda c: queue_store.cancel_held(c, "default", actor="t", reason="r"))
    with pytest.raises(NotFound, match="'nope' does not exist"):
        _run(held, lambda c: queue_store.cancel_held(c, "nope", actor="t", reason="r"))
    assert _states(held)[("default", "accepted")] == 3
