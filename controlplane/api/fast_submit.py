"""The submit route's ordinary case without FastAPI's per-request machinery.

`POST /v1/operations` is the API's hot path. Under wrk, a quarter of the API's CPU per
submission was FastAPI resolving the route's dependency tree (bearer scheme, principal, role,
header, body) and its exception and routing layers (docs/performance.md). This plain ASGI
middleware answers the ordinary case itself, with the same checks and the same answer:

- a JSON body without ``\\u`` escapes or non-finite numbers (what api/edge.py would walk),
  that validates as an `OperationSpec`;
- ``Authorization: Bearer <token>`` whose principal is in the token cache with the user role;
- an ``Idempotency-Key`` of 1-200 characters without NUL or surrogates.

Anything else is handed to the FastAPI route unchanged, body replayed, which answers it as
before. So is a failure of the commit (conflict, unknown queue, database unavailable after the
one retry), with the failure in the scope: the route validates as before and then answers that
failure as its own, without a second commit (api/submit_path.py). The route object is put in the scope, so the request metrics count the
request under the route's template as before.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

from controlplane.api import submit_path
from controlplane.api.deps import Settings, TokenCache
from controlplane.api.edge import BAD_CHAR, JSON_ESCAPE
from controlplane.api.group_commit import GroupCommit
from controlplane.models import OperationSpec

PATH = "/v1/operations"


class _Fallback(Exception):
    """The request is not the ordinary case: the FastAPI route answers it."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Fallback
    return value


def _constant(text: str) -> float:
    raise _Fallback


class FastSubmit:
    def __init__(self, app: Any, settings: Settings, state: Any) -> None:
        self.app = app
        self.state = state  # app.state: tokens, group commit (read per request: tests swap)
        self.enabled = not settings.unsafe_ack_before_commit
        self._route: Any = None  # the FastAPI route of POST /v1/operations, found once

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not (self.enabled and scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] == PATH and not scope.get("root_path")):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay(chunks, message, receive), send)
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            answer = await self._answer(scope, body)
        except _Fallback:
            answer = None
        if answer is None:
            await self.app(scope, _replay([body], None, receive), send)
            return
        status, payload = answer
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(payload)).encode()),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    async def _answer(self, scope: dict[str, Any], body: bytes) -> tuple[int, bytes] | None:
        ctype = auth = key = None
        for name, value in scope["headers"]:  # the first of each, as Starlette's get()
            if name == b"content-type":
                ctype = value if ctype is None else ctype
            elif name == b"authorization":
                auth = value if auth is None else auth
            elif name == b"idempotency-key":
                key = value if key is None else key
        if (ctype != b"application/json" or auth is None or key is None
                or not auth.startswith(b"Bearer ") or JSON_ESCAPE in body):
            return None
        token = auth[7:].decode("latin-1").strip()
        idem = key.decode("latin-1")
        if not token or not 1 <= len(idem) <= 200 or BAD_CHAR.search(idem):
            return None
        tokens: TokenCache = self.state.tokens
        p = tokens.get(token)
        if p is None or p.role != "user":
            return None  # the route looks the token up (and caches it), or refuses it
        try:
            doc = json.loads(body, parse_float=_finite, parse_constant=_constant)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        try:
            spec = OperationSpec.model_validate(doc)
        except ValidationError:
            return None
        commits: GroupCommit = self.state.group_commit
        try:
            res = await submit_path.commit(commits, p, idem, spec.document())
        except Exception as exc:  # noqa: BLE001 - the route answers it (and counts it)
            scope[submit_path.PRIOR_FAILURE] = exc  # without committing a second time
            return None
        if self._route is None:
            self._route = _find_route(scope)
        scope["route"] = self._route  # the request metrics' label, as the router sets it
        return submit_path.answer(res, p, spec)


def _find_route(scope: dict[str, Any]) -> Any:
    from controlplane.api.edge import api_routes

    for r in api_routes(scope["app"].router):
        if r.path == PATH and "POST" in r.methods:
            return r
    return None


def _replay(chunks: list[bytes], final: dict[str, Any] | None, receive: Any) -> Any:
    """A receive that hands out the body already read, then what the client sends next."""
    pending: list[dict[str, Any]] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)]
    if final is not None:
        pending.append(final)

    async def replay() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
