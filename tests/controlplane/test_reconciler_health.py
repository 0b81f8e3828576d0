"""The reconciler's /healthz (loop alive), /readyz (database reachable), /metrics, 404 otherwise:
through the CLI against real PostgreSQL, with the database stopped or refusing connections,
and in-process with the reconcile loop stuck."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from controlplane.health import ReconcilerHealth, default_stall_seconds, serve
from controlplane.reconciler import Reconciler, ReconcilerSettings
from environments.local.launch import Proc, gameday_cmd, spawn, wait_http
from environments.local.pgserver import PostgresServer, free_port


def start_reconciler(dsn: str, logdir: Path, *extra: str) -> tuple[Proc, str]:
    port = free_port()
    p = spawn("reconciler", gameday_cmd("controlplane", "reconciler", "--metrics-port", str(port),
                                        "--interval", "0.2", *extra),
              logdir, {"CONTROLPLANE_DSN": dsn}, port)
    return p, f"http://127.0.0.1:{port}"


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status(url: str) -> int:
    return httpx.get(url, timeout=2.0).status_code


def assert_stays_live(base: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = httpx.get(f"{base}/healthz", timeout=2.0)
        assert r.status_code == 200, r.text
        time.sleep(0.1)


@pytest.fixture
def reconciler_proc(pg_dsn: str, tmp_path: Path) -> Iterator[tuple[Proc, str]]:
    p, base = start_reconciler(pg_dsn, tmp_path)
    try:
        yield p, base
    finally:
        p.stop()


# -- through the CLI, real PostgreSQL ----------------------------------------------------------
def test_endpoints_against_real_postgres(reconciler_proc: tuple[Proc, str]) -> None:
    p, base = reconciler_proc
    wait_http(f"{base}/readyz", p)
    live = httpx.get(f"{base}/healthz")
    assert live.status_code == 200 and live.json()["status"] == "ok"
    assert live.json()["bound_seconds"] == default_stall_seconds(0.2) == 10.0
    ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.headers["content-type"] == "application/json"

    def passes() -> bool:
        text = httpx.get(f"{base}/metrics").text
        return ('controlplane_reconciler_passes_total{pass="schedule"}' in text
                and 'controlplane_operations{state="queued"}' in text)  # gauges exported too
    wait_for(passes, 10, "reconciler metrics")
    assert httpx.get(f"{base}/metrics").headers["content-type"].startswith("text/plain")

    for path in ("/nope", "/", "/metrics/extra", "/healthz/x", "/favicon.ico"):
        assert status(base + path) == 404, path
    assert httpx.post(f"{base}/healthz").status_code == 405
    head = httpx.head(f"{base}/readyz")
    assert head.status_code == 200 and head.content == b""


def test_readyz_follows_database_outage_while_loop_stays_live(
        pg_server: PostgresServer, pg_dsn: str, reconciler_proc: tuple[Proc, str]) -> None:
    """The database refuses the reconciler (its sessions killed, new connections refused):
    /readyz 503 with the reason, /healthz 200 throughout; ready again once it is back."""
    p, base = reconciler_proc
    wait_http(f"{base}/readyz", p)
    db = pg_dsn.rsplit("/", 1)[1]
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (db,))
        try:
            wait_for(lambda: status(f"{base}/readyz") == 503, 10, "/readyz 503")
            r = httpx.get(f"{base}/readyz")
            assert r.status_code == 503 and r.json()["status"] == "unavailable"
            assert r.json()["detail"].startswith("database: ")
            assert any(s in r.json()["detail"] for s in ("accepting connections", "terminat")), r.json()
            assert_stays_live(base, 3.0)  # many loop iterations, all failing on the database
        finally:
            admin.execute(f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS true')
    wait_for(lambda: status(f"{base}/readyz") == 200, 10, "/readyz 200 after recovery")
    assert status(f"{base}/healthz") == 200


def test_readyz_fails_when_database_server_stops(tmp_path: Path) -> None:
    from controlplane.db import migrate

    with PostgresServer(fsync=False) as pg:
        dsn = pg.create_database("cp")
        migrate(dsn)
        p, base = start_reconciler(dsn, tmp_path)
        try:
            wait_http(f"{base}/readyz", p)
            pg.stop()
            wait_for(lambda: status(f"{base}/readyz") == 503, 10, "/readyz 503")
            detail = httpx.get(f"{base}/readyz").json()["detail"]
            assert detail.startswith("database: ") and "OperationalError" in detail
            assert_stays_live(base, 3.0)
            assert p.popen.poll() is None  # the process rides out the outage
        finally:
            p.stop()


def test_database_never_reachable(tmp_path: Path) -> None:
    p, base = start_reconciler(f"postgresql://postgres@127.0.0.1:{free_port()}/x", tmp_path)
    try:
        wait_http(f"{base}/healthz", p)
        wait_for(lambda: "database: " in httpx.get(f"{base}/readyz").text, 10, "a failed attempt")
        assert status(f"{base}/readyz") == 503
        assert_stays_live(base, 1.0)
    finally:
        p.stop()


# -- in-process: a stuck reconcile loop fails /healthz -------------------------------------------
class InProcess:
    """A Reconciler on its own thread and event loop, its health served on a free port."""

    def __init__(self, dsn: str, stall_seconds: float) -> None:
        self.settings = ReconcilerSettings(dsn=dsn, interval=0.1, stall_seconds=stall_seconds)
        self.rec = Reconciler(self.settings)
        self.server = serve(self.rec.health, "127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete,
                                       args=(self.rec.run(),), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.rec.stop)
        self.thread.join(10)
        self.server.shutdown()
        self.server.server_close()
        if not self.thread.is_alive():
            self.loop.close()


@pytest.mark.parametrize("how", ["hung_await", "blocked_event_loop"])
def test_healthz_fails_when_loop_is_stuck(pg_dsn: str, how: str) -> None:
    rp = InProcess(pg_dsn, stall_seconds=1.0)
    release = threading.Event()
    real_tick = rp.rec.tick
    try:
        wait_for(lambda: status(f"{rp.base}/readyz") == 200, 10, "/readyz 200")
        assert status(f"{rp.base}/healthz") == 200

        async def stuck_tick(conn: psycopg.AsyncConnection) -> None:
            if how == "hung_await":  # a query that never returns: the event loop still runs
                while not release.is_set():
                    await asyncio.sleep(0.05)
            else:  # synchronous work blocking the whole event loop
                release.wait(30)
            await real_tick(conn)

        rp.rec.tick = stuck_tick  # type: ignore[method-assign]
        wait_for(lambda: status(f"{rp.base}/healthz") == 503, 5, "/healthz 503")
        body = httpx.get(f"{rp.base}/healthz").json()
        assert body["status"] == "stalled" and "has not completed an iteration" in body["detail"]
        # no round trip completes either, so readiness goes too (answered from another thread)
        wait_for(lambda: status(f"{rp.base}/readyz") == 503, 5, "/readyz 503")
        assert "last successful round trip" in httpx.get(f"{rp.base}/readyz").json()["detail"]

        release.set()  # unstuck: live and ready again
        wait_for(lambda: status(f"{rp.base}/healthz") == 200, 5, "/healthz 200 again")
        wait_for(lambda: status(f"{rp.base}/readyz") == 200, 5, "/readyz 200 again")
    finally:
        release.set()
        rp.close()


# -- the state machine alone -----------------------------------------------------------------
def test_health_bounds_with_fake_clock() -> None:
    now = [100.0]
    h = ReconcilerHealth(stall_seconds=5.0, ready_seconds=3.0, clock=lambda: now[0])
    assert h.liveness()[0] is True  # alive from start-up
    ok, body = h.readiness()
    assert not ok and body["detail"] == "database: no successful round trip yet"
    h.db_succeeded()
    h.beat()
    assert h.readiness()[0] and h.liveness()[0]
    now[0] += 3.5
    ok, body = h.readiness()
    assert not ok and "3.5s ago (bound 3s)" in body["detail"]
    assert h.liveness()[0]
    h.db_failed("OperationalError: boom")
    h.beat()
    assert h.readiness() == (False, {"status": "unavailable",
                                     "detail": "database: OperationalError: boom"})
    now[0] += 5.5
    ok, body = h.liveness()
    assert not ok and body["status"] == "stalled"
    h.beat()
    h.db_succeeded()
    assert h.liveness()[0] and h.readiness()[0]
    assert default_stall_seconds(0.5) == 10.0 and default_stall_seconds(2.0) == 40.0
