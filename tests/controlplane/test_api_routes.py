"""The API's route inventory (no database): every route the single-closure `create_app` served
before it was split into routers must still be served, with the same method."""

from __future__ import annotations

from controlplane.api.app import Settings, create_app

# Captured from `create_app(...).openapi()["paths"]` before the split (commit c251c4f).
ROUTES_BEFORE_SPLIT = {
    ("/healthz", "GET"),
    ("/metrics", "GET"),
    ("/readyz", "GET"),
    ("/v1/admin/operations/restore", "POST"),
    ("/v1/agents", "GET"),
    ("/v1/agents/register", "POST"),
    ("/v1/agents/{agent_id}/claim", "POST"),
    ("/v1/agents/{agent_id}/events", "POST"),
    ("/v1/agents/{agent_id}/heartbeat", "POST"),
    ("/v1/agents/{name}/breaker", "POST"),
    ("/v1/attempts/{attempt_id}/events", "POST"),
    ("/v1/attempts/{attempt_id}/heartbeat", "POST"),
    ("/v1/attempts/{attempt_id}/report", "POST"),
    ("/v1/operations", "GET"),
    ("/v1/operations", "POST"),
    ("/v1/operations/{op_id}", "GET"),
    ("/v1/operations/{op_id}/attempts", "GET"),
    ("/v1/operations/{op_id}/cancel", "POST"),
    ("/v1/operations/{op_id}/events", "GET"),
    ("/v1/operations/{op_id}/route", "POST"),
    ("/v1/operations/{op_id}/side-effects", "POST"),
    # pipelines (docs/CONTRACTS.md section 5)
    ("/v1/pipelines", "POST"),
    ("/v1/pipelines/{pipeline_id}", "GET"),
    ("/v1/pipelines/{pipeline_id}/events", "GET"),
    # added since: held queues' bulk cancel (docs/CONTRACTS.md section 1)
    ("/v1/admin/queues/{queue}/cancel-held", "POST"),
}


def served_routes() -> set[tuple[str, str]]:
    # the pool is created closed and only opened by the lifespan, which never runs here
    app = create_app(Settings(dsn="postgresql://unused@127.0.0.1:1/none"))
    return {(path, method.upper())
            for path, ops in app.openapi()["paths"].items() for method in ops}


def test_every_route_from_before_the_split_is_still_served() -> None:
    missing = ROUTES_BEFORE_SPLIT - served_routes()
    assert not missing, f"routes no longer served: {sorted(missing)}"


def test_no_route_appeared_unnoticed() -> None:
    # a new route is fine, but it belongs in the inventory above (and docs/CONTRACTS.md)
    extra = served_routes() - ROUTES_BEFORE_SPLIT
    assert not extra, f"routes not in the inventory: {sorted(extra)}"


def sync_calls() -> list[str]:
    """Route handlers and dependencies that FastAPI would run in a worker thread (a plain
    `def`): a thread hop per request, more CPU than a submission's own statement."""
    import inspect

    from fastapi.routing import APIRoute

    app = create_app(Settings(dsn="postgresql://unused@127.0.0.1:1/none"))
    found: list[str] = []

    def walk(dep: object, where: str) -> None:
        call = getattr(dep, "call", None)
        # a callable object (fastapi.security's HTTPBearer) is awaited when its __call__ is async
        method = None if inspect.isfunction(call) else vars(type(call)).get("__call__")
        if call is not None and not (inspect.iscoroutinefunction(call)
                                     or inspect.isasyncgenfunction(call)
                                     or inspect.iscoroutinefunction(method)):
            found.append(f"{where}: {getattr(call, '__qualname__', call)}")
        for sub in getattr(dep, "dependencies", []):
            walk(sub, where)

    def routes(container: object) -> list[APIRoute]:
        out: list[APIRoute] = []
        for r in getattr(container, "routes", []):
            if isinstance(r, APIRoute):
                out.append(r)
            elif hasattr(r, "original_router"):  # include_router's wrapper (FastAPI >= 0.16x)
                out.extend(routes(r.original_router))
        return out

    served = routes(app)
    for route in served:
        walk(route.dependant, f"{sorted(route.methods)} {route.path}")
    assert len(served) >= len(ROUTES_BEFORE_SPLIT) - 3  # the walk reached the routers
    return found


def test_no_route_or_dependency_runs_in_a_thread() -> None:
    assert sync_calls() == []
