"""A request body above the API's limit is answered 413 before anything reads it."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BodyLimitMiddleware"]


class BodyLimitMiddleware:
    """413 for a request body above ``max_bytes``, before anything reads it: by Content-Length
    at once, and for a chunked body (no length) as soon as the bytes received pass the limit.
    Plain ASGI, answering itself: FastAPI's own ``max_body_size`` raises through the other
    middleware, so the request metrics would count a refused body as a 500."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, not {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None:
            if length > self.max_bytes:
                await self._refuse(send)
                return
            await self.app(scope, receive, send)  # the server stops at Content-Length
            return
        # no length (chunked, or no body at all): read it here, up to the limit, then replay
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([], message, receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        await self.app(scope, _replay(chunks, None, receive), send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"request body larger than {self.max_bytes} bytes, the "
                                     "API's limit"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length before we get here
    return None


def _replay(chunks: list[bytes], last: dict[str, Any] | None, server_receive: Any) -> Any:
    """A receive() that hands the buffered body over in one message, then the server's own
    (which waits for the disconnect)."""
    pending: list[dict[str, Any]] = [{"type": "http.request", "body": b"".join(chunks),
                                      "more_body": False}] if last is None else [last]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        return await server_receive()  # type: ignore[no-any-return]

    return receive
