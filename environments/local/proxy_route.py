"""The fault proxy's routes (environments/local/proxy.py): one per upstream, each with its mode
(``pass`` / ``refuse`` / ``blackhole``), its toxics and its counters."""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from environments.local.toxics import (
    Stream,
    Toxic,
)


class Connection(Protocol):
    """What a route asks of its open connections (environments/local/proxy_flow.py Conn)."""

    def end(self, cause: str) -> None: ...
    def refresh(self) -> None: ...


CHUNK = 65536
MAX_QUEUED = 1 << 20  # bytes a toxic direction holds before it stops reading (back-pressure)
PACE_SECONDS = 0.02  # bandwidth: the largest write is what the rate allows in this long
CAUSES = ("reset_peer", "limit_data", "timeout", "refuse")  # how a fault ended a connection


class Mode(str, Enum):
    PASS = "pass"
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"


@dataclass
class Route:
    name: str
    listen: int
    target_host: str
    target_port: int
    mode: Mode = Mode.PASS
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    conns: set[Connection] = field(default_factory=set)
    toxics: dict[str, Toxic] = field(default_factory=dict)  # in the order they were added
    connections_total: int = 0
    refused_total: int = 0
    bytes_total: dict[Stream, int] = field(default_factory=lambda: dict.fromkeys(Stream, 0))
    resets_total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        self.changed.set()
        self.changed = asyncio.Event()
        if mode is Mode.REFUSE:
            for conn in list(self.conns):
                conn.end("refuse")
            self.conns.clear()

    def put_toxic(self, toxic: Toxic) -> None:
        """Add a toxic, or replace the one of that name in place; in effect on return."""
        self.toxics[toxic.name] = toxic
        self._refresh()

    def remove_toxic(self, name: str) -> None:
        del self.toxics[name]
        self._refresh()

    def clear_toxics(self) -> None:
        self.toxics.clear()
        self._refresh()

    def _refresh(self) -> None:
        for conn in list(self.conns):
            conn.refresh()


def reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:  # SO_LINGER 0 -> RST instead of FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def wait_passable(route: Route) -> bool:
    """Block while the route black-holes; False when the connection must be dropped."""
    while route.mode is Mode.BLACKHOLE:
        await route.changed.wait()
    return route.mode is Mode.PASS
