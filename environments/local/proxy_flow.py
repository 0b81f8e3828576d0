"""The fault proxy's data plane (environments/local/proxy.py): one proxied connection (``Conn``), its
two directions (``Flow``) and the toxics that apply to each, and the pumps that move the bytes."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from environments.local.proxy_route import (
    MAX_QUEUED,
    PACE_SECONDS,
    Route,
    reset,
    wait_passable,
)
from environments.local.toxics import (
    KB,
    Bandwidth,
    Latency,
    LimitData,
    ResetPeer,
    Slicer,
    Stream,
    Timeout,
    Toxic,
    applies,
    bandwidth_delay,
    latency_delay,
    slice_size,
)

_rng = random.Random()


@dataclass
class _Mark:
    """What a connection keeps of one toxic."""

    roll: float  # the toxicity draw, once per connection: the toxic applies while roll < toxicity
    since: float | None = None  # loop time it began to apply (None: it does not apply)
    base: int = 0  # bytes passed in the toxic's direction by then


class Flow:
    """One direction of one connection: where its bytes go, and the toxics that apply."""

    def __init__(self, conn: Conn, stream: Stream, dest: asyncio.StreamWriter) -> None:
        self.conn = conn
        self.stream = stream
        self.dest = dest
        self.passed = 0
        self.active: list[Toxic] = []
        self.changed = asyncio.Event()
        self.queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        self.queued = 0
        self.room = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None
        self.next_send = 0.0  # bandwidth: when the next write may go
        self.broken = False  # a write to dest failed: the reading side must learn it

    def wake(self) -> None:
        """Wake whatever waits on this flow's toxics (they changed, or the connection ended)."""
        self.changed.set()
        self.changed = asyncio.Event()
        self.room.set()

    def sent(self, n: int) -> None:
        self.passed += n
        self.conn.route.bytes_total[self.stream] += n

    def _attrs(self, kind: type[Any]) -> list[Any]:
        return [t.attributes for t in self.active if isinstance(t.attributes, kind)]

    async def _sleep(self, seconds: float) -> bool:
        """True after ``seconds``; False as soon as the toxics change (or the connection ends)."""
        try:
            await asyncio.wait_for(self.changed.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def put(self, data: bytes) -> None:
        if self.broken:  # as a failed write on the plain path: the pump resets its side
            raise ConnectionResetError("the other side of the connection is gone")
        self.queue.put_nowait((asyncio.get_running_loop().time(), data))
        self.queued += len(data)
        if self.worker is None:
            self.worker = asyncio.create_task(self._work())
        while self.queued > MAX_QUEUED and not (self.conn.closed or self.broken):
            self.room.clear()
            await self.room.wait()

    async def flush(self) -> None:
        """At the end of the input: wait until the queued data went through. A timeout toxic
        holds the end back too (the peer must not learn anything while it applies)."""
        if self.worker is not None:
            worker = self.worker
            self.queue.put_nowait(None)
            await asyncio.wait([worker])
        while not self.conn.closed and self._attrs(Timeout):
            await self.changed.wait()

    async def _work(self) -> None:
        try:
            while not self.conn.closed:
                if self.queue.empty() and not self.active:
                    return  # no toxic left: back to the plain path
                item = await self.queue.get()
                if item is None:
                    return
                self.queued -= len(item[1])
                if self.queued <= MAX_QUEUED:
                    self.room.set()
                await self._deliver(*item)
        except (ConnectionError, OSError):
            self.broken = True
            self.room.set()
            reset(self.dest)
        finally:
            self.worker = None

    async def _deliver(self, arrived: float, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        while True:  # latency, counted from arrival; one chunk at a time keeps them in order
            if self.conn.closed:
                return
            delay = sum(latency_delay(a.latency, a.jitter, _rng) for a in self._attrs(Latency))
            wait = arrived + delay - loop.time()
            if wait <= 0 or await self._sleep(wait):
                break
        if self.conn.closed or self._attrs(Timeout):
            return  # a timeout toxic drops the data, as Toxiproxy's does
        cut, cause = len(data), None
        for toxic in self.active:
            attrs = toxic.attributes
            if isinstance(attrs, LimitData):
                limit, why = attrs.bytes, "limit_data"
            elif isinstance(attrs, ResetPeer) and attrs.after_bytes is not None:
                limit, why = attrs.after_bytes, "reset_peer"
            else:
                continue
            left = limit - (self.passed - self.conn.marks[toxic.name].base)
            if left <= cut:
                cut, cause = max(left, 0), why
        await self._write(data if cut == len(data) else data[:cut])
        if cause is not None:
            self.conn.end(cause)

    async def _write(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        pos = 0
        while pos < len(data):
            if self.conn.closed or not await wait_passable(self.conn.route):
                return
            rates = [a.rate for a in self._attrs(Bandwidth)]
            if rates and self.next_send > loop.time():
                await self._sleep(self.next_send - loop.time())
                continue  # the toxics may have changed meanwhile
            size = len(data) - pos
            slicers = self._attrs(Slicer)
            if slicers:
                size = min(size, slice_size(slicers[0].average_size, slicers[0].size_variation,
                                            _rng))
            if rates:
                size = min(size, max(1, int(min(rates) * KB * PACE_SECONDS)))
            self.dest.write(data[pos:pos + size])
            self.sent(size)
            pos += size
            await self.dest.drain()
            if rates:
                self.next_send = (max(self.next_send, loop.time())
                                  + bandwidth_delay(size, min(rates)))
            if slicers and slicers[0].delay and pos < len(data):
                await self._sleep(slicers[0].delay / 1e6)


class Conn:
    """One proxied connection: its two flows and its toxics' state and timers."""

    def __init__(self, route: Route, client: asyncio.StreamWriter,
                 upstream: asyncio.StreamWriter) -> None:
        self.route = route
        self.client = client
        self.upstream = upstream
        self.started = asyncio.get_running_loop().time()
        self.closed = False
        self.marks: dict[str, _Mark] = {}
        self.flows = {Stream.UPSTREAM: Flow(self, Stream.UPSTREAM, upstream),
                      Stream.DOWNSTREAM: Flow(self, Stream.DOWNSTREAM, client)}
        self.timers: list[asyncio.TimerHandle] = []

    def refresh(self) -> None:
        """Apply the route's current toxics (at the start, and after every change of them)."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        toxics = self.route.toxics
        self.marks = {name: self.marks.get(name) or _Mark(_rng.random()) for name in toxics}
        for stream, flow in self.flows.items():
            flow.active = []
            for toxic in toxics.values():
                mark = self.marks[toxic.name]
                if toxic.stream is not stream:
                    continue
                if not applies(toxic.toxicity, mark.roll):
                    mark.since = None
                    continue
                if mark.since is None:  # it starts to apply: limits and timeouts count from now
                    mark.since, mark.base = loop.time(), flow.passed
                flow.active.append(toxic)
            flow.wake()
        for timer in self.timers:
            timer.cancel()
        self.timers = []
        for flow in self.flows.values():
            for toxic in flow.active:
                attrs = toxic.attributes
                if isinstance(attrs, ResetPeer) and attrs.timeout is not None:
                    self._end_at(self.started + attrs.timeout / 1000, "reset_peer")
                elif isinstance(attrs, Timeout) and attrs.timeout > 0:
                    since = self.marks[toxic.name].since
                    assert since is not None  # active toxics have begun to apply
                    self._end_at(since + attrs.timeout / 1000, "timeout")

    def _end_at(self, when: float, cause: str) -> None:
        loop = asyncio.get_running_loop()
        if self.closed:
            return
        if when <= loop.time():
            self.end(cause)  # at once, before the control API answers
        else:
            self.timers.append(loop.call_at(when, self.end, cause))

    def end(self, cause: str) -> None:
        """End the connection on both sides: RST for reset_peer/refuse, FIN otherwise."""
        if self.closed:
            return
        self.closed = True
        self.route.resets_total[cause] += 1
        for timer in self.timers:
            timer.cancel()
        for writer in (self.client, self.upstream):
            if cause in ("reset_peer", "refuse"):
                reset(writer)
            else:
                writer.close()
        for flow in self.flows.values():
            flow.wake()

    def discard(self) -> None:
        for timer in self.timers:
            timer.cancel()
        for flow in self.flows.values():
            if flow.worker is not None:
                flow.worker.cancel()
