"""Operator routes (admin role): list agents, override a breaker, pin an operation's route."""

# no `from __future__ import annotations`: FastAPI must see the dependency aliases.

from typing import Any

from fastapi import APIRouter

from controlplane.api import errors, serialize
from controlplane.api.deps import Admin, Config, Conn
from controlplane.api.edge import EdgeRoute
from controlplane.models import BreakerOverride, RouteOverride
from controlplane.store import agents as agent_store
from controlplane.store import scheduling

router = APIRouter(tags=["operator"], route_class=EdgeRoute)


@router.get("/v1/agents")
async def list_agents(p: Admin, c: Conn, settings: Config) -> dict[str, Any]:
    rows = await agent_store.list_agents(c, settings.lease_seconds)
    return {"items": [serialize.agent(r) for r in rows]}


@router.post("/v1/agents/{name}/breaker")
async def breaker(name: str, body: BreakerOverride, p: Admin, c: Conn) -> dict[str, Any]:
    await agent_store.set_breaker(c, name, body.state)
    return {"agent": name, "breaker": body.state}


@router.post("/v1/operations/{op_id}/route", responses=errors.CONFLICT)
async def route(op_id: str, body: RouteOverride, p: Admin, c: Conn,
                settings: Config) -> dict[str, Any]:
    row = await scheduling.pin_route(c, op_id, body.agent, actor="admin",
                                     alive_seconds=settings.lease_seconds)
    return serialize.operation(row, None)
