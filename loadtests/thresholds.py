"""Pure threshold evaluation: stats + counts in, one result per threshold out.

"No data" (a route with no requests) is ``None``, reported but neither pass nor fail, the way
Krkn keeps missing data out of a score.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from loadtests.routes import OVERALL
from loadtests.scenario import Thresholds
from loadtests.stats import LoadStats, RouteStats


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    NO_DATA = "no data"


@dataclass(frozen=True)
class ThresholdResult:
    name: str          # e.g. "max_p95_ms[POST /v1/operations]"
    limit: float
    measured: float | None
    status: Status

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL


def _judge(name: str, limit: float, measured: float | None, *, at_most: bool) -> ThresholdResult:
    if measured is None:
        return ThresholdResult(name, limit, None, Status.NO_DATA)
    ok = measured <= limit if at_most else measured >= limit
    return ThresholdResult(name, limit, measured, Status.PASS if ok else Status.FAIL)


def _route(stats: LoadStats, key: str) -> RouteStats | None:
    return stats.total if key == OVERALL else stats.by_key().get(key)


def evaluate_thresholds(thresholds: Thresholds, stats: LoadStats, *, acknowledged: int,
                        abandoned: int) -> list[ThresholdResult]:
    results: list[ThresholdResult] = []
    for key, limit in thresholds.limits("max_error_rate").items():
        route = _route(stats, key)
        results.append(_judge(f"max_error_rate[{key}]", limit,
                              route.error_rate if route else None, at_most=True))
    for key, limit in thresholds.limits("max_p95_ms").items():
        route = _route(stats, key)
        results.append(_judge(f"max_p95_ms[{key}]", limit,
                              route.p95_ms if route else None, at_most=True))
    if thresholds.min_acknowledged is not None:
        results.append(_judge("min_acknowledged", thresholds.min_acknowledged, acknowledged,
                              at_most=False))
    if thresholds.max_abandoned_submissions is not None:
        results.append(_judge("max_abandoned_submissions", thresholds.max_abandoned_submissions,
                              abandoned, at_most=True))
    return results
