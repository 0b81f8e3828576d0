"""Admin routes. The database restore order (runbooks/db-primary-loss.md B): re-create an
acknowledged submission a restore lost under the operation id its client holds, and answer an
id that could only be redirected with 308 to the operation that replaced it. And the bulk
cancel of a held queue's work (controlplane/store/queues.py)."""

# no `from __future__ import annotations`: FastAPI must see the dependency aliases.

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, Field

from controlplane.api import errors, serialize
from controlplane.api.deps import Admin, Conn
from controlplane.api.edge import EdgeRoute
from controlplane.models import Bool, Int, Name, OperationSpec, Strict
from controlplane.store import InvalidReference
from controlplane.store import operations as op_store
from controlplane.store import queues as queue_store

RESTORE_ROUTE = "/v1/admin/operations/restore"
IDENTITY_HEADER = "X-Restore-Identity"  # same_id | redirect
CANCEL_HELD_ROUTE = "/v1/admin/queues/{queue}/cancel-held"
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # models.Name's


class RestoreRequest(Strict):
    project: Name
    idempotency_key: Annotated[str, Field(min_length=1, max_length=200)]
    operation_id: uuid.UUID
    spec: OperationSpec
    acknowledged_at: AwareDatetime
    restore_id: Annotated[str, Field(min_length=1, max_length=200)]
    # the key was re-used after the restore for the same payload (a client retry): record
    # operation_id -> that operation instead of failing with 409
    redirect_if_key_taken: Bool = False


class CancelHeldRequest(Strict):
    reason: str = Field(default="held queue canceled by an operator", min_length=1,
                        max_length=1000)
    # one statement per call: a bounded transaction, repeat until 0
    limit: Int = Field(default=10_000, ge=1, le=50_000)


router = APIRouter(tags=["operator"], route_class=EdgeRoute)


def install(app: FastAPI) -> None:
    """Add the restore route and the 308 answer for redirected ids (an app-wide handler: any
    route reading an operation may meet a redirected id)."""
    app.add_exception_handler(op_store.Moved, _moved)  # type: ignore[arg-type]
    app.include_router(router)


async def _moved(request: Request, exc: op_store.Moved) -> JSONResponse:
    # the same sub-resource (events, attempts, cancel) of the operation that replaced it;
    # 308 keeps the method and body
    parts = [exc.new_id if seg == exc.old_id else seg for seg in request.url.path.split("/")]
    location = "/".join(parts) + (f"?{request.url.query}" if request.url.query else "")
    return JSONResponse({"detail": str(exc), "operation_id": exc.new_id}, 308,
                        headers={"Location": location})


@router.post(RESTORE_ROUTE, status_code=201, responses={**errors.CONFLICT, **errors.REPLAYED})
async def restore_operation(body: RestoreRequest, p: Admin, c: Conn,
                            response: Response) -> dict[str, Any]:
    cur = await c.execute("SELECT id::text FROM projects WHERE name = %s", (body.project,))
    row = await cur.fetchone()
    if row is None:
        raise InvalidReference(f"field project: project {body.project!r} does not exist",
                               ("body", "project"))
    res = await op_store.restore(
        c, project_id=row[0], key=body.idempotency_key,
        spec=body.spec.document(), op_id=str(body.operation_id),
        acked_at=body.acknowledged_at, restore_id=body.restore_id,
        actor=f"admin:restore-{body.restore_id}",
        redirect_if_key_taken=body.redirect_if_key_taken)
    if not res.created:
        response.status_code = 200
    response.headers[IDENTITY_HEADER] = res.identity
    return serialize.operation(res.operation, body.project)


@router.post(CANCEL_HELD_ROUTE, responses=errors.CONFLICT)
async def cancel_held(queue: Annotated[str, Path(max_length=128, pattern=QUEUE_PATTERN)],
                      body: CancelHeldRequest, p: Admin, c: Conn) -> dict[str, Any]:
    """Cancel up to ``limit`` waiting operations of a held queue (concurrency 0); 404 for an
    unknown queue, 409 for one that is not held."""
    n = await queue_store.cancel_held(c, queue, actor="admin:cancel-held", reason=body.reason,
                                      limit=body.limit)
    return {"queue": queue, "canceled": n}
