"""Domain errors -> HTTP answers, one handler each, for every router."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from controlplane import metrics
from controlplane.api import edge
from controlplane.api.deps import log
from controlplane.api.middleware import route_template
from controlplane.store import Conflict, InvalidReference, NotFound, StoreUnavailable

# one body for every route; it states the submission's rule: a retry with the same key
# cannot create a second operation
DB_UNAVAILABLE = "database unavailable; retry with the same Idempotency-Key"


class ErrorMessage(BaseModel):
    """Every error answer but a validation error (422): what went wrong, for a person."""

    detail: str


# for a route decorator's `responses=`: where a domain conflict can answer (api/openapi.py adds
# the answers every route shares)
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorMessage,
          "description": "Conflict: a reused key or action id with another payload, a state "
                         "that does not allow this, or a stale fencing token"}}
# a create route's answer to the same request again (same Idempotency-Key or action id and
# payload): what the first one created
REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {"description": "Already done: the same key and payload again; the answer describes "
                         "what the first request created"}}


def install(app: FastAPI) -> None:
    @app.exception_handler(NotFound)
    async def _nf(request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": edge.bounded(str(exc))}, 404)

    @app.exception_handler(Conflict)
    async def _cf(request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": edge.bounded(str(exc))}, 409)

    @app.exception_handler(InvalidReference)
    async def _ir(request: Request, exc: InvalidReference) -> JSONResponse:
        # the body every 422 of the API has (the schema's HTTPValidationError)
        return edge.validation_answer([{"type": "invalid_reference", "loc": exc.loc,
                                        "msg": str(exc)}])

    edge.install(app)

    # Starlette's 405 names the methods of one of the routes on the path; a client (and RFC
    # 9110) expects every method the path serves
    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            allowed = sorted({m for r in edge.api_routes(request.app)
                              if r.matches(request.scope)[0] != Match.NONE
                              for m in (r.methods or ())})
            return JSONResponse({"detail": exc.detail}, 405,
                                headers={"Allow": ", ".join(allowed)})
        if isinstance(exc.detail, str):  # e.g. "agent <the path's id> not found"
            exc.detail = edge.bounded(exc.detail)
        return await http_exception_handler(request, exc)

    # the one answer to a database that is unreachable or failed mid-request, whichever route
    # and whether the connection, the token lookup or a statement failed (controlplane.db)
    @app.exception_handler(StoreUnavailable)
    async def _db(request: Request, exc: StoreUnavailable) -> JSONResponse:
        metrics.DB_ERRORS.labels(route_template(request.scope)).inc()
        log.warning("database error", extra={"action": "db_error", "error": str(exc)})
        return JSONResponse({"detail": DB_UNAVAILABLE}, 503)
