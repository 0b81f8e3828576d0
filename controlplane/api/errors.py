"""Domain errors -> HTTP answers, one handler each, for every router."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from controlplane import metrics
from controlplane.api.deps import log
from controlplane.api.middleware import route_template
from controlplane.store import Conflict, InvalidReference, NotFound, StoreUnavailable

# one body for every route; it states the submission's rule: a retry with the same key
# cannot create a second operation
DB_UNAVAILABLE = "database unavailable; retry with the same Idempotency-Key"


def install(app: FastAPI) -> None:
    @app.exception_handler(NotFound)
    async def _nf(request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 404)

    @app.exception_handler(Conflict)
    async def _cf(request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 409)

    @app.exception_handler(InvalidReference)
    async def _ir(request: Request, exc: InvalidReference) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 422)

    # the one answer to a database that is unreachable or failed mid-request, whichever route
    # and whether the connection, the token lookup or a statement failed (controlplane.db)
    @app.exception_handler(StoreUnavailable)
    async def _db(request: Request, exc: StoreUnavailable) -> JSONResponse:
        metrics.DB_ERRORS.labels(route_template(request.scope)).inc()
        log.warning("database error", extra={"action": "db_error", "error": str(exc)})
        return JSONResponse({"detail": DB_UNAVAILABLE}, 503)
