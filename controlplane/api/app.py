"""The control plane's HTTP API (FastAPI). Every write commits before it answers."""

# no `from __future__ import annotations`: FastAPI must see the local Annotated aliases.

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import AsyncConnectionPool

from controlplane import defects, metrics
from controlplane.api import admin, serialize
from controlplane.db import make_pool
from controlplane.models import (
    AgentEvents,
    AgentRegistration,
    AttemptEvents,
    AttemptHeartbeat,
    AttemptReport,
    BreakerOverride,
    CancelRequest,
    ClaimRequest,
    OperationSpec,
    RouteOverride,
    SideEffectRequest,
)
from controlplane.states import OpState
from controlplane.store import Conflict, InvalidReference, NotFound, StaleReport, scheduling
from controlplane.store import agents as agent_store
from controlplane.store import auth as auth_store
from controlplane.store import operations as op_store

log = logging.getLogger("controlplane.api")


@dataclass(frozen=True)
class Settings:
    dsn: str
    lease_seconds: float = 15.0
    heartbeat_seconds: float = 5.0
    token_cache_seconds: float = 30.0
    pool_max: int = 10
    retry_base_seconds: float = 1.0
    # TEST ONLY, never in a deployment: acknowledge submissions *before* committing them
    # (write-behind every few seconds). It exists so the harness can prove it sees lost
    # acknowledged work: the api-replica-loss game day must fail its durability objective.
    unsafe_ack_before_commit: bool = False
    unsafe_flush_seconds: float = 10.0


