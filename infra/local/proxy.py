"""A fault-injectable TCP proxy: one process, many routes, each switchable at runtime.

Modes per route:

* ``pass``      - forward bytes both ways;
* ``refuse``    - existing connections are reset, new ones are accepted and reset at once
                  (the client sees "connection refused/reset" immediately);
* ``blackhole`` - nothing is forwarded any more, on existing or new connections: the client
                  hangs until its own timeout, as if packets were dropped. Switching back to
                  ``pass`` lets held connections continue (like TCP retransmission after a
                  partition heals).

Control API (HTTP on ``--control-port``): ``GET /routes``, ``POST /routes/<name>?mode=M``
(returns once the mode is in effect), ``GET /healthz``, ``GET /metrics`` (Prometheus text,
including a TCP probe of each upstream, so a target without metrics - moto - is still
observed). Run: ``python -m infra.local.proxy --config proxy.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


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
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    connections_total: int = 0
    refused_total: int = 0

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        self.changed.set()
        self.changed = asyncio.Event()
        if mode is Mode.REFUSE:
            for writer in list(self.writers):
                _reset(writer)
            self.writers.clear()


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


async def _pump(route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            if not await _wait_passable(route):
                return
            data = await reader.read(65536)
            if not data:
                break
            if not await _wait_passable(route):  # data read during a partition is held
                return
            writer.write(data)
            await writer.drain()
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
        _reset(writer)
        return
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(route.target_host, route.target_port), timeout=5.0)
    except (TimeoutError, OSError):
        _reset(writer)
        return
    route.writers.update((writer, up_writer))
    try:
        await asyncio.gather(_pump(route, reader, up_writer), _pump(route, up_reader, writer))
    finally:
        for w in (writer, up_writer):
            route.writers.discard(w)
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


class ControlServer:
    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.started = time.time()

    def _routes_json(self) -> dict[str, dict[str, object]]:
        return {n: {"mode": r.mode.value, "listen": r.listen,
                    "target": f"{r.target_host}:{r.target_port}",
                    "active_connections": len(r.writers) // 2}
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
        lines += ["# HELP gameday_proxy_upstream_up Whether a TCP connect to the route's upstream succeeds.",
                  "# TYPE gameday_proxy_upstream_up gauge"]
        probes = await asyncio.gather(*(_probe(r.target_host, r.target_port)
                                        for r in self.routes.values()))
        lines += [f'gameday_proxy_upstream_up{{route="{n}"}} {up}'
                  for n, up in zip(self.routes, probes)]
        return "\n".join(lines) + "\n"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            url = urlsplit(target)
            status, body, ctype = 200, "", "application/json"
            parts = url.path.strip("/").split("/")
            if method == "GET" and url.path == "/healthz":
                body = json.dumps({"ok": True})
            elif method == "GET" and url.path == "/metrics":
                body, ctype = await self._metrics(), "text/plain; version=0.0.4"
            elif method == "GET" and url.path == "/routes":
                body = json.dumps(self._routes_json())
            elif method == "POST" and len(parts) == 2 and parts[0] == "routes":
                route = self.routes.get(parts[1])
                mode = parse_qs(url.query).get("mode", [""])[0]
                if route is None:
                    status, body = 404, json.dumps({"detail": f"unknown route {parts[1]!r}"})
                elif mode not in {m.value for m in Mode}:
                    status, body = 422, json.dumps(
                        {"detail": f"mode {mode!r} is not one of {[m.value for m in Mode]}"})
                else:
                    route.set_mode(Mode(mode))
                    body = json.dumps(self._routes_json()[route.name])
            else:
                status, body = 404, json.dumps({"detail": "not found"})
            payload = body.encode()
            writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: "
                         f"{len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, ConnectionError):
            pass
        finally:
            writer.close()


async def run(config: dict[str, object]) -> None:
    routes: dict[str, Route] = {}
    servers = []
    for name, spec in config["routes"].items():  # type: ignore[union-attr]
        host, port = spec["target"].rsplit(":", 1)
        route = Route(name=name, listen=int(spec["listen"]), target_host=host, target_port=int(port),
                      mode=Mode(spec.get("mode", "pass")))
        routes[name] = route
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
    asyncio.run(run(json.loads(args.config.read_text())))


if __name__ == "__main__":
    main()
