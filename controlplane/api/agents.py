"""Agent routes: register, heartbeat, claim work, and the fenced attempt calls (heartbeat,
events, report). A report whose fencing token lost the attempt is refused with 409."""

# no `from __future__ import annotations`: FastAPI must see the dependency aliases.

import asyncio
import uuid
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from controlplane import db, metrics
from controlplane.api import errors
from controlplane.api.claimwait import ClaimWakeups
from controlplane.api.deps import Agent, Config, Conn, Pool, log
from controlplane.api.edge import EdgeRoute
from controlplane.models import (
    AgentEvent,
    AgentEvents,
    AgentRegistration,
    AttemptEvents,
    AttemptHeartbeat,
    AttemptReport,
    ClaimRequest,
)
from controlplane.store import StaleReport
from controlplane.store import agents as agent_store

router = APIRouter(tags=["agents"], route_class=EdgeRoute)
# Agents ask for at most their heartbeat interval (the claim's query is what heartbeats a
# waiting agent); the bound stays under the load balancer's 10 s server timeout
# (environments/local/components.py), past which it would answer 504 and retry the claim.
MAX_CLAIM_WAIT_SECONDS = 8.0


@router.post("/v1/agents/register")
async def register(body: AgentRegistration, p: Agent, c: Conn,
                   settings: Config) -> dict[str, Any]:
    agent_id = await agent_store.register(c, body.model_dump(mode="json"), settings.lease_seconds)
    log.info("agent registered", extra={"action": "register", "agent": body.name,
                                        "pool": body.pool})
    return {"agent_id": agent_id, "lease_seconds": settings.lease_seconds,
            "heartbeat_seconds": settings.heartbeat_seconds}


@router.post("/v1/agents/{agent_id}/heartbeat")
async def agent_heartbeat(agent_id: str, p: Agent, c: Conn, settings: Config) -> dict[str, bool]:
    await agent_store.heartbeat(c, _uuid_or_404(agent_id, "agent"), settings.lease_seconds)
    return {"ok": True}


@router.post("/v1/agents/{agent_id}/claim")
async def claim(agent_id: str, body: ClaimRequest, p: Agent, pool: Pool, request: Request,
                settings: Config,
                wait: Annotated[float, Query(ge=0, le=MAX_CLAIM_WAIT_SECONDS)] = 0.0
                ) -> dict[str, Any]:
    """Claim routed work. ``?wait=S``: when there is none, hold the request up to S seconds
    and claim as soon as the reconciler routes work here (an idle agent asks once per S
    instead of polling). Without ``wait`` the answer is immediate, as it always was."""
    aid = _uuid_or_404(agent_id, "agent")
    wakeups = _wakeups(request) if wait > 0 else None
    loop = asyncio.get_running_loop()
    received = loop.time()
    deadline = received + wait
    while True:
        # armed before the query: a dispatch committed after it started still wakes us
        event = wakeups.arm(aid) if wakeups is not None and wakeups.listening else None
        try:
            # a pooled connection per query, not per request: a waiting claim holds none
            async with db.connection(pool) as c:
                # the agent's clock as it would read now, not when it sent the long poll
                agent_time = (None if body.agent_time is None
                              else body.agent_time + loop.time() - received)
                rows = await agent_store.claim(c, aid, body.max, settings.lease_seconds,
                                               agent_time, body.claim_id)
            left = deadline - loop.time()
            if rows or event is None or left <= 0:
                break
            try:
                await asyncio.wait_for(event.wait(), timeout=left)
            except TimeoutError:
                break  # the query above already heartbeated this agent
        finally:
            if event is not None:
                wakeups.disarm(aid, event)  # type: ignore[union-attr]
    return {"items": [{
        "attempt_id": str(r["attempt_id"]), "operation_id": str(r["operation_id"]),
        "number": r["number"], "fencing_token": r["fencing_token"],
        "lease_expires_at": r["lease_expires_at"].isoformat(),
        "lease_seconds": r["lease_seconds"], "spec": r["spec"], "project": r["project"],
    } for r in rows]}


