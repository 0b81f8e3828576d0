"""Idle processes do not wake for nothing: the LISTEN connections (API claim wake-ups, the
reconciler) wait without psycopg's 0.1 s polling, and the API's uvicorn main loop ticks once a
second yet stops at once. Wake-ups are counted, not timed: CPU figures are the benchmark's job
(`gameday bench idle`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
import uvicorn

from controlplane.api.server import QuietServer
from controlplane.db import ListenConnection


class CountingLoop(asyncio.SelectorEventLoop):
    """Counts how often anything starts waiting for a socket to become readable."""

    def __init__(self) -> None:
        super().__init__()
        self.reader_waits = 0

    def add_reader(self, fd: Any, callback: Callable[..., object], *args: Any) -> None:
        self.reader_waits += 1
        super().add_reader(fd, callback, *args)


def run(coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> tuple[Any, int]:
    loop = CountingLoop()
    try:
        return loop.run_until_complete(coro_fn()), loop.reader_waits
    finally:
        loop.close()


def idle_listen_waits(dsn: str, cls: type[psycopg.AsyncConnection], seconds: float) -> int:
    async def main() -> int:
        async with await cls.connect(dsn, autocommit=True) as conn:
            await conn.execute("LISTEN quiet_test")
            loop = asyncio.get_running_loop()
            before = loop.reader_waits  # type: ignore[attr-defined]
            received = [n async for n in conn.notifies(timeout=seconds)]
            assert received == []
            return loop.reader_waits - before  # type: ignore[attr-defined, no-any-return]
    return run(main)[0]


def test_an_idle_listen_connection_does_not_poll(pg_dsn: str) -> None:
    quiet = idle_listen_waits(pg_dsn, ListenConnection, 1.5)
    polling = idle_listen_waits(pg_dsn, psycopg.AsyncConnection, 1.5)
    # psycopg wakes every 0.1 s (about 15 waits here); the listener waits once
    assert quiet <= 2 and polling >= 8, (quiet, polling)


def test_a_listen_connection_still_receives_at_once_and_keeps_its_deadline(pg_dsn: str) -> None:
    async def main() -> tuple[float, float, list[str]]:
        async with await ListenConnection.connect(pg_dsn, autocommit=True) as conn, \
                await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as sender:
            await conn.execute("LISTEN quiet_test")

            async def send() -> None:
                await asyncio.sleep(0.3)
                await sender.execute("SELECT pg_notify('quiet_test', 'hello')")
            task = asyncio.create_task(send())
            t0 = time.monotonic()
            got = [n.payload async for n in conn.notifies(timeout=5.0, stop_after=1)]
            received_after = time.monotonic() - t0
            await task
            t0 = time.monotonic()
            assert [n async for n in conn.notifies(timeout=0.4)] == []
            return received_after, time.monotonic() - t0, got
    (received_after, deadline_after, got), _ = run(main)
    assert got == ["hello"] and received_after < 1.0, received_after  # not 60 s later
    assert 0.35 < deadline_after < 1.0, deadline_after  # a deadline shorter than the interval


def quiet_server() -> QuietServer:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # never called here
        raise AssertionError("no request expected")
    return QuietServer(uvicorn.Config(app, log_config=None))


def test_the_main_loop_ticks_once_a_second_and_stops_at_once() -> None:
    server = quiet_server()
    ticks: list[int] = []
    on_tick = server.on_tick

    async def counting_tick(counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(counter)
    server.on_tick = counting_tick  # type: ignore[method-assign]

    async def main() -> float:
        loop = asyncio.get_running_loop()
        stopper = loop.call_later(2.5, server.handle_exit, 15, None)  # SIGTERM's handler
        t0 = time.monotonic()
        await server.main_loop()
        stopper.cancel()
        return time.monotonic() - t0 - 2.5
    late, _ = run(main)
    # stock uvicorn ticks every 0.1 s (26 ticks); every tick here refreshes the Date header
    assert len(ticks) <= 5 and all(c % 10 == 0 for c in ticks), ticks
    assert late < 0.3, late  # woken by the signal, not by the next tick
