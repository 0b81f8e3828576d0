"""What every router shares: the settings, the connection pool, the token cache (all kept on
``app.state`` by `create_app`) and the principal/role dependencies."""

# no `from __future__ import annotations`: FastAPI must see the Annotated aliases below.

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import psycopg
from fastapi import Depends, Header, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import AsyncConnectionPool

from controlplane import db, defects
from controlplane.models import MAX_BODY_BYTES
from controlplane.store import auth as auth_store

# one logger name for the whole API, whichever router logs: log queries select on it
log = logging.getLogger("controlplane.api")


@dataclass(frozen=True)
class Settings:
    dsn: str
    lease_seconds: float = 15.0
    heartbeat_seconds: float = 5.0
    token_cache_seconds: float = 30.0
    pool_max: int = 10
    retry_base_seconds: float = 1.0
    # under a steady stream of submissions, gather each commit group this long at most
    # (api/group_commit.py); 0: commit what is waiting at once
    submit_gather_ms: float = 5.0
    # admission control (api/admission.py), per process: user requests in flight, how long one
    # may wait for a slot, agent requests in flight (slots of their own), a refusal's Retry-After
    max_in_flight: int = 128
    max_queue_wait_ms: float = 100.0
    agent_max_in_flight: int = 1024
    retry_after_seconds: int = 1
    # request bodies above this are refused with 413 (api/body_limit.py)
    max_body_bytes: int = MAX_BODY_BYTES
    # TEST ONLY, never in a deployment: acknowledge submissions *before* committing them
    # (write-behind every few seconds). It exists so the harness can prove it sees lost
    # acknowledged work: the api-replica-loss game day must fail its durability objective.
    unsafe_ack_before_commit: bool = False
    unsafe_flush_seconds: float = 10.0


class TokenCache:
    """Token -> principal, kept briefly so a submission costs one round trip, not two."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[str, tuple[float, auth_store.Principal]] = {}

    def get(self, token: str) -> auth_store.Principal | None:
        hit = self._items.get(token)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        return None

    def put(self, token: str, principal: auth_store.Principal) -> None:
        """Keep it ``ttl`` seconds, never past the token's expiry: an expired token is refused
        on time whatever the cache holds. Revocation takes effect within ``ttl``
        (``--token-cache-seconds``), the price of one round trip less per request."""
        if len(self._items) > 10_000:
            self._items.clear()
        keep = self.ttl
        if principal.expires_at is not None:
            left = (principal.expires_at - datetime.now(UTC)).total_seconds()
            # seeded defect revocation-cached: kept until the token expires, so a revocation
            # is never seen while the token is used at least once per its lifetime
            keep = left if defects.enabled("revocation-cached") else min(keep, left)
        if keep > 0:
            self._items[token] = (time.monotonic() + keep, principal)


# async, like every dependency here: FastAPI runs a plain `def` dependency in a worker thread,
# a thread hop per request that cost more CPU than the submission's own statement
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def get_pool(request: Request) -> AsyncConnectionPool:
    return request.app.state.pool  # type: ignore[no-any-return]


Config = Annotated[Settings, Depends(get_settings)]
Pool = Annotated[AsyncConnectionPool, Depends(get_pool)]


async def conn(pool: Pool) -> AsyncIterator[psycopg.AsyncConnection]:
    # the route's statements run inside this block, so their availability failures leave as
    # StoreUnavailable too (api/errors.py answers 503)
    async with db.connection(pool) as c:
        yield c


Conn = Annotated[psycopg.AsyncConnection, Depends(conn)]


# declares the bearer scheme in the OpenAPI schema (securitySchemes); auto_error=False: the
# 401 below says what is missing, as it did before
BEARER = HTTPBearer(auto_error=False, description="A project (user), agent or admin token.")


async def principal(request: Request,
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
                    ) -> auth_store.Principal:
    # every route resolves this: the pool is read here, not injected, to keep the dependency
    # tree small (FastAPI's per-request resolution is a visible share of a submission's CPU)
    if credentials is None or not credentials.credentials.strip():
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
    token = credentials.credentials.strip()
    tokens: TokenCache = request.app.state.tokens
    p = tokens.get(token)
    if p is None:
        try:
            async with db.connection(request.app.state.pool) as c:
                p = await auth_store.lookup(c, token)
        except auth_store.TokenRefused as exc:
            # unknown, expired or revoked, and since when: the holder knows what to do next
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
        tokens.put(token, p)
    return p


def role(*roles: str) -> Callable[..., Awaitable[auth_store.Principal]]:
    async def dep(p: Annotated[auth_store.Principal, Depends(principal)],
                  ) -> auth_store.Principal:
        if p.role not in roles:
            raise HTTPException(403, f"a {p.role} token cannot do this (needs {'/'.join(roles)})")
        return p
    dep.roles = roles  # type: ignore[attr-defined]  # read by api/openapi.py (403 declared)
    return dep


User = Annotated[auth_store.Principal, Depends(role("user"))]
UserOrAdmin = Annotated[auth_store.Principal, Depends(role("user", "admin"))]
Agent = Annotated[auth_store.Principal, Depends(role("agent"))]
Admin = Annotated[auth_store.Principal, Depends(role("admin"))]
AnyRole = Annotated[auth_store.Principal, Depends(role("user", "agent", "admin"))]


# a submission's key: required, as the schema says (a missing one is a 422 like any field's)
IdempotencyKey = Annotated[str, Header(min_length=1, max_length=200)]
