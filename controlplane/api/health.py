"""Liveness, readiness and the Prometheus scrape endpoint."""

# no `from __future__ import annotations`: FastAPI must see the dependency aliases.

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controlplane import defects
from controlplane.api.deps import Pool

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(pool: Pool) -> Response:
    if defects.enabled("readyz-lies"):  # seeded defect: ready whatever the database says
        return JSONResponse({"status": "ready"})
    try:
        async with pool.connection(timeout=1.0) as c:
            await c.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        return JSONResponse({"status": "unavailable", "detail": f"database: {exc}"}, 503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics_endpoint() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
