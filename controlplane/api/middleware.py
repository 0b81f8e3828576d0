"""Request count and latency by route template (the labels slo/ rules read)."""

from __future__ import annotations

import time
from typing import Any

from controlplane import metrics


class MetricsMiddleware:
    """Request count and latency by route template. Plain ASGI: Starlette's BaseHTTPMiddleware
    costs a task and a stream per request, which shows at hundreds of submissions/s."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = route_template(scope)
            metrics.child(metrics.HTTP_REQUESTS, route, scope["method"], str(status["code"])).inc()
            metrics.child(metrics.HTTP_LATENCY, route, scope["method"]).observe(
                time.perf_counter() - start)


def route_template(scope: dict[str, Any]) -> str:
    """The matched route's path template (bounded label values), or "unmatched"."""
    r = scope.get("route")
    return getattr(r, "path", "unmatched")
