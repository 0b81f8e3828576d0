"""The reconciler's idle cadence, in-process against real PostgreSQL: with no open work it
passes every ``idle_interval``; a NOTIFY, open work, or losing its LISTEN connection brings
back the busy cadence at once. ``scheduling.open_work`` decides which."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from controlplane.reconciler import Reconciler, ReconcilerSettings
from controlplane.store import scheduling

from .helpers import wait_for

SPEC = {"workload": {"image": "127.0.0.1:5000/ml/trainer:1.0", "command": ["sleep", "1"]}}


class CountingReconciler(Reconciler):
    def __init__(self, settings: ReconcilerSettings) -> None:
        super().__init__(settings)
        self.ticks: list[float] = []

    async def tick(self, conn: psycopg.AsyncConnection) -> None:
        self.ticks.append(time.monotonic())
        await super().tick(conn)

    def ticks_since(self, t: float) -> int:
        return sum(1 for x in self.ticks if x >= t)


@pytest.fixture
def running() -> Iterator[Callable[..., CountingReconciler]]:
    started: list[tuple[CountingReconciler, asyncio.AbstractEventLoop, threading.Thread]] = []

    def start(dsn: str, *, idle_interval: float) -> CountingReconciler:
        r = CountingReconciler(ReconcilerSettings(dsn=dsn, interval=0.05,
                                                  idle_interval=idle_interval))
        loop = asyncio.new_event_loop()
        t = threading.Thread(target=loop.run_until_complete, args=(r.run(),), daemon=True)
        t.start()
        started.append((r, loop, t))
        wait(lambda: r.idle, 10, "the reconciler to find no open work")
        return r

    yield start
    for r, loop, t in started:
        loop.call_soon_threadsafe(r.stop)
        t.join(10)
        loop.close()


def wait(pred: Callable[[], object], timeout: float, what: str) -> float:
    """Seconds until ``pred`` holds (helpers.wait_for, polled every 20 ms)."""
    t0 = time.monotonic()
    wait_for(pred, timeout, every=0.02, what=what)
    return time.monotonic() - t0


def insert_operation(dsn: str, *, notify: bool, state: str = "accepted") -> str:
    with psycopg.connect(dsn) as conn:
        project = conn.execute(
            "INSERT INTO projects (name) VALUES ('p') ON CONFLICT (name) DO UPDATE SET name = 'p'"
            " RETURNING id").fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO queues (name) VALUES ('default') ON CONFLICT DO NOTHING")
        op = conn.execute(
            "INSERT INTO operations (project_id, idempotency_key, payload_hash, name, queue, spec,"
            " state, max_retries, timeout_seconds) VALUES (%s, gen_random_uuid()::text, 'h', 'n',"
            " 'default', %s, %s, 0, 60) RETURNING id::text",
            (project, json.dumps(SPEC), state)).fetchone()[0]  # type: ignore[index]
        if notify:  # as a submission does, in the same transaction
            conn.execute("SELECT pg_notify('controlplane_work', 'submitted')")
    return op


def state_of(dsn: str, op: str) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT state FROM operations WHERE id = %s", (op,)).fetchone()[0]  # type: ignore[index]


def open_work(dsn: str) -> bool:
    async def probe() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await scheduling.open_work(conn)
    return asyncio.run(probe())


def test_open_work_is_waiting_retrying_or_leased_work_or_a_running_pipeline(pg_dsn: str) -> None:
    assert open_work(pg_dsn) is False
    done = insert_operation(pg_dsn, notify=False, state="succeeded")
    insert_operation(pg_dsn, notify=False, state="failed")
    assert open_work(pg_dsn) is False  # finished work is not open
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for state in ("accepted", "queued", "blocked", "retrying"):
            conn.execute("UPDATE operations SET state = %s WHERE id = %s", (state, done))
            assert open_work(pg_dsn) is True, state
        conn.execute("UPDATE operations SET state = 'running' WHERE id = %s", (done,))
        agent = conn.execute("INSERT INTO agents (name, pool, zone, region, cpu_slots) VALUES"
                             " ('a', 'cpu', 'z', 'r', 1) RETURNING id").fetchone()[0]  # type: ignore[index]
        attempt = conn.execute(
            "INSERT INTO attempts (operation_id, number, agent_id, state, lease_expires_at)"
            " VALUES (%s, 1, %s, 'running', now()) RETURNING id", (done, agent)).fetchone()[0]  # type: ignore[index]
        assert open_work(pg_dsn) is True  # a lease to expire, a timeout to enforce
        conn.execute("UPDATE attempts SET state = 'succeeded' WHERE id = %s", (attempt,))
        conn.execute("UPDATE operations SET state = 'succeeded' WHERE id = %s", (done,))
        assert open_work(pg_dsn) is False
        project = conn.execute("SELECT id FROM projects").fetchone()[0]  # type: ignore[index]
        pipeline = conn.execute(
            "INSERT INTO pipelines (project_id, idempotency_key, payload_hash, name, spec, state)"
            " VALUES (%s, 'k', 'h', 'p', '{}', 'running') RETURNING id", (project,)).fetchone()[0]  # type: ignore[index]
        assert open_work(pg_dsn) is True
        conn.execute("UPDATE pipelines SET state = 'succeeded' WHERE id = %s", (pipeline,))
        assert open_work(pg_dsn) is False


def test_the_liveness_bound_outlasts_an_idle_wait() -> None:
    assert ReconcilerSettings(dsn="", interval=0.5, idle_interval=4.0).stall_bound == 20.0
    assert ReconcilerSettings(dsn="", interval=0.5, idle_interval=1.0).stall_bound == 10.0
    assert ReconcilerSettings(dsn="", idle_interval=9.0, stall_seconds=3.0).stall_bound == 3.0


def test_an_idle_reconciler_passes_at_the_idle_interval(pg_dsn: str, running: Callable[..., CountingReconciler]) -> None:
    r = running(pg_dsn, idle_interval=1.0)
    t0 = time.monotonic()
    time.sleep(3.0)
    # busy, it would pass every 0.05 s (about 60 times); idle, every 1 s
    assert r.ticks_since(t0) <= 5 and r.idle


def test_a_notify_ends_the_idle_wait_and_open_work_keeps_the_busy_cadence(
        pg_dsn: str, running: Callable[..., CountingReconciler]) -> None:
    r = running(pg_dsn, idle_interval=5.0)
    op = insert_operation(pg_dsn, notify=True)
    # routed (no agent: it waits with a reason) long before the 5 s idle wait would end
    took = wait(lambda: state_of(pg_dsn, op) != "accepted", 3.0, "the routing pass")
    assert took < 1.5, took
    t0 = time.monotonic()
    time.sleep(1.0)
    assert not r.idle and r.ticks_since(t0) >= 8  # waiting work: every 0.05 s again


def test_losing_listen_ends_the_idle_wait(pg_dsn: str, running: Callable[..., CountingReconciler]) -> None:
    running(pg_dsn, idle_interval=5.0)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                              " WHERE application_name = 'reconciler-listen'").fetchone()[0]  # type: ignore[index]
    assert killed == 1
    # work that arrives while nobody listens (no NOTIFY reaches the reconciler)
    op = insert_operation(pg_dsn, notify=False)
    took = wait(lambda: state_of(pg_dsn, op) != "accepted", 4.0, "the routing pass")
    assert took < 0.8, took  # not at the next idle pass, nor after LISTEN is back (1 s)


def listen_backend(dsn: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_activity"
                           " WHERE application_name = 'reconciler-listen'").fetchone()
    return row[0] if row else None


def test_a_failed_pass_opens_listen_again(pg_dsn: str,
                                          running: Callable[..., CountingReconciler]) -> None:
    running(pg_dsn, idle_interval=5.0)
    before = listen_backend(pg_dsn)
    assert before is not None
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the pass's own connection breaks
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE application_name = 'reconciler'")
    # LISTEN looked healthy, yet it is opened again with the pass's connection
    wait(lambda: listen_backend(pg_dsn) not in (None, before), 8.0, "a new LISTEN connection")