class TokenCache:
    """Token -> principal, kept briefly so a submission costs one round trip, not two."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[str, tuple[float, auth_store.Principal]] = {}

    def get(self, token: str) -> auth_store.Principal | None:
        hit = self._items.get(token)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        return None

    def put(self, token: str, principal: auth_store.Principal) -> None:
        if len(self._items) > 10_000:
            self._items.clear()
        self._items[token] = (time.monotonic() + self.ttl, principal)


def create_app(settings: Settings) -> FastAPI:
    if defects.enabled("ack-before-commit"):  # the seeded-defect switch for the same thing
        settings = dataclasses.replace(settings, unsafe_ack_before_commit=True)
    pool: AsyncConnectionPool = make_pool(settings.dsn, max_size=settings.pool_max)
    tokens = TokenCache(settings.token_cache_seconds)

    write_behind: list[tuple[str, str, str, dict[str, Any], str]] = []

    async def flush_write_behind() -> None:
        while True:
            await asyncio.sleep(settings.unsafe_flush_seconds)
            batch, write_behind[:] = list(write_behind), []
            for op_id, project_id, key, doc, actor in batch:
                try:
                    async with pool.connection() as c:
                        await op_store.submit(c, project_id=project_id, key=key, spec=doc,
                                              actor=actor, op_id=op_id)
                except Exception:
                    log.exception("write-behind insert failed", extra={"operation_id": op_id})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # wait=False: the API must start (and answer /healthz, fail /readyz) with the DB down
        await pool.open(wait=False)
        flusher = None
        if settings.unsafe_ack_before_commit:
            log.warning("UNSAFE: acknowledging submissions before commit (test-only mode)",
                        extra={"action": "unsafe_mode"})
            flusher = asyncio.create_task(flush_write_behind())
        yield
        if flusher:
            flusher.cancel()
        await pool.close()

    app = FastAPI(title="ML control plane", version="1.0", lifespan=lifespan,
                  description="Reference ML control plane: durable submissions, explicit states,"
                  " leases with fencing, eligibility-first routing.")
    app.state.settings = settings
    app.add_middleware(MetricsMiddleware)

    async def conn() -> AsyncIterator[psycopg.AsyncConnection]:
        try:
            async with pool.connection() as c:
                yield c
        except psycopg.OperationalError as exc:
            raise HTTPException(503, f"database unavailable: {exc.__class__.__name__}") from exc
        except Exception as exc:
            if exc.__class__.__name__ == "PoolTimeout":
                raise HTTPException(503, "database unavailable: no connection") from exc
            raise

    Conn = Annotated[psycopg.AsyncConnection, Depends(conn)]

    async def principal(request: Request,
                        authorization: Annotated[str | None, Header()] = None,
                        ) -> auth_store.Principal:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        token = authorization[7:].strip()
        p = tokens.get(token)
        if p is None:
            try:
                async with pool.connection() as c:
                    p = await auth_store.lookup(c, token)
            except psycopg.OperationalError as exc:
                raise HTTPException(503, "database unavailable") from exc
            if p is None:
                raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
            tokens.put(token, p)
        return p

    def role(*roles: str) -> Callable[..., Awaitable[auth_store.Principal]]:
        async def dep(p: Annotated[auth_store.Principal, Depends(principal)],
                      ) -> auth_store.Principal:
            if p.role not in roles:
                raise HTTPException(403, f"a {p.role} token cannot do this (needs {'/'.join(roles)})")
            return p
        return dep

    User = Annotated[auth_store.Principal, Depends(role("user"))]
    UserOrAdmin = Annotated[auth_store.Principal, Depends(role("user", "admin"))]
    Agent = Annotated[auth_store.Principal, Depends(role("agent"))]
    Admin = Annotated[auth_store.Principal, Depends(role("admin"))]
    AnyRole = Annotated[auth_store.Principal, Depends(role("user", "agent", "admin"))]

    @app.exception_handler(NotFound)
    async def _nf(request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 404)

    @app.exception_handler(Conflict)
    async def _cf(request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 409)

    @app.exception_handler(InvalidReference)
    async def _ir(request: Request, exc: InvalidReference) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 422)

    @app.exception_handler(psycopg.OperationalError)
    async def _db(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        metrics.DB_ERRORS.labels(_route(request.scope)).inc()
        log.warning("database error", extra={"action": "db_error", "error": str(exc)})
        return JSONResponse({"detail": "database unavailable; retry with the same "
                             "Idempotency-Key"}, 503)

    # ---- health -------------------------------------------------------------------------
    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> Response:
        if defects.enabled("readyz-lies"):  # seeded defect: ready whatever the database says
            return JSONResponse({"status": "ready"})
        try:
            async with pool.connection(timeout=1.0) as c:
                await c.execute("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            return JSONResponse({"status": "unavailable", "detail": f"database: {exc}"}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    # ---- operations (users) -------------------------------------------------------------
    @app.post("/v1/operations", status_code=201, tags=["operations"])
    async def submit(spec: OperationSpec, p: User, response: Response,
                     idempotency_key: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        if not idempotency_key or len(idempotency_key) > 200:
            metrics.SUBMISSIONS.labels(p.project, spec.queue, "rejected").inc()
            raise HTTPException(422, "header Idempotency-Key is required (1-200 characters)")
        doc = spec.model_dump(mode="json")
        if settings.unsafe_ack_before_commit:
            return _unsafe_ack(p, idempotency_key, doc)
        for attempt in (1, 2):
            try:
                async with pool.connection() as c:
                    res = await op_store.submit(c, project_id=p.project_id,  # type: ignore[arg-type]
                                                key=idempotency_key, spec=doc,
                                                actor=f"user:{p.project}")
                break
            except (Conflict, InvalidReference):
                metrics.SUBMISSIONS.labels(p.project, spec.queue, "rejected").inc()
                raise
            except psycopg.OperationalError:
                # a pooled connection broken by a failover: the statement is idempotent
                # (ON CONFLICT on the key), so one retry on a fresh connection is safe
                if attempt == 2:
                    raise
        metrics.SUBMISSIONS.labels(p.project, spec.queue,
                                   "accepted" if res.created else "duplicate").inc()
        if not res.created:
            response.status_code = 200
        else:
            log.info("submission accepted", extra={
                "action": "submit", "operation_id": str(res.operation["id"]),
                "project": p.project, "queue": spec.queue})
        return serialize.operation(res.operation, p.project)

    def _unsafe_ack(p: auth_store.Principal, key: str, doc: dict[str, Any]) -> dict[str, Any]:
        import uuid
        from datetime import datetime

        op_id = str(uuid.uuid4())
        write_behind.append((op_id, p.project_id or "", key, doc, f"user:{p.project}"))
        metrics.SUBMISSIONS.labels(p.project, doc["queue"], "accepted").inc()
        now = datetime.now(UTC)
        row = {"id": op_id, "spec": doc, "state": "accepted", "state_reason": "acknowledged",
               "pending_reason": None, "attempt_count": 0, "idempotency_key": key,
               "current_attempt_id": None, "pinned_agent": None, "created_at": now,
               "updated_at": now, "result": None, "last_error": None, "first_error": None}
        return serialize.operation(row, p.project)

    @app.get("/v1/operations/{op_id}", tags=["operations"])
    async def get_op(op_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
        row = await op_store.get(c, op_id, p.project_id)
        return serialize.operation(row, p.project)

    @app.get("/v1/operations", tags=["operations"])
    async def list_ops(p: UserOrAdmin, c: Conn, state: OpState | None = None,
                       queue: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=500)] = 100,
                       cursor: str | None = None) -> dict[str, Any]:
        rows, nxt = await op_store.list_ops(c, project_id=p.project_id,
                                            state=state.value if state else None, queue=queue,
                                            limit=limit, cursor=cursor)
        return {"items": [serialize.operation(r, p.project) for r in rows], "next_cursor": nxt}

    @app.post("/v1/operations/{op_id}/cancel", tags=["operations"])
    async def cancel(op_id: str, p: UserOrAdmin, c: Conn,
                     body: CancelRequest | None = None) -> dict[str, Any]:
        reason = (body or CancelRequest()).reason
        row = await op_store.cancel(c, op_id, p.project_id, actor=f"{p.role}:{p.project or ''}",
                                    reason=reason)
        return serialize.operation(row, p.project)

    @app.get("/v1/operations/{op_id}/events", tags=["operations"])
    async def events(op_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
        op = await op_store.get(c, op_id, p.project_id)
        return {"items": [serialize.event(e) for e in await op_store.events(c, op["id"])]}

    @app.get("/v1/operations/{op_id}/attempts", tags=["operations"])
    async def attempts(op_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
        op = await op_store.get(c, op_id, p.project_id)
        return {"items": [serialize.attempt(a) for a in await op_store.attempts(c, op["id"])]}

    @app.post("/v1/operations/{op_id}/side-effects", status_code=201, tags=["operations"])
    async def side_effect(op_id: str, body: SideEffectRequest, p: AnyRole, c: Conn,
                          response: Response) -> dict[str, Any]:
        row, created = await op_store.side_effect(
            c, op_id, p.project_id if p.role == "user" else None, action_id=body.action_id,
            kind=body.kind, payload=body.payload, actor=f"{p.role}:{p.project or ''}")
        if not created:
            response.status_code = 200
        return {"action_id": row["action_id"], "kind": row["kind"], "receipt": row["receipt"],
                "created": created, "recorded_at": row["created_at"].isoformat()}

    # ---- agents -------------------------------------------------------------------------
    @app.post("/v1/agents/register", tags=["agents"])
    async def register(body: AgentRegistration, p: Agent, c: Conn) -> dict[str, Any]:
        agent_id = await agent_store.register(c, body.model_dump(mode="json"))
        log.info("agent registered", extra={"action": "register", "agent": body.name,
                                            "pool": body.pool})
        return {"agent_id": agent_id, "lease_seconds": settings.lease_seconds,
                "heartbeat_seconds": settings.heartbeat_seconds}

    @app.post("/v1/agents/{agent_id}/heartbeat", tags=["agents"])
    async def agent_heartbeat(agent_id: str, p: Agent, c: Conn) -> dict[str, bool]:
        await agent_store.heartbeat(c, _uuid_or_404(agent_id, "agent"))
        return {"ok": True}

    @app.post("/v1/agents/{agent_id}/claim", tags=["agents"])
    async def claim(agent_id: str, body: ClaimRequest, p: Agent, c: Conn) -> dict[str, Any]:
        rows = await agent_store.claim(c, _uuid_or_404(agent_id, "agent"), body.max,
                                       settings.lease_seconds)
        return {"items": [{
            "attempt_id": str(r["attempt_id"]), "operation_id": str(r["operation_id"]),
            "number": r["number"], "fencing_token": r["fencing_token"],
            "lease_expires_at": r["lease_expires_at"].isoformat(),
            "lease_seconds": r["lease_seconds"], "spec": r["spec"], "project": r["project"],
        } for r in rows]}

    @app.post("/v1/agents/{agent_id}/events", tags=["agents"])
    async def agent_events(agent_id: str, body: AgentEvents, p: Agent, c: Conn,
                           x_agent_name: Annotated[str, Header()] = "unknown") -> dict[str, int]:
        n = await agent_store.agent_events(
            c, _uuid_or_404(agent_id, "agent"), _uuid_or_404(body.attempt_id, "attempt"),
            [e.model_dump(mode="json") for e in body.events], f"agent:{x_agent_name}")
        return {"recorded": n}

    async def _stale(c: psycopg.AsyncConnection, exc: StaleReport, attempt_id: str,
                     agent: str) -> JSONResponse:
        metrics.STALE_REPORTS.labels(agent).inc()
        await agent_store.record_stale(c, exc, attempt_id, f"agent:{agent}")
        log.warning("stale report refused", extra={"action": "stale_report",
                                                   "attempt_id": attempt_id,
                                                   "operation_id": exc.operation_id})
        return JSONResponse({"detail": str(exc)}, 409)

    @app.post("/v1/attempts/{attempt_id}/heartbeat", tags=["agents"])
    async def attempt_heartbeat(attempt_id: str, body: AttemptHeartbeat, p: Agent, c: Conn,
                                x_agent_name: Annotated[str, Header()] = "unknown") -> Any:
        try:
            out = await agent_store.attempt_heartbeat(
                c, _uuid_or_404(attempt_id, "attempt"), body.fencing_token, body.progress,
                settings.lease_seconds)
        except StaleReport as exc:
            return await _stale(c, exc, attempt_id, x_agent_name)
        lease = out["lease_expires_at"]
        return {"cancel": out["cancel"], "lease_expires_at": lease.isoformat() if lease else None}

    @app.post("/v1/attempts/{attempt_id}/events", tags=["agents"])
    async def attempt_events(attempt_id: str, body: AttemptEvents, p: Agent, c: Conn,
                             x_agent_name: Annotated[str, Header()] = "unknown") -> Any:
        try:
            n = await agent_store.attempt_events(
                c, _uuid_or_404(attempt_id, "attempt"), body.fencing_token,
                [e.model_dump(mode="json") for e in body.events], f"agent:{x_agent_name}")
        except StaleReport as exc:
            return await _stale(c, exc, attempt_id, x_agent_name)
        for e in body.events:
            if e.kind in ("checkpoint_written", "artifact_written"):
                metrics.ARTIFACT_WRITES.labels("ok").inc()
            elif e.data.get("storage_unavailable"):
                metrics.ARTIFACT_WRITES.labels("retrying").inc()
        return {"recorded": n}

    @app.post("/v1/attempts/{attempt_id}/report", tags=["agents"])
    async def attempt_report(attempt_id: str, body: AttemptReport, p: Agent, c: Conn,
                             x_agent_name: Annotated[str, Header()] = "unknown") -> Any:
        try:
            out = await agent_store.report(c, _uuid_or_404(attempt_id, "attempt"),
                                           body.model_dump(mode="json"),
                                           f"agent:{x_agent_name}",
                                           retry_base=settings.retry_base_seconds)
        except StaleReport as exc:
            return await _stale(c, exc, attempt_id, x_agent_name)
        pool = out.pop("pool", "unknown")
        if body.state == "running" and out.get("scheduling_delay") is not None:
            metrics.SCHEDULING_DELAY.labels(pool).observe(out["scheduling_delay"])
        elif body.state == "succeeded":
            metrics.ATTEMPTS_FINISHED.labels(pool, "succeeded", "").inc()
        elif body.state == "failed":
            reason = out.pop("reason", "other")
            metrics.ATTEMPTS_FINISHED.labels(pool, "failed", reason).inc()
            if out.pop("before_running", False):
                metrics.STARTUP_FAILURES.labels(pool, reason).inc()
        out.pop("scheduling_delay", None)
        return out

    # ---- operator -----------------------------------------------------------------------
    @app.get("/v1/agents", tags=["operator"])
    async def list_agents(p: Admin, c: Conn) -> dict[str, Any]:
        rows = await agent_store.list_agents(c, settings.lease_seconds)
        return {"items": [serialize.agent(r) for r in rows]}

    @app.post("/v1/agents/{name}/breaker", tags=["operator"])
    async def breaker(name: str, body: BreakerOverride, p: Admin, c: Conn) -> dict[str, Any]:
        await agent_store.set_breaker(c, name, body.state)
        return {"agent": name, "breaker": body.state}

    @app.post("/v1/operations/{op_id}/route", tags=["operator"])
    async def route(op_id: str, body: RouteOverride, p: Admin, c: Conn) -> dict[str, Any]:
        row = await scheduling.pin_route(c, op_id, body.agent, actor="admin",
                                         alive_seconds=settings.lease_seconds)
        return serialize.operation(row, None)

    admin.install(app, Conn, Admin)  # restore from a client ledger; 308 for redirected ids
    return app


class MetricsMiddleware:
    """Request count and latency by route template. Plain ASGI: Starlette's BaseHTTPMiddleware
    costs a task and a stream per request, which shows at hundreds of submissions/s."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = _route(scope)
            metrics.HTTP_REQUESTS.labels(route, scope["method"], str(status["code"])).inc()
            metrics.HTTP_LATENCY.labels(route, scope["method"]).observe(
                time.perf_counter() - start)


SETTINGS_ENV = "CONTROLPLANE_API_SETTINGS"


def app_from_env() -> FastAPI:
    """uvicorn factory: the `api` command puts its Settings in the environment."""
    import json
    import os

    from controlplane import logs

    logs.setup(os.environ.get("CONTROLPLANE_LOG_LEVEL", "INFO"))
    return create_app(Settings(**json.loads(os.environ[SETTINGS_ENV])))


def _route(scope: dict[str, Any]) -> str:
    r = scope.get("route")
    return getattr(r, "path", "unmatched")


def _uuid_or_404(value: str, what: str) -> str:
    import uuid

    try:
        return str(uuid.UUID(value))
    except ValueError as exc:
        raise HTTPException(404, f"{what} {value} not found") from exc
