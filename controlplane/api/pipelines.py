"""User routes for pipelines: submit (one Idempotency-Key for the whole DAG), read with steps,
report and per-phase timing, and events (docs/CONTRACTS.md, "Pipelines")."""

# no `from __future__ import annotations`: FastAPI must see the dependency aliases.

from typing import Any

from fastapi import APIRouter, Response

from controlplane.api import errors
from controlplane.api.deps import Conn, IdempotencyKey, User, UserOrAdmin, log
from controlplane.api.edge import EdgeRoute
from controlplane.api.serialize import event
from controlplane.pipelines.spec import PipelineSpec
from controlplane.store import pipelines as store

router = APIRouter(tags=["pipelines"], route_class=EdgeRoute)


@router.post("/v1/pipelines", status_code=201, responses={**errors.CONFLICT, **errors.REPLAYED})
async def submit(spec: PipelineSpec, p: User, c: Conn, response: Response,
                 idempotency_key: IdempotencyKey) -> dict[str, Any]:
    res = await store.submit(c, project_id=p.project_id, key=idempotency_key,  # type: ignore[arg-type]
                             spec=spec, actor=f"user:{p.project}")
    if res.created:
        log.info("pipeline accepted", extra={"action": "submit_pipeline",
                                             "pipeline_id": str(res.pipeline["id"]),
                                             "project": p.project})
    else:
        response.status_code = 200
    return await _doc(c, res.pipeline, p.project)


@router.get("/v1/pipelines/{pipeline_id}")
async def get(pipeline_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
    row = await store.get(c, pipeline_id, p.project_id)
    return await _doc(c, row, p.project)


@router.get("/v1/pipelines/{pipeline_id}/events")
async def events(pipeline_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
    row = await store.get(c, pipeline_id, p.project_id)
    return {"items": [event(e) for e in await store.events(c, row["id"])]}


async def _doc(c: Any, row: dict[str, Any], project: str | None) -> dict[str, Any]:
    steps = await store.steps(c, row["id"])
    return {
        "id": str(row["id"]), "project": project, "name": row["name"],
        "idempotency_key": row["idempotency_key"], "state": row["state"],
        "state_reason": row["state_reason"], "report": row["report"],
        "max_parallel_steps": row["spec"]["max_parallel_steps"],
        "created_at": row["created_at"].isoformat(), "updated_at": row["updated_at"].isoformat(),
        "steps": [{
            "name": s["name"], "state": s["state"], "state_reason": s["state_reason"],
            "operation_id": str(s["operation_id"]) if s["operation_id"] else None,
            "cache_key": s["cache_key"], "inputs": s["inputs"], "manifest": s["manifest"],
            "report": s["report"],
            "started_at": s["started_at"].isoformat() if s["started_at"] else None,
            "finished_at": s["finished_at"].isoformat() if s["finished_at"] else None,
        } for s in steps],
        "timing": await store.timing(c, row["id"]),
    }
