"""uvicorn's HTTP protocol with the response's head and body sent in one write.

uvicorn (httptools) writes a response's status line and headers as soon as the app sends
``http.response.start``, and its body in a second write: two system calls and two TCP segments
for every small JSON answer. Under a stream of submissions that was a tenth of the API's CPU
(docs/performance.md). This protocol holds a head that announces a body (a non-zero
Content-Length) until the next write, which the app makes at once, and sends both together. A
held head is never kept past the current turn of the event loop (a HEAD answer, an app that
fails between the two): it is written on its own then, or before the connection closes, so
bytes are never reordered, only joined.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD_END = b"\r\n\r\n"


class _JoiningTransport:
    """Delegates to the transport; joins a held response head with the next write."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif (data.endswith(_HEAD_END) and data.startswith(b"HTTP/1.1 ")
              and b"\r\ncontent-length: " in data and b"\r\ncontent-length: 0\r\n" not in data):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # pause_reading, is_closing, get_extra_info, ...
        return getattr(self._transport, name)


class JoinedWritesProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        joined = _JoiningTransport(transport, self.loop)
        self.transport = joined  # type: ignore[assignment]
