"""User routes: submit, read, list, cancel operations, their events, attempts, side effects.
Every write commits before it answers (except the test-only write-behind); submissions commit
in groups (api/group_commit.py), each answered after its group's commit."""

# no `from __future__ import annotations`: FastAPI must see the dependency aliases.

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from controlplane import metrics
from controlplane.api import errors, serialize, submit_path
from controlplane.api.deps import AnyRole, Conn, IdempotencyKey, Settings, User, UserOrAdmin
from controlplane.api.edge import EdgeRoute
from controlplane.api.group_commit import GroupCommit
from controlplane.api.write_behind import WriteBehind
from controlplane.models import CancelRequest, OperationSpec, SideEffectRequest
from controlplane.states import OpState
from controlplane.store import Conflict, InvalidReference
from controlplane.store import operations as op_store

router = APIRouter(tags=["operations"], route_class=EdgeRoute)


@router.post("/v1/operations", status_code=201, response_model=dict[str, Any],
             responses={**errors.CONFLICT, **errors.REPLAYED})
async def submit(spec: OperationSpec, p: User, request: Request,
                 idempotency_key: IdempotencyKey) -> Response:
    # the hot path: settings read from the app, the answer encoded once (no response-model
    # pass over the document)
    doc = spec.document()
    settings: Settings = request.app.state.settings
    if settings.unsafe_ack_before_commit:
        write_behind: WriteBehind = request.app.state.write_behind
        return _json(write_behind.ack(p, idempotency_key, doc), 201)
    commits: GroupCommit = request.app.state.group_commit
    try:
        res = await submit_path.commit(commits, p, idempotency_key, doc,
                                       request.scope.pop(submit_path.PRIOR_FAILURE, None))
    except (Conflict, InvalidReference):
        metrics.SUBMISSIONS.labels(p.project, spec.queue, "rejected").inc()
        raise
    status, body = submit_path.answer(res, p, spec)
    return Response(body, status_code=status, media_type="application/json")


def _json(doc: dict[str, Any], status: int) -> Response:
    return Response(json.dumps(doc, separators=(",", ":")), status_code=status,
                    media_type="application/json")


@router.get("/v1/operations/{op_id}")
async def get_op(op_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
    row = await op_store.get(c, op_id, p.project_id)
    return serialize.operation(row, p.project)


@router.get("/v1/operations")
async def list_ops(p: UserOrAdmin, c: Conn, state: OpState | None = None,
                   queue: str | None = None,
                   limit: Annotated[int, Query(ge=1, le=500)] = 100,
                   cursor: str | None = None) -> dict[str, Any]:
    rows, nxt = await op_store.list_ops(c, project_id=p.project_id,
                                        state=state.value if state else None, queue=queue,
                                        limit=limit, cursor=cursor)
    return {"items": [serialize.operation(r, p.project) for r in rows], "next_cursor": nxt}


@router.post("/v1/operations/{op_id}/cancel", responses=errors.CONFLICT)
async def cancel(op_id: str, p: UserOrAdmin, c: Conn,
                 body: CancelRequest | None = None) -> dict[str, Any]:
    reason = (body or CancelRequest()).reason
    row = await op_store.cancel(c, op_id, p.project_id, actor=f"{p.role}:{p.project or ''}",
                                reason=reason)
    return serialize.operation(row, p.project)


@router.get("/v1/operations/{op_id}/events")
async def events(op_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
    op = await op_store.get(c, op_id, p.project_id)
    return {"items": [serialize.event(e) for e in await op_store.events(c, op["id"])]}


@router.get("/v1/operations/{op_id}/attempts")
async def attempts(op_id: str, p: UserOrAdmin, c: Conn) -> dict[str, Any]:
    op = await op_store.get(c, op_id, p.project_id)
    return {"items": [serialize.attempt(a) for a in await op_store.attempts(c, op["id"])]}


@router.post("/v1/operations/{op_id}/side-effects", status_code=201,
             responses={**errors.CONFLICT, **errors.REPLAYED})
async def side_effect(op_id: str, body: SideEffectRequest, p: AnyRole, c: Conn,
                      response: Response) -> dict[str, Any]:
    row, created = await op_store.side_effect(
        c, op_id, p.project_id if p.role == "user" else None, action_id=body.action_id,
        kind=body.kind, payload=body.payload, actor=f"{p.role}:{p.project or ''}")
    if not created:
        response.status_code = 200
    return {"action_id": row["action_id"], "kind": row["kind"], "receipt": row["receipt"],
            "created": created, "recorded_at": row["created_at"].isoformat()}
