"""Releases N and N+1 on one database (controlplane/release.py, docs/upgrades.md): the expand
migration keeps both columns equal whichever release writes, `migrate --release N` never
takes a schema back unless asked, and the seeded defect `contract-too-early` really removes
the column N reads (and its downgrade brings it back)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

from controlplane import defects, release
from controlplane.db import migrate
from controlplane.states import OpState
from controlplane.store.transitions import transition


def _columns(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT column_name FROM information_schema.columns "
                            "WHERE table_name = 'operations'").fetchall()
    return {r[0] for r in rows}


def _revision(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]  # type: ignore[index]


def _operation(dsn: str, state: str = "accepted") -> str:
    with psycopg.connect(dsn) as conn:
        project = conn.execute("INSERT INTO projects (name) VALUES ('p') "
                               "ON CONFLICT (name) DO UPDATE SET name = 'p' RETURNING id").fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO queues (name) VALUES ('default') ON CONFLICT DO NOTHING")
        return str(conn.execute(
            "INSERT INTO operations (project_id, idempotency_key, payload_hash, name, queue, spec,"
            " state, max_retries, timeout_seconds) VALUES (%s, gen_random_uuid()::text, 'h', 'n',"
            " 'default', '{}', %s, 0, 60) RETURNING id", (project, state)).fetchone()[0])  # type: ignore[index]


def _project(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO queues (name) VALUES ('default') ON CONFLICT DO NOTHING")
        return str(conn.execute("INSERT INTO projects (name) VALUES ('p') ON CONFLICT (name) "
                                "DO UPDATE SET name = 'p' RETURNING id").fetchone()[0])  # type: ignore[index]


def _row(dsn: str, op_id: str) -> dict:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute("SELECT * FROM operations WHERE id = %s", (op_id,)).fetchone()  # type: ignore[return-value]


@pytest.fixture
def as_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    def switch(name: str, defect: str = "") -> None:
        monkeypatch.setenv(release.ENV, name)
        monkeypatch.setenv(defects.ENV, defect)
        release.current.cache_clear()
        defects.active.cache_clear()

    yield switch
    release.current.cache_clear()
    defects.active.cache_clear()


def test_release_names_and_reads() -> None:
    assert release.parse(None) == "N" and release.parse("N+1") == "N+1"
    with pytest.raises(release.UnknownRelease, match="CONTROLPLANE_RELEASE"):
        release.parse("N+2")
    old_row = {"pending_reason": "backoff"}
    assert release.wait_reason(old_row, "N") == "backoff"
    assert release.wait_reason({**old_row, "wait_reason": None}, "N+1") == "backoff"
    assert release.wait_reason({**old_row, "wait_reason": "capacity"}, "N+1") == "capacity"
    with pytest.raises(KeyError):  # N knows one column: its absence is an error, not a None
        release.wait_reason({"wait_reason": "capacity"}, "N")
    assert release.wait_reason_column("N") == "pending_reason"
    assert release.wait_reason_column("N+1") == "wait_reason"


def test_expand_keeps_both_releases_in_step_and_downgrade_only_when_asked(pg_dsn: str,
                                                                          as_release) -> None:
    assert "wait_reason" not in _columns(pg_dsn)  # the test template is release N's schema
    before = _revision(pg_dsn)
    op_id = _operation(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE operations SET pending_reason = 'backoff' WHERE id = %s", (op_id,))
    assert migrate(pg_dsn, "N+1") == release.EXPAND_REVISION
    assert {"pending_reason", "wait_reason"} <= _columns(pg_dsn)
    assert _row(pg_dsn, op_id)["wait_reason"] == "backoff"  # backfilled

    as_release("N+1")  # N+1 writes the new column only; N sees it in its own
    asyncio.run(_transition(pg_dsn, op_id, OpState.QUEUED, pending_reason="capacity"))
    assert (_row(pg_dsn, op_id)["pending_reason"], _row(pg_dsn, op_id)["wait_reason"]) == (
        "capacity", "capacity")
    as_release("N")  # ... and the other way round; N clears it on dispatch, N+1 sees that
    asyncio.run(_transition(pg_dsn, op_id, OpState.DISPATCHED))
    assert (_row(pg_dsn, op_id)["pending_reason"], _row(pg_dsn, op_id)["wait_reason"]) == (
        None, None)
    new_op = _operation(pg_dsn)  # a row inserted by N+1 with the new column
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE operations SET wait_reason = 'quota' WHERE id = %s", (new_op,))
    assert release.wait_reason(_row(pg_dsn, new_op), "N") == "quota"

    assert migrate(pg_dsn, "N") == release.EXPAND_REVISION  # never back unless asked
    assert migrate(pg_dsn, "N", allow_downgrade=True) == before
    assert "wait_reason" not in _columns(pg_dsn)
    assert _row(pg_dsn, new_op)["pending_reason"] == "quota"


def test_contract_too_early_removes_the_column_n_reads(pg_dsn: str, as_release) -> None:
    op_id = _operation(pg_dsn)
    as_release("N+1", "contract-too-early")
    migrate(pg_dsn)
    assert "pending_reason" not in _columns(pg_dsn) and "wait_reason" in _columns(pg_dsn)
    assert release.wait_reason(_row(pg_dsn, op_id), "N+1") is None  # N+1 still works
    asyncio.run(_transition(pg_dsn, op_id, OpState.QUEUED, pending_reason="capacity"))
    assert _row(pg_dsn, op_id)["wait_reason"] == "capacity"  # it writes the new column only
    with pytest.raises(KeyError):
        release.wait_reason(_row(pg_dsn, op_id), "N")  # N does not
    as_release("N")
    migrate(pg_dsn, allow_downgrade=True)
    assert "pending_reason" in _columns(pg_dsn) and "wait_reason" not in _columns(pg_dsn)


async def _transition(dsn: str, op_id: str, dst: OpState, **sets: object) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await transition(conn, op_id, dst, actor="test", reason="test", **sets) is not None


def test_pooled_connections_survive_the_expand(pg_dsn: str, as_release) -> None:
    """Release N's pooled connection keeps answering through the store when N+1's expand adds
    a column, after every statement below was prepared on it (psycopg prepares after five
    runs; a prepared `SELECT *` would then fail for good with "cached plan must not change
    result type", controlplane/store/columns.py)."""
    from controlplane.db import make_pool
    from controlplane.store import agents, operations, scheduling

    as_release("N")
    project = _project(pg_dsn)
    spec = {"name": "x", "queue": "default", "priority": 0, "max_retries": 1,
            "timeout_seconds": 10, "workload": {"image": "a:1"}}

    async def every_statement(conn: psycopg.AsyncConnection, n: int) -> None:
        res = await operations.submit(conn, project_id=project, key=f"k{n}", spec=spec,
                                      actor="test")
        op_id = res.operation["id"]
        again = await operations.submit(conn, project_id=project, key=f"k{n}", spec=spec,
                                        actor="test")
        assert not again.created and again.operation["id"] == op_id
        assert (await operations.get(conn, str(op_id), None))["pending_reason"] is None
        assert (await operations.list_ops(conn, project_id=project, state=None, queue=None,
                                          limit=5, cursor=None))[0]
        assert await operations.events(conn, str(op_id))
        assert await operations.attempts(conn, str(op_id)) == []
        moved = await transition(conn, op_id, OpState.QUEUED, actor="t", reason="r",
                                 pending_reason="capacity")
        assert moved is not None and moved["pending_reason"] == "capacity"
        await scheduling.destinations(conn, 10.0)
        await agents.list_agents(conn, 10.0)

    async def go() -> None:
        pool = make_pool(pg_dsn, min_size=1, max_size=1)
        await pool.open()
        try:
            async with pool.connection() as conn:
                for n in range(7):  # past psycopg's default prepare threshold (5)
                    await every_statement(conn, n)
                await asyncio.to_thread(migrate, pg_dsn, "N+1")
                assert "wait_reason" in _columns(pg_dsn)
                for n in range(7, 9):
                    await every_statement(conn, n)
        finally:
            await pool.close()

    asyncio.run(go())
