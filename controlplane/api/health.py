"""Liveness, readiness and the Prometheus scrape endpoint."""

# no `from __future__ import annotations`: FastAPI must see the dependency aliases.

import asyncio
import os
from urllib.parse import urlsplit

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controlplane import defects
from controlplane.api.deps import Pool
from controlplane.api.edge import EdgeRoute

router = APIRouter(tags=["health"], route_class=EdgeRoute)

# Where the platform's metrics are read (Prometheus). The control plane never calls it: it is
# scraped, so losing telemetry must not touch serving. Only the seeded defect
# readyz-needs-telemetry makes readiness depend on it (the telemetry-loss experiment).
TELEMETRY_URL_ENV = "CONTROLPLANE_TELEMETRY_URL"


async def _telemetry_reachable(url: str) -> str | None:
    parts = urlsplit(url)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or 80), 0.5)
    except (OSError, TimeoutError) as exc:
        return f"telemetry {url}: {exc or type(exc).__name__}"
    writer.close()
    return None


async def _commit_within(pool: Pool, seconds: float) -> str | None:
    """Seeded defect readyz-commit-deadline only: a write committed within ``seconds``, or
    why not. A transactional WAL message makes its commit wait for the WAL flush (a bare
    transaction id does not: nothing to flush), and touches no table."""
    try:
        async with pool.connection(timeout=1.0) as c:
            await asyncio.wait_for(
                c.execute("SELECT pg_logical_emit_message(true, 'readyz', '')"), seconds)
    except Exception as exc:  # noqa: BLE001 - the defect reads any failure as death
        return f"database commit not within {seconds * 1000:.0f} ms: {type(exc).__name__}"
    return None


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
    if defects.enabled("readyz-commit-deadline"):  # seeded defect: a slow commit read as death
        problem = await _commit_within(pool, 0.1)
        if problem:
            return JSONResponse({"status": "unavailable", "detail": problem}, 503)
    telemetry = os.environ.get(TELEMETRY_URL_ENV)
    if telemetry and defects.enabled("readyz-needs-telemetry"):  # seeded defect: test only
        problem = await _telemetry_reachable(telemetry)
        if problem:
            return JSONResponse({"status": "unavailable", "detail": problem}, 503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics_endpoint() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
