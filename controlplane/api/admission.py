"""Admission control: a bounded number of requests in flight per process and route class, a
short, deadline-bounded wait for a slot, and an explicit 503 with ``Retry-After`` beyond that.

Without it a gray failure (a database whose commits take 200 ms) turns into a queue without
bound: every request waits, clients time out and retry, and the retries keep the queue long
after the trigger is gone (a metastable failure). The wait for a slot is CoDel-like, as in
"Fail at Scale" (Maurer, 2015): a queue that formed recently is a burst and may be waited out
(``max_wait_s``), but once it has not been empty for that long it is standing, and new
arrivals may wait only ``standing_wait_s``. A request whose wait ran out is refused, never
served late.

Route classes: health (``/healthz``, ``/readyz``, ``/metrics``) is never bounded (a shed
``/readyz`` would take a merely busy replica out of the load balancer); agent calls
(``/v1/agents/...``, ``/v1/attempts/...``) have slots of their own, never taken by user
traffic, many more of them, and may wait as long as the agent waits for an answer (a shed
heartbeat loses a lease, and the redispatch adds work); everything else is user traffic.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from starlette.routing import Match

from controlplane import defects
from controlplane.api.deps import Settings

__all__ = ["AdmissionMiddleware", "AdmissionPolicy", "ClassLimit", "Gate", "RouteClass",
           "classify", "policy_from", "wait_allowance"]


class RouteClass(str, Enum):
    HEALTH = "health"
    AGENT = "agent"
    USER = "user"


# why a request was refused (metric label)
QUEUE_TIMEOUT = "queue_timeout"    # waited its whole allowance in a burst, no slot freed
STANDING_QUEUE = "standing_queue"  # a standing queue: only the short wait was allowed

IN_FLIGHT = Gauge("controlplane_admission_in_flight",
                   "Requests holding an admission slot in this process", ["class"])
SHED = Counter("controlplane_admission_shed_total",
               "Requests refused by admission control (503 + Retry-After)", ["class", "reason"])
QUEUE_WAIT = Histogram("controlplane_admission_queue_wait_seconds",
                       "Time a request waited for an admission slot (0: admitted at once)",
                       ["class"], buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
                                           2.5, 5))


@dataclass(frozen=True)
class ClassLimit:
    """Slots of one route class in one process, and how long a request may wait for one."""

    max_in_flight: int
    max_wait_s: float        # a burst may wait this long for a slot
    standing_wait_s: float   # once the queue has not been empty for max_wait_s

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, not {self.max_in_flight}")
        if self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, not {self.max_wait_s}")
        if not 0 <= self.standing_wait_s <= self.max_wait_s:
            raise ValueError(f"standing_wait_s must be within [0, max_wait_s], "
                             f"not {self.standing_wait_s}")


@dataclass(frozen=True)
class AdmissionPolicy:
    """None for a class: admitted whatever is in flight (admission off, or health)."""

    user: ClassLimit | None
    agent: ClassLimit | None
    retry_after_s: int = 1  # what a refusal asks the client to wait, whole seconds (RFC 9110)

    def __post_init__(self) -> None:
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s must be >= 1, not {self.retry_after_s}")

    def limit(self, cls: RouteClass) -> ClassLimit | None:
        return {RouteClass.USER: self.user, RouteClass.AGENT: self.agent}.get(cls)

    def unbounded(self) -> AdmissionPolicy:
        return replace(self, user=None, agent=None)


# the seeded defect admission-wait-unbounded's wait for a slot: a day (no timer takes inf)
WAIT_FOREVER_S = 86_400.0
# a standing queue lets a new arrival wait only this long (Fail at Scale used 5 ms)
STANDING_WAIT_S = 0.005
# an agent's call gives up after a fifth of the lease (controlplane/agent/api.py
# call_deadline): waiting longer for a slot is useless, refusing sooner only makes it retry
AGENT_WAITS_PER_LEASE = 5


def policy_from(settings: Settings) -> AdmissionPolicy:
    wait = settings.max_queue_wait_ms / 1000
    agent_wait = settings.lease_seconds / AGENT_WAITS_PER_LEASE
    # seeded defect (test only): the overload-metastability class must catch an API that
    # admits every user request, as --max-in-flight 0 would
    unbounded = defects.enabled("admission-unbounded")
    return AdmissionPolicy(
        # 0: admission control off for users (every request admitted, however many wait)
        user=(None if settings.max_in_flight == 0 or unbounded
              else ClassLimit(settings.max_in_flight, wait, min(STANDING_WAIT_S, wait))),
        # no standing-queue cut for agents: their calls are few (one loop per attempt) and a
        # refusal costs more than a wait
        agent=ClassLimit(settings.agent_max_in_flight, agent_wait, agent_wait),
        retry_after_s=settings.retry_after_seconds)


_HEALTH = frozenset({"/healthz", "/readyz", "/metrics"})


def classify(path: str) -> RouteClass:
    if path in _HEALTH:
        return RouteClass.HEALTH
    if path.startswith(("/v1/agents/", "/v1/attempts/")) or path == "/v1/agents":
        return RouteClass.AGENT
    return RouteClass.USER


def wait_allowance(limit: ClassLimit, queued: int, now: float, last_empty: float,
                   ) -> tuple[float, str]:
    """How long a request that found every slot taken may wait, and the reason it is refused
    if no slot frees meanwhile. ``queued``: requests already waiting; ``last_empty``: when the
    queue was last empty."""
    if defects.enabled("admission-wait-unbounded"):  # seeded defect: test only
        # "never refuse, just wait for a slot": in flight stays bounded, the queue does not
        return WAIT_FOREVER_S, QUEUE_TIMEOUT
    if queued and now - last_empty >= limit.max_wait_s:
        return limit.standing_wait_s, STANDING_QUEUE
    return limit.max_wait_s, QUEUE_TIMEOUT


class Gate:
    """The slots of one class in one process. A freed slot goes to the oldest waiter still
    within its allowance; a waiter whose allowance ran out is refused."""

    def __init__(self, limit: ClassLimit | None) -> None:
        self.limit = limit
        self.in_flight = 0
        self.queued = 0  # live waiters
        self._waiters: deque[asyncio.Future[bool]] = deque()  # may hold resolved ones
        self._last_empty = time.monotonic()

    async def acquire(self) -> tuple[str | None, float]:
        """(None, waited) once admitted (then `release` when done), else (reason, waited)."""
        limit = self.limit
        if limit is None or (self.in_flight < limit.max_in_flight and not self.queued):
            self.in_flight += 1
            return None, 0.0
        now = time.monotonic()
        if not self.queued:
            self._last_empty = now  # empty until this arrival
        allowance, reason = wait_allowance(limit, self.queued, now, self._last_empty)
        if allowance <= 0:
            return reason, 0.0
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(fut)
        self.queued += 1
        timer = loop.call_later(allowance, self._expire, fut)
        try:
            granted = await fut
        except asyncio.CancelledError:
            timer.cancel()
            if fut.cancelled():
                self._left()
            elif fut.result():  # handed a slot it will never use: pass it on
                self.release()
            raise
        timer.cancel()
        return (None if granted else reason), time.monotonic() - now

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)  # the slot changes hands: in_flight stays
                self._left()
                return
        self.in_flight -= 1

    def _expire(self, fut: asyncio.Future[bool]) -> None:
        if not fut.done():
            fut.set_result(False)
            self._left()
        while self._waiters and self._waiters[0].done():  # keep the deque to live waiters
            self._waiters.popleft()

    def _left(self) -> None:
        self.queued -= 1
        if not self.queued:
            self._last_empty = time.monotonic()


class AdmissionMiddleware:
    """Plain ASGI (as MetricsMiddleware): it runs for every request. Added inside
    MetricsMiddleware, so a refusal is counted and timed like any answer."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        policy = policy_from(settings)
        self.gates = {cls: Gate(policy.limit(cls)) for cls in (RouteClass.USER,
                                                                RouteClass.AGENT)}
        self._waits = {cls: QUEUE_WAIT.labels(cls.value) for cls in self.gates}
        self._refusals = {(cls, reason): _refusal(cls, reason, limit, policy.retry_after_s)
                          for cls in self.gates if (limit := policy.limit(cls)) is not None
                          for reason in (QUEUE_TIMEOUT, STANDING_QUEUE)}
        self._routes: tuple[Any, ...] | None = None  # known at the first refusal
        for cls, gate in self.gates.items():  # read at scrape time: nothing per request
            IN_FLIGHT.labels(cls.value).set_function(lambda g=gate: g.in_flight)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        cls = classify(scope["path"]) if scope["type"] == "http" else RouteClass.HEALTH
        if cls is RouteClass.HEALTH:
            await self.app(scope, receive, send)
            return
        gate = self.gates[cls]
        reason, waited = await gate.acquire()
        self._waits[cls].observe(waited)
        if reason is not None:
            SHED.labels(cls.value, reason).inc()
            self._set_route(scope)
            start, body = self._refusals[(cls, reason)]
            await send(start)
            await send(body)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            gate.release()

    def _set_route(self, scope: dict[str, Any]) -> None:
        """Name the route a refused request was for, so the request metrics count the 503
        under it, not under "unmatched" (the router, which sets it, never ran)."""
        if self._routes is None:
            self._routes = tuple(_leaf_routes(getattr(scope.get("app"), "router", None)))
        for route in self._routes:
            if route.matches(scope)[0] is Match.FULL:
                scope["route"] = route
                return


def _refusal(cls: RouteClass, reason: str, limit: ClassLimit, retry_after: int,
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ASGI messages of a refusal, built once."""
    waited = limit.standing_wait_s if reason == STANDING_QUEUE else limit.max_wait_s
    detail = (f"overloaded: {limit.max_in_flight} {cls.value} requests in flight in this API "
              f"process and none finished within {waited * 1000:g} ms ({reason}); retry after "
              f"{retry_after} s (a submission with the same Idempotency-Key)")
    body = json.dumps({"detail": detail, "retry_after": retry_after}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(retry_after).encode())]
    return ({"type": "http.response.start", "status": 503, "headers": headers},
            {"type": "http.response.body", "body": body})


def _leaf_routes(router: Any) -> Iterator[Any]:
    """The routes that answer, through included routers (FastAPI keeps an included router
    whole, as ``original_router``)."""
    for route in getattr(router, "routes", ()):
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner)
        elif hasattr(route, "path_regex"):
            yield route
