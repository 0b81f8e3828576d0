"""The fault proxy's control API (environments/local/proxy.py has the routes it serves): health,
metrics, each route's mode and toxics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from environments.local.proxy_route import CHUNK, Mode, Route
from environments.local.toxics import (
    ToxicError,
    parse_toxic,
    update_toxic,
)

MAX_BODY = 64 * 1024  # control API request bodies


async def probe(host: str, port: int) -> int:
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


def json_body(body: bytes) -> Any:
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
        probes = await asyncio.gather(*(probe(r.target_host, r.target_port)
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
            toxic = parse_toxic(json_body(body), "toxic")
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
        toxic = update_toxic(current, json_body(body), "toxic")
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
                    await asyncio.wait_for(discard(reader, 16 * MAX_BODY), timeout=2.0)
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


async def discard(reader: asyncio.StreamReader, limit: int) -> None:
    while limit > 0 and (data := await reader.read(CHUNK)):
        limit -= len(data)
