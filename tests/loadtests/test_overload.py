"""The overload class's open-loop load (loadtests/overload.py): the rate from the capacity,
the records it leaves (requests.jsonl lines and client-ledger lines the verdict reads), its
retries of refusals and timeouts with the same key, and the capacity probe, against a small
in-process HTTP server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.overload import BODY, OpenLoop, offered_rate, probe_capacity, request_record
from loadtests.safety import UnsafeTargetError
from slo.evidence import RequestRecord
from slo.ledger import read as read_ledger


def test_the_rate_is_the_share_of_the_capacity() -> None:
    assert offered_rate(400.0, 0.8) == pytest.approx(320.0)
    assert offered_rate(0.5, 0.8) == 1.0  # at least one a second
    for capacity, share in ((0.0, 0.8), (100.0, 0.0), (100.0, 1.5)):
        with pytest.raises(ValueError):
            offered_rate(capacity, share)


def test_a_record_is_a_request_line_the_verdict_reads() -> None:
    r = RequestRecord.model_validate(request_record(1_700_000_000.25, None, "timeout", 2.0))
    assert (r.method, r.route, r.status, r.error, r.latency_ms) == (
        "POST", "/v1/operations", None, "timeout", 2000.0)
    assert RequestRecord.model_validate(request_record(1_700_000_000.0, 201, None, 0.01)).status \
        == 201


class Server:
    """Answers POST /v1/operations: every third key first with 503 + Retry-After 0, every
    fifth first too late for the client (then at once), the rest 201."""

    def __init__(self, body: dict | None = None) -> None:
        self.body = BODY if body is None else body  # what every submission must carry
        self.seen: Counter[str] = Counter()
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _handle(self, request: object) -> object:
        from aiohttp import web

        key = request.headers["Idempotency-Key"]  # type: ignore[attr-defined]
        body = await request.json()  # type: ignore[attr-defined]
        assert body == self.body
        self.seen[key] += 1
        n = int(uuid.UUID(key)) % 15
        if self.seen[key] == 1 and n % 3 == 0:
            return web.json_response({"detail": "overloaded"}, status=503,
                                     headers={"Retry-After": "0"})
        if self.seen[key] == 1 and n % 5 == 0:
            await asyncio.sleep(1.0)
        return web.json_response({"id": str(uuid.uuid5(uuid.NAMESPACE_URL, key))}, status=201)

    async def _main(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/operations", self._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> Server:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


def test_open_loop_records_every_attempt_and_acks_each_key_once(server: Server,
                                                                 tmp_path: Path) -> None:
    loop = OpenLoop(url=f"http://127.0.0.1:{server.port}", token="t", rate=40.0,
                    requests_path=tmp_path / "requests.x.jsonl",
                    ledger_path=tmp_path / "ledger.x.jsonl", project="p",
                    request_timeout_s=0.3)
    loop.start()
    time.sleep(1.5)
    counts = loop.stop()
    assert counts["stopped"] and "error" not in counts
    assert 50 <= counts["first_attempts"] <= 70  # 40/s for 1.5 s, open loop
    lines = [RequestRecord.model_validate(json.loads(x))
             for x in (tmp_path / "requests.x.jsonl").read_text().splitlines()]
    assert len(lines) == counts["requests"] == sum(server.seen.values())
    statuses = Counter(r.status for r in lines)
    assert statuses[503] == counts["refused"] > 0
    assert statuses[None] == counts["timeouts"] > 0  # too late for the client: retried
    assert all(r.error and "timeout" in r.error for r in lines if r.status is None)
    ledger = list(read_ledger([tmp_path / "ledger.x.jsonl"]))
    assert len(ledger) == statuses[201] == counts["acked"]
    assert len({e.idempotency_key for e in ledger}) == len(ledger)  # one ack per key
    assert {e.source for e in ledger} == {"overload"} and {e.project for e in ledger} == {"p"}
    # every refused or timed-out key was tried again with the same key
    assert max(server.seen.values()) >= 2
    assert counts["acked"] + counts["abandoned"] + counts["rejected"] <= counts["first_attempts"]


def test_open_loop_refuses_a_remote_target(tmp_path: Path) -> None:
    with pytest.raises(UnsafeTargetError):
        OpenLoop(url="http://192.0.2.1:8080", token="t", rate=1.0, project="p",
                 requests_path=tmp_path / "r", ledger_path=tmp_path / "l")


def test_the_probe_counts_acknowledged_submissions_in_closed_loop(server: Server) -> None:
    acked, seconds = asyncio.run(probe_capacity(f"http://127.0.0.1:{server.port}", "t",
                                                seconds=0.5, concurrency=4))
    assert acked > 0 and 0.5 <= seconds < 3.0


def test_the_first_project_and_the_held_queue_cancel_shared_by_the_harness_loads() -> None:
    from loadtests.overload import cancel_held, first_project

    class Cancels:
        def cancel_held(self) -> int:
            return 3

    class Refused:
        def cancel_held(self) -> int:
            raise RuntimeError("HTTP 409 queue 'held' is not held")

    assert first_project({"projects": {"team-b": "b", "team-a": "a"}}) == ("team-a", "a")
    assert first_project({}) is None
    assert cancel_held(Cancels()) == {"held_canceled": 3}
    assert cancel_held(Refused()) == {"held_cancel_error": "HTTP 409 queue 'held' is not held"}
    assert cancel_held(object()) == {}  # a platform without held queues: nothing to cancel


def test_the_lag_monitor_keeps_episodes_of_a_late_event_loop() -> None:
    from loadtests.overload import LagMonitor

    m = LagMonitor(threshold_s=0.25)
    for at, lag in ((10.0, 0.01), (11.0, 0.3), (12.0, 1.2), (13.0, 0.02), (20.0, 0.5)):
        m.observe(lag, at=at)
    assert m.max_lag_s == 1.2
    assert m.episodes == [{"start": 10.7, "end": 12.0, "max_lag_s": 1.2},
                          {"start": 19.5, "end": 20.0, "max_lag_s": 0.5}]


def test_the_open_loop_reports_its_own_lag_and_writes_off_its_event_loop(
        server: Server, tmp_path: Path) -> None:
    """A loop blocked for 0.6 s (as by a write stalled in the page cache) is one lag episode
    in the counts; the records of every attempt are still all written, by the sink's thread."""
    blocked: list[float] = []

    def clock() -> float:  # read on the event loop as each attempt is sent
        if len(blocked) == 5:  # once: block the loop as a stalled write would
            time.sleep(0.6)
        blocked.append(time.time())
        return blocked[-1]

    loop = OpenLoop(url=f"http://127.0.0.1:{server.port}", token="t", rate=20.0,
                    requests_path=tmp_path / "requests.x.jsonl",
                    ledger_path=tmp_path / "ledger.x.jsonl", project="p",
                    request_timeout_s=2.0, clock=clock)
    loop.start()
    time.sleep(1.5)
    counts = loop.stop()
    assert counts["max_loop_lag_s"] >= 0.5
    [episode] = counts["generator_lag"]
    assert episode["max_lag_s"] >= 0.5 and episode["end"] >= episode["start"]
    lines = (tmp_path / "requests.x.jsonl").read_text().splitlines()
    assert len(lines) == counts["requests"] == sum(server.seen.values())
    assert len(list(read_ledger([tmp_path / "ledger.x.jsonl"]))) == counts["acked"]
