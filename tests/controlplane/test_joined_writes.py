"""The API's HTTP protocol joins a small answer's head and body in one write, and otherwise
changes nothing: every answer's bytes arrive whole and in order (HEAD, empty, streamed, a
closing connection), and a head is never held past the event loop's turn."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import uvicorn

from controlplane.api.joined_writes import JoinedWritesProtocol


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name,
                                                                                       default)

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/stream":  # no Content-Length: chunked, head written at once
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})
        return
    body = b"" if scope["path"] == "/empty" else b'{"ok":true}'
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-length", str(len(body)).encode()),
                            (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _serve(request: bytes) -> _Transport:
    async def run() -> _Transport:
        config = uvicorn.Config(_app, log_config=None, access_log=False)
        config.load()
        proto = JoinedWritesProtocol(config=config, server_state=uvicorn.server.ServerState(),
                                     app_state={})
        t = _Transport()
        proto.connection_made(t)
        proto.data_received(request)
        for _ in range(5):  # the app's task, then the held head's turn
            await asyncio.sleep(0)
        return t
    return asyncio.run(run())


def test_a_small_answer_is_one_write_with_its_head_and_body() -> None:
    t = _serve(b"POST /v1/operations HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
    assert len(t.writes) == 1
    assert t.writes[0].startswith(b"HTTP/1.1 201 ") and t.writes[0].endswith(b'{"ok":true}')


@pytest.mark.parametrize("request_line, writes", [
    (b"HEAD / HTTP/1.1", 1),       # a head with a Content-Length but no body: flushed alone
    (b"GET /empty HTTP/1.1", 1),   # Content-Length 0: never held
    (b"GET /stream HTTP/1.1", 3),  # chunked: head, chunk, last chunk, as uvicorn writes them
])
def test_what_has_no_body_to_join_is_written_as_before(request_line: bytes, writes: int) -> None:
    t = _serve(request_line + b"\r\nhost: x\r\n\r\n")
    assert len([w for w in t.writes if w]) == writes  # uvicorn's empty body write: no bytes
    assert t.writes[0].startswith(b"HTTP/1.1 ")


def test_a_closing_connection_sends_what_it_holds_first() -> None:
    t = _serve(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert t.closed and b"".join(t.writes).endswith(b'{"ok":true}')


def test_answers_over_a_real_socket_are_whole() -> None:
    async def run() -> list[httpx.Response]:
        config = uvicorn.Config(_app, host="127.0.0.1", port=0, log_config=None,
                                http="controlplane.api.joined_writes:JoinedWritesProtocol")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                # keep-alive: one connection, answers one after another on it
                return [await c.post("/v1/operations", content=b"{}"), await c.head("/"),
                        await c.get("/empty"), await c.get("/stream"), await c.get("/")]
        finally:
            server.should_exit = True
            await task
    post, head, empty, stream, again = asyncio.run(run())
    assert (post.status_code, post.content) == (201, b'{"ok":true}')
    assert (head.status_code, head.content) == (201, b"")
    assert (empty.status_code, empty.content) == (201, b"")
    assert (stream.status_code, stream.content) == (200, b"ab")
    assert (again.status_code, again.json()) == (201, {"ok": True})
