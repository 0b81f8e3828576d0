"""The API's pool against real PostgreSQL: a connection whose backend died while it rested in
the pool is not handed to the next request (controlplane/db.py ``_check_if_idle``), even when
it rested for less than the idle probe's threshold, as the pool's connections do when a
primary is killed under load; a hot healthy one is still handed out without a round trip."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from controlplane import db


async def _kill_then_use(dsn: str) -> list[str]:
    pool = db.make_pool(dsn, min_size=1, max_size=1)
    await pool.open(wait=True)
    try:
        async with pool.connection() as c:
            victim = c.info.backend_pid
            await c.execute("SELECT 1")
        # returned just now: "hot", the idle probe (IDLE_CHECK_SECONDS) would not run
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
        await asyncio.sleep(0.2)  # the server's goodbye reaches the pooled socket
        async with pool.connection() as c:
            await c.execute("SELECT 1")
            return [str(victim), str(c.info.backend_pid)]
    finally:
        await pool.close()


def test_a_hot_pooled_connection_whose_backend_died_is_replaced_not_handed_out(pg_dsn: str) -> None:
    victim, served_by = asyncio.run(_kill_then_use(pg_dsn))
    assert served_by != victim


def test_a_hot_healthy_connection_is_handed_out_without_a_round_trip(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    probes: list[object] = []
    real = AsyncConnectionPool.check_connection

    async def counting(conn: psycopg.AsyncConnection) -> None:
        probes.append(conn)
        await real(conn)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(counting))

    async def twice() -> None:
        pool = db.make_pool(pg_dsn, min_size=1, max_size=1)
        await pool.open(wait=True)
        try:
            for _ in range(2):
                async with pool.connection() as c:
                    await c.execute("SELECT 1")
        finally:
            await pool.close()

    asyncio.run(twice())
    # the first checkout finds a connection that never rested (probed); the second a hot one
    assert len(probes) <= 1, probes
