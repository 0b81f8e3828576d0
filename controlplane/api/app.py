"""The control plane's HTTP API (FastAPI): settings, pool, lifespan, middleware and the routers
(one module per concern). Every write commits before it answers."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from controlplane import defects
from controlplane.api import (
    admin,
    agents,
    errors,
    health,
    openapi,
    operations,
    operator,
    pipelines,
)
from controlplane.api.admission import AdmissionMiddleware
from controlplane.api.body_limit import BodyLimitMiddleware
from controlplane.api.claimwait import ClaimWakeups
from controlplane.api.deps import Settings, TokenCache, log
from controlplane.api.fast_submit import FastSubmit
from controlplane.api.group_commit import GroupCommit
from controlplane.api.middleware import MetricsMiddleware
from controlplane.api.write_behind import WriteBehind
from controlplane.db import make_pool

__all__ = ["SETTINGS_ENV", "Settings", "app_from_env", "create_app"]


def create_app(settings: Settings) -> FastAPI:
    if defects.enabled("ack-before-commit"):  # the seeded-defect switch for the same thing
        settings = dataclasses.replace(settings, unsafe_ack_before_commit=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = app.state.pool  # the one the routers use (a test may have put its own there)
        # wait=False: the API must start (and answer /healthz, fail /readyz) with the DB down
        await pool.open(wait=False)
        # everything imported and built so far lives as long as the process: keep it out of
        # the collector's generations, so collections under load scan only request garbage
        gc.freeze()
        flusher = None
        if settings.unsafe_ack_before_commit:
            log.warning("UNSAFE: acknowledging submissions before commit (test-only mode)",
                        extra={"action": "unsafe_mode"})
            flusher = asyncio.create_task(
                app.state.write_behind.flush_forever(pool, settings.unsafe_flush_seconds))
        yield
        await app.state.group_commit.close()
        await app.state.claim_wakeups.stop()
        if flusher:
            flusher.cancel()
        await pool.close()

    app = FastAPI(title="ML control plane", version="1.0", lifespan=lifespan,
                  description="Reference ML control plane: durable submissions, explicit states,"
                  " leases with fencing, eligibility-first routing.", **_no_native_telemetry())
    # what the routers' dependencies read (controlplane/api/deps.py)
    app.state.settings = settings
    app.state.pool = make_pool(settings.dsn, max_size=settings.pool_max)
    app.state.tokens = TokenCache(settings.token_cache_seconds)
    app.state.write_behind = WriteBehind()
    app.state.group_commit = GroupCommit(lambda: app.state.pool,
                                         window=settings.submit_gather_ms / 1000)
    app.state.claim_wakeups = ClaimWakeups(settings.dsn)  # long-polling claims (api/agents.py)
    # innermost: the submit route's ordinary case answered without FastAPI's per-request
    # machinery, behind admission control like the route (api/fast_submit.py)
    app.add_middleware(FastSubmit, settings=settings, state=app.state)
    app.add_middleware(AdmissionMiddleware, settings=settings)  # inside the metrics: refusals count
    # an oversized body takes no admission slot; counted by the metrics like any answer
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware)
    errors.install(app)
    for router in (health.router, operations.router, agents.router, operator.router,
                   pipelines.router):
        app.include_router(router)
    admin.install(app)  # restore from a client ledger; 308 for redirected ids
    openapi.install(app)  # the answers every route shares, declared in the schema
    return app


def _no_native_telemetry() -> dict[str, object]:
    """FastAPI >= 0.160 asks OpenTelemetry on every request whether a provider was set up (an
    environment lookup each time, 2 % of the API's CPU per submission under load). This API's
    telemetry is its Prometheus metrics and logs, so FastAPI's own is off where it exists."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


SETTINGS_ENV = "CONTROLPLANE_API_SETTINGS"


def app_from_env() -> FastAPI:
    """uvicorn factory: the `api` command puts its Settings in the environment."""
    import json
    import os

    from controlplane import logs

    logs.setup(os.environ.get("CONTROLPLANE_LOG_LEVEL", "INFO"))
    return create_app(Settings(**json.loads(os.environ[SETTINGS_ENV])))
