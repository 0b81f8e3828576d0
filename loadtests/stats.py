"""`load_stats.json`: Locust's own final statistics, per route and overall.

Written by the locustfile's `quitting` listener from the runner's stats (the master's in
distributed mode, which aggregates every worker). Percentiles are Locust's (its histogram rounds
response times above 100 ms to two significant digits).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from loadtests.routes import route_key


class RouteStats(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    method: str
    route: str
    count: int
    failures: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    avg_ms: float | None
    max_ms: float | None
    rps: float

    @property
    def key(self) -> str:
        return route_key(self.method, self.route)

    @property
    def error_rate(self) -> float | None:
        return self.failures / self.count if self.count else None


class LoadStats(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    source: str
    started_at: str | None
    ended_at: str
    routes: tuple[RouteStats, ...]
    total: RouteStats
    errors: tuple[dict[str, Any], ...] = ()
    exceptions: int = 0
    user_classes: dict[str, int] = {}

    def by_key(self) -> dict[str, RouteStats]:
        return {r.key: r for r in self.routes}


class StatsError(Exception):
    """load_stats.json is missing or unusable."""


# --- building from Locust objects (duck-typed: this module never imports locust) ---------

class _Entry(Protocol):
    name: str
    method: str | None
    num_requests: int
    num_failures: int
    avg_response_time: float
    max_response_time: float
    total_rps: float

    def get_response_time_percentile(self, percent: float) -> float: ...


def _route(entry: _Entry, method: str, route: str) -> dict[str, Any]:
    n = entry.num_requests

    def pct(q: float) -> float | None:
        return float(entry.get_response_time_percentile(q)) if n else None

    return {"method": method, "route": route, "count": n, "failures": entry.num_failures,
            "p50_ms": pct(0.5), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
            "avg_ms": float(entry.avg_response_time) if n else None,
            "max_ms": float(entry.max_response_time) if n else None,
            "rps": round(float(entry.total_rps), 3)}


def from_locust(stats: Any, *, started_at: str | None, ended_at: str, exceptions: int,
                user_classes: dict[str, int]) -> dict[str, Any]:
    routes = [_route(e, e.method or "?", e.name) for _, e in sorted(stats.entries.items())]
    errors = [{"method": e.method, "route": e.name, "error": str(e.error), "occurrences": e.occurrences}
              for e in stats.errors.values()]
    return {"source": "locust runner stats at quit (the master's in distributed mode)",
            "started_at": started_at, "ended_at": ended_at, "routes": routes,
            "total": _route(stats.total, "ALL", "overall"), "errors": errors,
            "exceptions": exceptions, "user_classes": user_classes}


def read_load_stats(path: Path) -> LoadStats:
    if not path.is_file():
        raise StatsError(f"{path.name}: missing (the Locust process did not finish cleanly)")
    try:
        return LoadStats.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as exc:
        raise StatsError(f"{path.name}: not valid JSON: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise StatsError(f"{path.name}: field {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
