"""Database plumbing: DSN, connection pools, migrations, and the one place driver errors
become domain errors."""

from __future__ import annotations

import os
import select
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from controlplane.store import StoreUnavailable

DSN_ENV = "CONTROLPLANE_DSN"
MIGRATIONS = Path(__file__).with_name("migrations")
_MIGRATION_LOCK = 7_301_001  # advisory lock id: replicas starting together migrate one at a time


def resolve_dsn(dsn: str | None) -> str:
    dsn = dsn or os.environ.get(DSN_ENV)
    if not dsn:
        raise SystemExit(f"no database DSN: pass --dsn or set {DSN_ENV}")
    return dsn


# psycopg's async wait wakes every 0.1 s (to notice Ctrl-C and deadlines) even while a LISTEN
# connection has nothing to read: about 0.4 % of a core per idle process here. Cancellation
# and explicit deadlines (notifies(timeout=...)) work without those wake-ups.
LISTEN_WAIT_INTERVAL = 60.0


class ListenConnection(psycopg.AsyncConnection):
    """An async connection for LISTEN: waiting for a notification costs no CPU until one (or
    the caller's deadline) arrives."""

    async def wait(self, gen: Any, interval: float = LISTEN_WAIT_INTERVAL, **kwargs: Any) -> Any:
        return await super().wait(gen, interval, **kwargs)


IDLE_CHECK_SECONDS = 1.0


async def _mark_returned(conn: psycopg.AsyncConnection) -> None:
    conn.controlplane_returned_at = time.monotonic()  # type: ignore[attr-defined]


def _server_spoke(conn: psycopg.AsyncConnection) -> bool:
    """The server sent something to a connection resting in the pool: nobody asked, so it is
    the end of the connection (its backend died, HAProxy closed it) or a FATAL before it."""
    try:
        poller = select.poll()  # not select(): any fd number, however many sockets are open
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True  # no usable socket: let the probe decide


async def _check_if_idle(conn: psycopg.AsyncConnection) -> None:
    """Probe a pooled connection when it sat idle or its server closed it meanwhile: a round
    trip per request would cost ~15% of a submission's CPU, while a zero-wait poll of the
    socket costs microseconds and catches the connections a killed primary closed (which would
    otherwise each fail the next request given them). One broken while in use still fails its
    request; callers retry idempotent statements."""
    if (time.monotonic() - getattr(conn, "controlplane_returned_at", 0.0) > IDLE_CHECK_SECONDS
            or _server_spoke(conn)):
        await AsyncConnectionPool.check_connection(conn)


# libpq's floor. A connection opened in the first second of a primary's loss goes to the dead
# primary, which HAProxy still routes to until its check marks it down, and HAProxy retries it
# (three times, a second apart) for as long as the client waits. At 3 s the pool's every
# connection stayed in that loop past the failover (~2 s here), /readyz timed out on both API
# replicas at once, and HAProxy answered 503 with no replica left, after the database was back
# (docs/DESIGN.md section 8.6). The reconciler's and the claim listener's own connections go
# through the same HAProxy: the same bound, or routing and claim wake-ups stall a second longer.
CONNECT_TIMEOUT = 2


# One-shot commands (migrate, seed, token ...): without connect_timeout libpq waits for ever on
# a database that accepts the TCP connection and never answers (a stopped server, a blackholed
# route). Longer than the servers' bound: an operator's command may cross a VPN to a cloud
# database, and nothing else waits behind it.
ONE_SHOT_CONNECT_TIMEOUT = 10


def connect_once(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A connection for a one-shot command, bounded in time unless the DSN or PGCONNECT_TIMEOUT
    already says how long to wait (the user's setting wins)."""
    if ("connect_timeout" not in psycopg.conninfo.conninfo_to_dict(dsn)
            and not os.environ.get("PGCONNECT_TIMEOUT")):
        kwargs.setdefault("connect_timeout", ONE_SHOT_CONNECT_TIMEOUT)
    return psycopg.connect(dsn, **kwargs)


def make_pool(dsn: str, *, min_size: int = 2, max_size: int = 10) -> AsyncConnectionPool:
    return AsyncConnectionPool(
        dsn, min_size=min_size, max_size=max_size, open=False, timeout=5.0,
        check=_check_if_idle, reset=_mark_returned,
        kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT,
                "application_name": "controlplane"},
    )


@asynccontextmanager
async def connection(pool: AsyncConnectionPool,
                     timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
    """A pooled connection; every availability failure, getting it or in any statement run on
    it, leaves as StoreUnavailable (the one translation of driver errors for the API). Other
    errors (constraint violations, the store's domain errors) pass through unchanged."""
    try:
        async with pool.connection(timeout=timeout) as conn:
            yield conn
    # PoolTimeout (no connection within the pool's timeout) is an OperationalError today;
    # named anyway so an exhausted pool stays a 503 should psycopg_pool ever re-parent it
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise StoreUnavailable(str(exc)) from exc


def release_target(script: object, release: str) -> str:
    """The schema revision ``release`` runs on: head for N+1, the revision just before the
    expand migration for N (controlplane/release.py)."""
    from controlplane.release import EXPAND_REVISION

    if release == "N+1":
        return "head"
    down = script.get_revision(EXPAND_REVISION).down_revision  # type: ignore[attr-defined]
    return str(down)


def _has(script: object, current: str | None, revision: str) -> bool:
    if not current:
        return False
    return any(r.revision == revision
               for r in script.iterate_revisions(current, "base"))  # type: ignore[attr-defined]


def migrate(dsn: str, release: str | None = None, *, allow_downgrade: bool = False) -> str:
    """Bring the schema to what ``release`` (default: this process's, controlplane/release.py)
    runs on; idempotent. Never goes back unless ``allow_downgrade``: a schema newer than the
    release needs is left alone (N runs on the expanded schema by design). Returns the
    revision the database is at."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from controlplane.release import EXPAND_REVISION, current, parse

    release = parse(release) if release else current()
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(cfg)
    target = release_target(script, release)
    import sqlalchemy

    engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: connect_once(dsn),
                                      poolclass=sqlalchemy.pool.NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({_MIGRATION_LOCK})")
        try:
            cfg.attributes["connection"] = conn
            at = MigrationContext.configure(conn).get_current_revision()
            if target == "head" or not _has(script, at, EXPAND_REVISION):
                command.upgrade(cfg, target)
            elif allow_downgrade:
                command.downgrade(cfg, target)
            conn.commit()
            at = MigrationContext.configure(conn).get_current_revision()
        finally:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_MIGRATION_LOCK})")
            conn.commit()
    return at or ""