def _wakeups(request: Request) -> ClaimWakeups:
    wakeups: ClaimWakeups = request.app.state.claim_wakeups  # made by create_app
    wakeups.start()  # the listener starts with the first waiting claim
    return wakeups


@router.post("/v1/agents/{agent_id}/events")
async def agent_events(agent_id: str, body: AgentEvents, p: Agent, c: Conn,
                       x_agent_name: Annotated[str, Header()] = "unknown") -> dict[str, int]:
    n = await agent_store.agent_events(
        c, _uuid_or_404(agent_id, "agent"), _uuid_or_404(body.attempt_id, "attempt"),
        [e.model_dump(mode="json") for e in body.events], f"agent:{x_agent_name}")
    return {"recorded": n}


@router.post("/v1/attempts/{attempt_id}/heartbeat", responses=errors.CONFLICT)
async def attempt_heartbeat(attempt_id: str, body: AttemptHeartbeat, p: Agent, c: Conn,
                            settings: Config,
                            x_agent_name: Annotated[str, Header()] = "unknown") -> Any:
    try:
        out = await agent_store.attempt_heartbeat(
            c, _uuid_or_404(attempt_id, "attempt"), body.fencing_token, body.progress,
            settings.lease_seconds, body.agent_time)
    except StaleReport as exc:
        return await _stale(c, exc, attempt_id, x_agent_name)
    lease = out["lease_expires_at"]
    return {"cancel": out["cancel"], "lease_expires_at": lease.isoformat() if lease else None}


@router.post("/v1/attempts/{attempt_id}/events", responses=errors.CONFLICT)
async def attempt_events(attempt_id: str, body: AttemptEvents, p: Agent, c: Conn,
                         x_agent_name: Annotated[str, Header()] = "unknown") -> Any:
    try:
        n = await agent_store.attempt_events(
            c, _uuid_or_404(attempt_id, "attempt"), body.fencing_token,
            [e.model_dump(mode="json") for e in body.events], f"agent:{x_agent_name}")
    except StaleReport as exc:
        return await _stale(c, exc, attempt_id, x_agent_name)
    _count_artifact_writes(body.events)
    return {"recorded": n}


def _count_artifact_writes(events: list[AgentEvent]) -> None:
    for e in events:
        if e.kind in ("checkpoint_written", "artifact_written"):
            metrics.ARTIFACT_WRITES.labels("ok").inc()
        elif e.data.get("storage_unavailable"):
            metrics.ARTIFACT_WRITES.labels("retrying").inc()


@router.post("/v1/attempts/{attempt_id}/report", responses=errors.CONFLICT)
async def attempt_report(attempt_id: str, body: AttemptReport, p: Agent, c: Conn,
                         settings: Config,
                         x_agent_name: Annotated[str, Header()] = "unknown") -> Any:
    try:
        out = await agent_store.report(c, _uuid_or_404(attempt_id, "attempt"),
                                       body.model_dump(mode="json"),
                                       f"agent:{x_agent_name}",
                                       retry_base=settings.retry_base_seconds)
    except StaleReport as exc:
        return await _stale(c, exc, attempt_id, x_agent_name)
    if out.get("duplicate"):  # the same report again: counted the first time
        return out
    _count_artifact_writes(body.events)
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


async def _stale(c: psycopg.AsyncConnection, exc: StaleReport, attempt_id: str,
                 agent: str) -> JSONResponse:
    metrics.STALE_REPORTS.labels(agent).inc()
    await agent_store.record_stale(c, exc, attempt_id, f"agent:{agent}")
    log.warning("stale report refused", extra={"action": "stale_report",
                                               "attempt_id": attempt_id,
                                               "operation_id": exc.operation_id})
    return JSONResponse({"detail": str(exc)}, 409)


def _uuid_or_404(value: str, what: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError as exc:
        raise HTTPException(404, f"{what} {value} not found") from exc
