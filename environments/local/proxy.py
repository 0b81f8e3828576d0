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

The code: environments/local/proxy_route.py (a route: mode, toxics, counters), proxy_flow.py (one
connection's two directions and the toxics applied to them), proxy_control.py (the control
API); this module accepts and pumps the connections and runs the whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from environments.local.proxy_control import ControlServer
from environments.local.proxy_flow import Conn, Flow
from environments.local.proxy_route import CHUNK, Mode, Route, reset, wait_passable
from environments.local.toxics import Stream, parse_toxic


async def pump(route: Route, flow: Flow, reader: asyncio.StreamReader) -> None:
    writer = flow.dest
    try:
        while True:
            if not await wait_passable(route):
                return
            data = await reader.read(CHUNK)
            if not data:
                break
            if not await wait_passable(route):  # data read during a partition is held
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
        reset(writer)


async def handle(route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    route.connections_total += 1
    if not await wait_passable(route):
        route.refused_total += 1
        route.resets_total["refuse"] += 1
        reset(writer)
        return
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(route.target_host, route.target_port), timeout=5.0)
    except (TimeoutError, OSError):
        reset(writer)
        return
    conn = Conn(route, writer, up_writer)
    route.conns.add(conn)
    try:
        conn.refresh()  # may end it at once (reset_peer with timeout 0)
        if not conn.closed:
            await asyncio.gather(pump(route, conn.flows[Stream.UPSTREAM], reader),
                                 pump(route, conn.flows[Stream.DOWNSTREAM], up_reader))
    finally:
        route.conns.discard(conn)
        conn.discard()
        for w in (writer, up_writer):
            if route.mode is Mode.REFUSE:
                reset(w)
            else:
                w.close()


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
            lambda r, w, route=route: handle(route, r, w), "127.0.0.1", route.listen,
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
