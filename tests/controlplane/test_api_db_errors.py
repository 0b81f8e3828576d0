"""Database availability failures become one documented 503 (no database needed): the driver
error is translated once, where the connection is used (controlplane.db.connection), and
answered by one exception handler (controlplane/api/errors.py), whichever route failed."""

from __future__ import annotations

import ast
import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from prometheus_client import REGISTRY
from psycopg_pool import PoolTimeout

import controlplane.api
from controlplane import db
from controlplane.api import group_commit
from controlplane.api.app import Settings, create_app
from controlplane.api.errors import DB_UNAVAILABLE
from controlplane.store import Conflict, StoreUnavailable
from controlplane.store import auth as auth_store
from controlplane.store import operations as op_store

USER = auth_store.Principal("user", "00000000-0000-0000-0000-000000000001", "ml-team")
AUTH = {"Authorization": "Bearer a-user-token-long-enough"}
SPEC = {"name": "x", "workload": {"kind": "train", "image": "127.0.0.1:5000/ml/trainer:1.0"}}


class FakePool:
    """Stands in for the AsyncConnectionPool: hands out a dummy connection, or fails to."""

    def __init__(self) -> None:
        self.fail: Exception | None = None

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[object]:
        if self.fail is not None:
            raise self.fail
        yield object()


@pytest.fixture
def pool() -> FakePool:
    return FakePool()


