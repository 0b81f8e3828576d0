"""A fault-injectable TCP proxy: one process, many routes, each switchable at runtime.

Modes per route:

* ``pass``      - forward bytes both ways;
* ``refuse``    - existing connections are reset, new ones are accepted and reset at once
                  (the client sees "connection refused/reset" immediately);
* ``blackhole`` - nothing is forwarded any more, on existing or new connections: the client
                  hangs until its own timeout, as if packets were dropped. Switching back to
                  ``pass`` lets held connections continue (like TCP retransmission after a
                  partition heals).

Toxics (gray faults, Toxiproxy's model: environments/local/toxics.py has the types, attributes and
units) stack on a route on top of its mode: latency, bandwidth, slicer, limit_data, reset_peer,
timeout, each on one direction (``upstream`` = client -> target, ``downstream`` = target ->
client) of a ``toxicity`` fraction of the connections. They apply to open connections as well
as new ones. A direction of a connection with no toxic takes the plain path (read, write);
one with toxics hands its chunks to a task that delays, slices, paces, drops or cuts them, in
order, re-reading the toxics at each step so that a change applies to data already waiting.

Control API (HTTP on ``--control-port``, JSON bodies up to 64 KiB; every change returns once
it is in effect):

* ``GET /healthz``; ``GET /metrics`` (Prometheus text, including a TCP probe of each upstream,
  so a target without metrics - moto - is still observed);
* ``GET /routes`` (each route's mode, target, open connections and toxics);
  ``POST /routes/<route>?mode=M``;
* ``GET /routes/<route>/toxics`` -> 200 list; ``POST /routes/<route>/toxics`` (a toxic) -> 200
  the toxic as stored, 409 when the name exists; ``GET /routes/<route>/toxics/<name>`` -> 200;
  ``POST /routes/<route>/toxics/<name>`` (``toxicity`` and/or ``attributes``, merged) -> 200;
  ``DELETE /routes/<route>/toxics/<name>`` -> 204; ``DELETE /routes/<route>/toxics`` -> 204
  (all of the route's). Unknown route or toxic -> 404, invalid toxic -> 422 with
  ``{"detail": "<field path>: <reason>"}``, body not JSON -> 400, too big -> 413.

Run: ``python -m environments.local.proxy --config proxy.json``; the config is ``{"control_port": P,
"routes": {name: {"listen": P, "target": "host:port", "mode": M, "toxics": [...]}}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import struct
import time
from dataclasses import dataclass, field
from enum import Enum
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

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
    ToxicError,
    applies,
    bandwidth_delay,
    latency_delay,
    parse_toxic,
    slice_size,
    update_toxic,
)

CHUNK = 65536
MAX_BODY = 64 * 1024  # control API request bodies
MAX_QUEUED = 1 << 20  # bytes a toxic direction holds before it stops reading (back-pressure)
PACE_SECONDS = 0.02  # bandwidth: the largest write is what the rate allows in this long
CAUSES = ("reset_peer", "limit_data", "timeout", "refuse")  # how a fault ended a connection
_rng = random.Random()


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
    conns: set[Conn] = field(default_factory=set)
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


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:  # SO_LINGER 0 -> RST instead of FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def _wait_passable(route: Route) -> bool:
    """Block while the route black-holes; False when the connection must be dropped."""
    while route.mode is Mode.BLACKHOLE:
        await route.changed.wait()
    return route.mode is Mode.PASS


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
            _reset(self.dest)
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
            if self.conn.closed or not await _wait_passable(self.conn.route):
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
                _reset(writer)
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


async def _pump(route: Route, flow: Flow, reader: asyncio.StreamReader) -> None:
    writer = flow.dest
    try:
        while True:
            if not await _wait_passable(route):
                return
            data = await reader.read(CHUNK)
            if not data:
                break
            if not await _wait_passable(route):  # data read during a partition is held
                return
            if flow.worker is None and not flow.active:  # the plain path: no toxic here
                writer.write(data)
                flow.sent(len(data))
                await writer.drain()
            else:
                await flow.put(data)
        await flow.flush()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        # One side was reset (e.g. a SIGKILLed client): reset the other side too. Otherwise the
        # peer never learns: a database backend would keep the dead client's transaction open,
        # and its row locks, forever.
        _reset(writer)


async def _handle(route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    route.connections_total += 1
    if not await _wait_passable(route):
        route.refused_total += 1
        route.resets_total["refuse"] += 1
        _reset(writer)
        return
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(route.target_host, route.target_port), timeout=5.0)
    except (TimeoutError, OSError):
        _reset(writer)
        return
    conn = Conn(route, writer, up_writer)
    route.conns.add(conn)
    try:
        conn.refresh()  # may end it at once (reset_peer with timeout 0)
        if not conn.closed:
            await asyncio.gather(_pump(route, conn.flows[Stream.UPSTREAM], reader),
                                 _pump(route, conn.flows[Stream.DOWNSTREAM], up_reader))
    finally:
        route.conns.discard(conn)
        conn.discard()
        for w in (writer, up_writer):
            if route.mode is Mode.REFUSE:
                _reset(w)
            else:
                w.close()


async def _probe(host: str, port: int) -> int:
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=0.5)
    except (TimeoutError, OSError):
        return 0
    w.close()
    return 1


class HttpError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise HttpError(400, f"body is not JSON: {exc}") from None


class ControlServer:
    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.started = time.time()

    def _routes_json(self) -> dict[str, dict[str, object]]:
        return {n: {"mode": r.mode.value, "listen": r.listen,
                    "target": f"{r.target_host}:{r.target_port}",
                    "active_connections": len(r.conns),
                    "toxics": [t.to_json() for t in r.toxics.values()]}
                for n, r in self.routes.items()}

    async def _metrics(self) -> str:
        lines = [
            "# HELP gameday_proxy_route_mode Current mode of a fault-proxy route (1 for the active mode).",
            "# TYPE gameday_proxy_route_mode gauge",
        ]
        for name, route in self.routes.items():
            for mode in Mode:
                lines.append(f'gameday_proxy_route_mode{{route="{name}",mode="{mode.value}"}} '
                             f"{int(route.mode is mode)}")
        lines += ["# HELP gameday_proxy_connections_total Connections accepted per route.",
                  "# TYPE gameday_proxy_connections_total counter"]
        lines += [f'gameday_proxy_connections_total{{route="{n}"}} {r.connections_total}'
                  for n, r in self.routes.items()]
        lines += ["# HELP gameday_proxy_toxic_active A toxic set on a route (1 while it is set).",
                  "# TYPE gameday_proxy_toxic_active gauge"]
        lines += [f'gameday_proxy_toxic_active{{route="{n}",toxic="{t.name}",type="{t.type.value}",'
                  f'stream="{t.stream.value}"}} 1'
                  for n, r in self.routes.items() for t in r.toxics.values()]
        lines += ["# HELP gameday_proxy_bytes_total Bytes forwarded per route and direction.",
                  "# TYPE gameday_proxy_bytes_total counter"]
        lines += [f'gameday_proxy_bytes_total{{route="{n}",stream="{s.value}"}} {count}'
                  for n, r in self.routes.items() for s, count in r.bytes_total.items()]
        lines += [("# HELP gameday_proxy_resets_total Connections ended by a fault, per cause "
                   "(reset_peer and refuse reset them, limit_data and timeout close them)."),
                  "# TYPE gameday_proxy_resets_total counter"]
        lines += [f'gameday_proxy_resets_total{{route="{n}",cause="{cause}"}} {count}'
                  for n, r in self.routes.items() for cause, count in r.resets_total.items()]
        lines += ["# HELP gameday_proxy_upstream_up Whether a TCP connect to the route's upstream succeeds.",
                  "# TYPE gameday_proxy_upstream_up gauge"]
        probes = await asyncio.gather(*(_probe(r.target_host, r.target_port)
                                        for r in self.routes.values()))
        lines += [f'gameday_proxy_upstream_up{{route="{n}"}} {up}'
                  for n, up in zip(self.routes, probes)]
        return "\n".join(lines) + "\n"

    def _toxics(self, method: str, route: Route, name: str | None, body: bytes) -> tuple[int, Any]:
        """The toxics API of one route: (status, JSON document or None)."""
        if method not in ("GET", "POST", "DELETE"):
            raise HttpError(405, f"method {method} not allowed")
        if name is None:
            if method == "GET":
                return 200, [t.to_json() for t in route.toxics.values()]
            if method == "DELETE":
                route.clear_toxics()
                return 204, None
            toxic = parse_toxic(_json_body(body), "toxic")
            if toxic.name in route.toxics:
                raise HttpError(409, f"toxic {toxic.name!r} exists on route {route.name!r}: "
                                     f"change it with POST /routes/{route.name}/toxics/{toxic.name}")
            route.put_toxic(toxic)
            return 200, toxic.to_json()
        current = route.toxics.get(name)
        if current is None:
            raise HttpError(404, f"no toxic {name!r} on route {route.name!r}")
        if method == "GET":
            return 200, current.to_json()
        if method == "DELETE":
            route.remove_toxic(name)
            return 204, None
        toxic = update_toxic(current, _json_body(body), "toxic")
        route.put_toxic(toxic)
        return 200, toxic.to_json()

    async def _dispatch(self, method: str, target: str, body: bytes) -> tuple[int, str, str]:
        url = urlsplit(target)
        parts = url.path.strip("/").split("/")
        if method == "GET" and url.path == "/healthz":
            return 200, json.dumps({"ok": True}), "application/json"
        if method == "GET" and url.path == "/metrics":
            return 200, await self._metrics(), "text/plain; version=0.0.4"
        if method == "GET" and url.path == "/routes":
            return 200, json.dumps(self._routes_json()), "application/json"
        if parts[0] != "routes" or len(parts) < 2 or (len(parts) > 2 and parts[2] != "toxics") \
                or len(parts) > 4:
            raise HttpError(404, "not found")
        route = self.routes.get(parts[1])
        if route is None:
            raise HttpError(404, f"unknown route {parts[1]!r}")
        if len(parts) == 2:
            if method != "POST":
                raise HttpError(405, f"method {method} not allowed")
            mode = parse_qs(url.query).get("mode", [""])[0]
            if mode not in {m.value for m in Mode}:
                raise HttpError(422, f"mode {mode!r} is not one of {[m.value for m in Mode]}")
            route.set_mode(Mode(mode))
            return 200, json.dumps(self._routes_json()[route.name]), "application/json"
        try:
            status, doc = self._toxics(method, route, parts[3] if len(parts) == 4 else None, body)
        except ToxicError as exc:
            raise HttpError(422, str(exc)) from None
        return status, "" if doc is None else json.dumps(doc), "application/json"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip()
                       for k, _, v in (line.partition(":") for line in header_lines if line)}
            try:
                status, body, ctype = await self._dispatch(
                    method, target, await self._body(reader, headers))
            except HttpError as exc:
                status, body, ctype = exc.status, json.dumps({"detail": exc.detail}), \
                    "application/json"
            payload = body.encode()
            writer.write(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                         f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + payload)
            await writer.drain()
            if status == 413:  # the client may still be sending: closing now could reset the
                writer.write_eof()  # connection before it reads the answer
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_discard(reader, 16 * MAX_BODY), timeout=2.0)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "transfer-encoding" in headers:
            raise HttpError(411, "send the body with a Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise HttpError(400, "Content-Length is not a number") from None
        if length < 0:
            raise HttpError(400, "Content-Length is negative")
        if length > MAX_BODY:
            raise HttpError(413, f"body of {length} bytes is over the limit of {MAX_BODY}")
        return await asyncio.wait_for(reader.readexactly(length), timeout=5.0)


async def _discard(reader: asyncio.StreamReader, limit: int) -> None:
    while limit > 0 and (data := await reader.read(CHUNK)):
        limit -= len(data)


def _route(name: str, spec: dict[str, Any], where: str) -> Route:
    host, port = spec["target"].rsplit(":", 1)
    route = Route(name=name, listen=int(spec["listen"]), target_host=host, target_port=int(port),
                  mode=Mode(spec.get("mode", "pass")))
    for i, doc in enumerate(spec.get("toxics", [])):
        toxic = parse_toxic(doc, f"{where}.routes.{name}.toxics[{i}]")
        route.toxics[toxic.name] = toxic
    return route


async def run(config: dict[str, Any], where: str = "config") -> None:
    routes: dict[str, Route] = {}
    servers = []
    for name, spec in config["routes"].items():
        route = routes[name] = _route(name, spec, where)
        servers.append(await asyncio.start_server(
            lambda r, w, route=route: _handle(route, r, w), "127.0.0.1", route.listen,
            reuse_address=True))
    control = ControlServer(routes)
    servers.append(await asyncio.start_server(control.handle, "127.0.0.1",
                                              int(config["control_port"]), reuse_address=True))
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fault-injectable TCP proxy (local environment).")
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    asyncio.run(run(json.loads(args.config.read_text()), str(args.config)))


if __name__ == "__main__":
    main()
