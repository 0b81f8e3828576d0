"""What the reconciler reads per pass does not grow with history: the routing pass and the
open-state gauges count through partial indexes (``operations_waiting``, migration 0005's
``operations_active``), never by reading the whole operations table, and the finished states,
which can only be counted by reading every finished operation, are counted every
``finished_gauge_interval`` (60 s), not every gauge pass. Checked with the table's own scan
counters in the transaction (``pg_stat_xact_user_tables``) on a table of 5,000 finished
operations, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from controlplane import metrics
from controlplane.reconciler import Reconciler, ReconcilerSettings
from controlplane.store import scheduling

SPEC = {"workload": {"image": "127.0.0.1:5000/ml/trainer:1.0", "command": ["sleep", "1"]}}
OPEN = {"accepted": 3, "queued": 2, "blocked": 1, "retrying": 1, "dispatched": 2, "running": 4}
FINISHED = {"succeeded": 4000, "failed": 700, "canceled": 300}


@pytest.fixture
def history(pg_dsn: str) -> str:
    """Operations in every state; ANALYZEd, as autovacuum would have."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        project = conn.execute("INSERT INTO projects (name) VALUES ('p') RETURNING id"
                               ).fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO queues (name) VALUES ('default') ON CONFLICT DO NOTHING")
        for state, n in {**FINISHED, **OPEN}.items():
            conn.execute(
                "INSERT INTO operations (project_id, idempotency_key, payload_hash, name, queue,"
                " spec, state, max_retries, timeout_seconds) SELECT %s, %s || g, 'h', 'n',"
                " 'default', %s, %s, 0, 60 FROM generate_series(1, %s) g",
                (project, state, json.dumps(SPEC), state, n))
        conn.execute("VACUUM ANALYZE operations")
    return pg_dsn


async def _scans(conn: psycopg.AsyncConnection) -> tuple[int, int]:
    cur = await conn.execute("SELECT seq_scan, coalesce(idx_scan, 0) FROM"
                             " pg_stat_xact_user_tables WHERE relname = 'operations'")
    row = await cur.fetchone()
    return (row[0], row[1]) if row else (0, 0)


def _scans_during(dsn: str, work) -> tuple[int, int, object]:  # type: ignore[no-untyped-def]
    """(sequential scans, index scans) of operations while ``work(conn)`` ran, in one
    transaction (the counters are per transaction), and what it returned."""
    async def run() -> tuple[int, int, object]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            seq0, idx0 = await _scans(conn)
            out = await work(conn)
            seq1, idx1 = await _scans(conn)
            return seq1 - seq0, idx1 - idx0, out
    return asyncio.run(run())


def test_open_state_gauges_count_through_indexes_and_finished_ones_only_when_asked(
        history: str) -> None:
    seq, idx, g = _scans_during(history, lambda c: scheduling.gauges(c, 60.0, finished=False))
    assert g["states"] == OPEN  # type: ignore[index]
    assert seq == 0 and idx >= 2, (seq, idx)

    seq, _, g = _scans_during(history, lambda c: scheduling.gauges(c, 60.0))
    assert g["states"] == {**OPEN, **FINISHED}  # type: ignore[index]
    assert seq >= 1  # the finished states: no index can spare reading them


def test_a_reconciler_pass_never_reads_the_whole_operations_table(history: str) -> None:
    """A whole timed pass (leases, retries, timeouts, pipelines, routing) and open_work."""
    async def one_pass(conn: psycopg.AsyncConnection) -> bool:
        await Reconciler(ReconcilerSettings(dsn=history)).tick(conn)
        return await scheduling.open_work(conn)

    seq, idx, _ = _scans_during(history, one_pass)
    assert seq == 0 and idx >= 1, (seq, idx)


def test_the_reconciler_counts_finished_states_every_finished_gauge_interval(
        history: str) -> None:
    def gauge(state: str) -> float:
        return metrics.OPERATIONS.labels(state)._value.get()

    async def run(interval: float) -> list[float]:
        r = Reconciler(ReconcilerSettings(dsn=history, finished_gauge_interval=interval))
        seen = []
        async with await psycopg.AsyncConnection.connect(history, autocommit=True) as conn:
            await r.export_gauges(conn)  # the first export always counts them
            seen.append(gauge("succeeded"))
            await conn.execute("UPDATE operations SET state = 'succeeded' WHERE id IN"
                               " (SELECT id FROM operations WHERE state = 'canceled' LIMIT 100)")
            await r.export_gauges(conn)
            seen.append(gauge("succeeded"))
            seen.append(gauge("running"))  # open states: every export
        return seen

    assert asyncio.run(run(3600.0)) == [4000, 4000, 4]  # the finished count kept
    assert asyncio.run(run(0.0)) == [4100, 4200, 4]  # counted again at every export


def test_one_read_of_the_waiting_work_gives_what_three_reads_gave(history: str) -> None:
    """The waiting states' counts, each queue's age and the counts per wait reason come from
    one read of the waiting work now; checked against the three statements they replaced, on
    work of two queues (one held), several reasons, NULL among them, and retrying work."""
    with psycopg.connect(history, autocommit=True) as conn:
        conn.execute("INSERT INTO queues (name, concurrency) VALUES ('held', 0), ('empty', 5)"
                     " ON CONFLICT DO NOTHING")
        conn.execute("UPDATE operations SET queue = 'held', waiting_since = now() - interval"
                     " '2 hours' WHERE state = 'accepted' AND idempotency_key = 'accepted1'")
        conn.execute("UPDATE operations SET pending_reason = 'capacity', waiting_since ="
                     " now() - interval '5 minutes' WHERE state = 'queued'")
        conn.execute("UPDATE operations SET pending_reason = 'no_eligible_destination'"
                     " WHERE state = 'blocked'")
        conn.execute("UPDATE operations SET waiting_since = now() - interval '1 day'"
                     " WHERE state = 'retrying'")  # not counted in any queue's age
        states = dict(conn.execute(
            "SELECT state, count(*) FROM operations WHERE state IN ('accepted', 'queued',"
            " 'blocked', 'retrying', 'dispatched', 'running') GROUP BY state").fetchall())
        ages = {q: float(a) for q, a in conn.execute(
            "SELECT q.name, coalesce(extract(epoch FROM now() - min(o.waiting_since)), 0)"
            " FROM queues q LEFT JOIN operations o ON o.queue = q.name AND o.state IN"
            " ('accepted', 'queued', 'blocked') WHERE q.concurrency > 0 GROUP BY q.name")}
        pending = sorted(conn.execute(
            "SELECT queue, coalesce(pending_reason, 'none'), count(*) FROM operations WHERE"
            " state IN ('accepted', 'queued', 'blocked', 'retrying') GROUP BY 1, 2").fetchall())

    async def read() -> dict:
        async with await psycopg.AsyncConnection.connect(history, autocommit=True) as conn:
            return await scheduling.gauges(conn, 60.0, finished=False)

    g = asyncio.run(read())
    assert g["states"] == states
    assert sorted(g["pending"]) == pending
    assert g["queue_age"].keys() == ages.keys() == {"default", "empty"}
    assert g["queue_age"]["empty"] == 0.0
    assert 299 < g["queue_age"]["default"] < 330  # the queued work's 5 minutes, not a day
    assert abs(g["queue_age"]["default"] - ages["default"]) < 5