@pytest.fixture
def app(pool: FakePool, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    async def lookup(conn: Any, token: str) -> auth_store.Principal:
        return USER

    monkeypatch.setattr(auth_store, "lookup", lookup)
    app = create_app(Settings(dsn="postgresql://unused@127.0.0.1:1/none"))
    app.state.pool = pool  # the lifespan never runs: the real pool is never opened
    return app


def call(app: FastAPI, method: str, path: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.request(method, path, **kw)
    return asyncio.run(go())


def db_errors(route: str) -> float:
    return REGISTRY.get_sample_value("controlplane_db_errors_total", {"route": route}) or 0.0


async def store_down(*args: Any, **kwargs: Any) -> Any:
    raise psycopg.OperationalError("server closed the connection unexpectedly")


def test_store_function_operational_error_is_the_documented_503(
        app: FastAPI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(op_store, "get", store_down)
    before = db_errors("/v1/operations/{op_id}")
    with caplog.at_level(logging.WARNING, logger="controlplane.api"):
        r = call(app, "GET", "/v1/operations/abc", headers=AUTH)
    assert (r.status_code, r.json()) == (503, {"detail": DB_UNAVAILABLE})
    assert db_errors("/v1/operations/{op_id}") == before + 1
    logged = [rec for rec in caplog.records if getattr(rec, "action", None) == "db_error"]
    assert [rec.error for rec in logged] == ["server closed the connection unexpectedly"]


def test_without_the_handler_the_same_failure_is_a_500(
        app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    # the handler is the only translation to 503: no route or dependency answers it on its own
    monkeypatch.setattr(op_store, "get", store_down)
    del app.exception_handlers[StoreUnavailable]
    assert call(app, "GET", "/v1/operations/abc", headers=AUTH).status_code == 500


@pytest.mark.parametrize("failure", [PoolTimeout("couldn't get a connection after 5.00 sec"),
                                     psycopg.OperationalError("connection refused")])
def test_no_connection_for_the_token_lookup_is_the_same_503(
        app: FastAPI, pool: FakePool, failure: Exception) -> None:
    pool.fail = failure
    r = call(app, "GET", "/v1/operations", headers=AUTH)
    assert (r.status_code, r.json()) == (503, {"detail": DB_UNAVAILABLE})


def _submitted(*args: Any, **kwargs: Any) -> op_store.SubmitResult:
    now = datetime.now(UTC)
    row = {"id": "00000000-0000-0000-0000-0000000000aa", "spec": SPEC, "state": "accepted",
           "state_reason": None, "pending_reason": None, "attempt_count": 0,
           "idempotency_key": "k", "current_attempt_id": None, "pinned_agent": None,
           "created_at": now, "updated_at": now, "result": None, "last_error": None,
           "first_error": None}
    return op_store.SubmitResult(operation=row, created=True)


def test_submit_retries_a_broken_connection_once(app: FastAPI,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    async def broken_then_fine(conn: Any, items: list[Any]) -> list[op_store.SubmitResult]:
        calls.append(1)
        if len(calls) == 1:
            await store_down()
        return [_submitted() for _ in items]

    monkeypatch.setattr(group_commit, "submit_many", broken_then_fine)
    r = call(app, "POST", "/v1/operations", json=SPEC, headers={**AUTH, "Idempotency-Key": "k"})
    assert r.status_code == 201 and len(calls) == 2


def test_submit_gives_up_after_the_retry(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    async def always_broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        await store_down()

    monkeypatch.setattr(group_commit, "submit_many", always_broken)
    before = db_errors("/v1/operations")
    r = call(app, "POST", "/v1/operations", json=SPEC, headers={**AUTH, "Idempotency-Key": "k"})
    assert (r.status_code, r.json()) == (503, {"detail": DB_UNAVAILABLE})
    assert len(calls) == 2 and db_errors("/v1/operations") == before + 1


@pytest.mark.parametrize("failure", [PoolTimeout("no connection"),
                                     psycopg.OperationalError("terminating connection")])
def test_connection_translates_availability_failures(failure: Exception) -> None:
    async def acquire() -> None:
        async with db.connection(FakePool()):  # type: ignore[arg-type]
            raise failure  # a statement failing mid-request

    async def get_none() -> None:
        pool = FakePool()
        pool.fail = failure  # no connection at all
        async with db.connection(pool):  # type: ignore[arg-type]
            pass

    for attempt in (acquire, get_none):
        with pytest.raises(StoreUnavailable) as info:
            asyncio.run(attempt())
        assert info.value.__cause__ is failure and str(info.value) == str(failure)


def test_connection_passes_other_errors_through() -> None:
    async def conflict() -> None:
        async with db.connection(FakePool()):  # type: ignore[arg-type]
            raise Conflict("key already used for a different payload")

    with pytest.raises(Conflict):
        asyncio.run(conflict())


def test_no_route_translates_driver_errors_itself() -> None:
    # the translation lives in controlplane/db.py; a route catching the driver's errors would
    # answer differently from the one handler (and skip its metric and log)
    api = Path(controlplane.api.__file__).parent
    offenders = [f"{f.name}:{n}" for f in sorted(api.glob("*.py"))
                 for n, line in enumerate(f.read_text().splitlines(), 1)
                 if "OperationalError" in line or "PoolTimeout" in line]
    assert not offenders, f"driver errors handled in the API: {offenders}"


def test_a_pool_connection_stuck_in_the_load_balancer_is_given_up_after_two_seconds() -> None:
    """A listener that accepts and never answers stands for HAProxy retrying a dead primary.
    The pool's connect must give up after libpq's floor (2 s), not the 3 s that kept every
    pooled connection stuck past a 2 s failover (controlplane/db.py CONNECT_TIMEOUT)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))  # held open while in use: nobody else gets this port
        hole.listen(8)
        port = hole.getsockname()[1]
        pool = db.make_pool(f"postgresql://u@127.0.0.1:{port}/x")

        async def attempt() -> float:
            t0 = time.monotonic()
            with pytest.raises(psycopg.OperationalError, match="timeout"):
                await psycopg.AsyncConnection.connect(pool.conninfo, **pool.kwargs)
            return time.monotonic() - t0

        took = asyncio.run(attempt())
    assert 1.9 <= took < 2.8, took


def connect_timeouts(package: Path) -> dict[str, list[str]]:
    """file -> the source of each ``connect_timeout=`` value passed in it (S3 clients aside:
    storage.py's, and any botocore ``Config(...)``, such as the model server's)."""
    out: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name == "storage.py":
            continue
        tree = ast.parse(path.read_text())
        s3 = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Call)
              and (getattr(node.func, "id", None) == "Config"
                   or getattr(node.func, "attr", None) == "Config")
              for k in node.keywords}
        for node in ast.walk(tree):
            if (isinstance(node, ast.keyword) and node.arg == "connect_timeout"
                    and id(node) not in s3):
                out.setdefault(path.relative_to(package).as_posix(), []).append(
                    ast.unparse(node.value))
            if (isinstance(node, ast.Dict)
                    and any(isinstance(k, ast.Constant) and k.value == "connect_timeout"
                            for k in node.keys)):
                out.setdefault(path.relative_to(package).as_posix(), []).extend(
                    ast.unparse(v) for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value == "connect_timeout")
    return out


def test_every_server_connection_through_haproxy_uses_the_same_connect_timeout() -> None:
    """The reconciler's, its listener's and the claim listener's connections meet the same
    HAProxy retry loop as the API pool's: each must pass db.CONNECT_TIMEOUT, not a literal."""
    found = connect_timeouts(Path(controlplane.__file__).parent)
    assert {"db.py", "reconciler.py", "api/claimwait.py"} <= set(found), found
    assert {f: v for f, v in found.items() if set(v) != {"CONNECT_TIMEOUT"}} == {}
