"""Domain errors -> HTTP answers, one handler each, for every router."""

from __future__ import annotations

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from controlplane import metrics
from controlplane.api.deps import log
from controlplane.api.middleware import route_template
from controlplane.store import Conflict, InvalidReference, NotFound


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

    @app.exception_handler(psycopg.OperationalError)
    async def _db(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        metrics.DB_ERRORS.labels(route_template(request.scope)).inc()
        log.warning("database error", extra={"action": "db_error", "error": str(exc)})
        return JSONResponse({"detail": "database unavailable; retry with the same "
                             "Idempotency-Key"}, 503)
