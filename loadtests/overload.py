"""Open-loop submission load for the overload class: a short closed-loop probe of the
capacity, then submissions at a fixed rate (a share of it) whatever the platform answers,
from a background thread, until stopped.

Open loop on purpose: real users do not slow down because the platform did (a closed loop
would politely hide an overload). Each logical submission is retried the way a typical SDK
does, with the same Idempotency-Key: on a timeout, a transport error, a 5xx or a 429, up to
4 attempts within 15 s, exponential backoff with full jitter on top of any Retry-After
(loadtests/client.py Backoff), within a retry budget looser than the game day's load client's:
retries may add half again to the submissions sent (the background load's budget: a tenth).
A request not answered within the client's timeout is abandoned by the client and retried,
while the platform may still be working on it. Measured on the 2-core machine (2026-12-06):
with a tenth, the API without admission control (seeded defect admission-unbounded) had its
goodput back 10 s after the trigger; with half, 13 s (and the healthy API 1 s); with the whole
(1.0), 1 s; with no budget at all the retries (and this client's own CPU on the same cores)
kept even the admission-controlled API down for the 70 s after the trigger. Every HTTP
attempt becomes one request record (the format of requests.jsonl, route templates) and every
acknowledgement one client-ledger line, so the verdict's goodput, amplification and
durability see this load like the background load.

The client must not become the system under test. Its timeouts are measured on its own event
loop, so a loop that falls behind (its CPU taken by a neighbour, a write blocked by the page
cache's dirty throttling) turns answers that came in time into timeouts, and the retries
those cause keep it behind: measured 2026-12-06 at 500/s while another environment came up on
the same 2 cores, the client saw no acknowledgement for 50 s while the API replicas idled at
5 % CPU. So the records are written by a thread of their own, in batches, never on the loop;
a late schedule catches up one submission per loop turn, never in a burst; and the loop's lag
is measured (LagMonitor) and reported with the counts (``generator_lag``), so the verdict can
refuse to judge a span in which the client, not the platform, fell behind
(slo/overload_invariants.py).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.store.queues import HELD_QUEUE
from loadtests.client import Backoff, RetryBudget, is_ack, is_retryable, parse_retry_after
from loadtests.records import JsonlWriter, utc_iso
from loadtests.safety import check_target
from loadtests.scenario import SubmitRetry
from slo.ledger import LedgerEntry, LedgerWriter

ROUTE = "/v1/operations"
# to the held queue (controlplane/store/queues.py): acknowledged and stored like any work,
# never routed, so the load costs the API and the database, not the agents, and tens of
# thousands of these never stand in a routing pass's way (routed to `blocked` instead, they
# starved the background load's training work: measured 2026-12-06, runbook)
BODY: dict[str, Any] = {"name": "overload", "queue": HELD_QUEUE, "max_retries": 0,
                        "workload": {"image": "127.0.0.1:5000/ml/trainer:1.0"}}
# the game day's load client's request timeout (loadtests/scenarios/gameday.yaml): a client
# gives up on an answer later than this, and retries (the experiment sets 2 s: an interactive
# client, runbooks/overload-metastability.md)
REQUEST_TIMEOUT_S = 5.0
# an interactive client's retries: fewer tries and a shorter deadline than the background
# load, and a looser budget (retries add at most half again to the submissions sent)
RETRY = SubmitRetry(max_attempts=4, base_s=0.1, max_backoff_s=1.0, deadline=15.0,
                    budget_ratio=0.5, budget_min_per_s=5.0)


def first_project(tokens: dict[str, Any]) -> tuple[str, str] | None:
    """(project, user token) of an environment's first project (env.json ``tokens``), the one
    the harness's own submissions use; None when it has none."""
    projects = tokens.get("projects") or tokens.get("project_tokens") or {}
    if not projects:
        return None
    project, token = min(projects.items())
    return str(project), str(token)


def cancel_held(adapter: Any) -> dict[str, Any]:
    """Cancel the held queue's work through the platform's adapter (``cancel_held``), once the
    harness's submissions to it are done: ``{"held_canceled": n}``, or ``held_cancel_error``
    (recorded, not raised: the run's evidence comes first); nothing for an adapter without."""
    cancel = getattr(adapter, "cancel_held", None)
    if cancel is None:
        return {}
    try:
        return {"held_canceled": cancel()}
    except Exception as exc:  # noqa: BLE001 - see above
        return {"held_cancel_error": str(exc)}


def offered_rate(capacity_per_s: float, share: float, floor: float = 1.0) -> float:
    """The open loop's rate: ``share`` of the measured capacity, at least ``floor``."""
    if capacity_per_s <= 0 or not 0 < share <= 1:
        raise ValueError(f"capacity {capacity_per_s}/s, share {share}: need capacity > 0 and "
                         "0 < share <= 1")
    return max(floor, capacity_per_s * share)


def request_record(sent_at: float, status: int | None, error: str | None,
                   latency_s: float) -> dict[str, Any]:
    """One requests.jsonl line (slo.evidence.RequestRecord): ``sent_at`` wall-clock epoch."""
    record: dict[str, Any] = {"time": utc_iso(sent_at), "method": "POST", "route": ROUTE,
                              "status": status, "latency_ms": round(latency_s * 1000, 3)}
    if error is not None:
        record["error"] = error
    return record


@dataclass
class Counts:
    first_attempts: int = 0
    requests: int = 0
    acked: int = 0
    refused: int = 0  # 5xx/429 answers
    timeouts: int = 0  # no answer within the client's timeout, or no connection
    abandoned: int = 0  # logical submissions given up (attempts, deadline or budget)
    rejected: int = 0  # a 4xx retrying cannot fix

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


# the event loop's lag worth recording: well below the shortest client timeout (2 s)
LAG_EPISODE_S = 0.25
LAG_TICK_S = 0.1


@dataclass
class LagMonitor:
    """The event loop's lag (how late a ``LAG_TICK_S`` sleep wakes up), as episodes: each a
    run of ticks later than ``threshold_s``, ``{"start", "end", "max_lag_s"}`` (wall-clock
    epoch seconds), and the largest lag seen."""

    threshold_s: float = LAG_EPISODE_S
    clock: Callable[[], float] = time.time
    max_lag_s: float = 0.0
    episodes: list[dict[str, float]] = field(default_factory=list)
    _open: dict[str, float] | None = field(default=None, init=False)

    def observe(self, lag_s: float, at: float | None = None) -> None:
        """One tick ``lag_s`` late, ending at ``at`` (now by default)."""
        now = self.clock() if at is None else at
        self.max_lag_s = max(self.max_lag_s, lag_s)
        if lag_s < self.threshold_s:
            self._open = None
            return
        if self._open is None:
            self._open = {"start": round(now - lag_s, 3), "end": round(now, 3),
                          "max_lag_s": round(lag_s, 3)}
            self.episodes.append(self._open)
        else:
            self._open["end"] = round(now, 3)
            self._open["max_lag_s"] = round(max(self._open["max_lag_s"], lag_s), 3)

    async def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(LAG_TICK_S)
            self.observe(max(0.0, time.monotonic() - t0 - LAG_TICK_S))


class RecordSink:
    """The open loop's request records and ledger lines, written by a thread of their own in
    batches (one flush per batch), so that a slow write never stalls the event loop whose
    clock times the requests. A crash loses at most the last batch's lines (fewer audited
    acknowledgements, never a false loss)."""

    def __init__(self, requests_path: Path, ledger_path: Path) -> None:
        self._requests = JsonlWriter(requests_path)
        self._ledger = LedgerWriter(ledger_path)
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._drain, name="overload-records",
                                        daemon=True)
        self._thread.start()

    def request(self, record: dict[str, Any]) -> None:
        self._queue.put(("request", record))

    def ack(self, entry: LedgerEntry) -> None:
        self._queue.put(("ack", entry))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._requests.close()

    def _drain(self) -> None:
        done = False
        while not done:
            batch = [self._queue.get()]
            while True:  # whatever else is queued now goes in the same batch
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            items = [b for b in batch if b is not None]
            self._requests.write_many([r for kind, r in items if kind == "request"])
            acks = [e for kind, e in items if kind == "ack"]
            if acks:
                self._ledger.append(acks)


async def probe_capacity(url: str, token: str, seconds: float = 5.0, concurrency: int = 32,
                         body: dict[str, Any] | None = None) -> tuple[int, float]:
    """Closed loop: ``concurrency`` clients each submitting as soon as the last answer came.
    (acknowledged submissions, seconds): their ratio is the capacity as this client sees it."""
    import aiohttp

    acked = 0
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency * 2),
                                     headers=headers, timeout=timeout) as s:
        async def worker() -> None:
            nonlocal acked
            while time.monotonic() < deadline:
                try:
                    async with s.post(f"{url}{ROUTE}", json=body or BODY,
                                      headers={"Idempotency-Key": str(uuid.uuid4())}) as r:
                        await r.read()
                        acked += is_ack(r.status)
                except (TimeoutError, aiohttp.ClientError):
                    pass

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return acked, time.monotonic() - started


@dataclass
class OpenLoop:
    """Submissions at ``rate`` per second from a background thread, until `stop`."""

    url: str
    token: str
    rate: float
    requests_path: Path
    ledger_path: Path
    project: str
    source: str = "overload"
    body: dict[str, Any] = field(default_factory=lambda: dict(BODY))
    request_timeout_s: float = REQUEST_TIMEOUT_S
    retry: SubmitRetry = RETRY
    retry_budget: bool = True  # False: no budget at all
    allow_remote: bool = False
    clock: Callable[[], float] = time.time
    counts: Counts = field(default_factory=Counts)
    lag: LagMonitor = field(default_factory=LagMonitor)
    _thread: threading.Thread | None = field(default=None, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _error: BaseException | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        check_target(self.url, allow_remote=self.allow_remote, what="the overload target")
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0, not {self.rate}")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="overload", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, drain_s: float = 15.0) -> dict[str, Any]:
        """Stop sending; wait up to ``drain_s`` for the submissions in flight (their retries
        are not started any more). The counts so far."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(drain_s + self.request_timeout_s + 5)
        out: dict[str, Any] = {"rate_per_s": self.rate, **self.counts.as_dict(),
                               "stopped": not self.running(),
                               "max_loop_lag_s": round(self.lag.max_lag_s, 3),
                               "generator_lag": list(self.lag.episodes)}
        if self._error is not None:
            out["error"] = repr(self._error)
        return out

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._error = exc

    async def _main(self) -> None:
        import aiohttp

        sink = RecordSink(self.requests_path, self.ledger_path)
        budget = (RetryBudget(ratio=self.retry.budget_ratio, min_per_s=self.retry.budget_min_per_s)
                  if self.retry_budget else None)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        # enough connections for every submission the timeout can leave outstanding
        limit = max(100, int(self.rate * self.request_timeout_s * 2))
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=limit),
                headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout) as s:
            async def attempt(key: str) -> tuple[int | None, float | None, dict[str, Any] | None]:
                sent = self.clock()
                t0 = time.monotonic()
                status: int | None = None
                error: str | None = None
                doc: dict[str, Any] | None = None
                retry_after: float | None = None
                try:
                    async with s.post(f"{self.url}{ROUTE}", json=self.body,
                                      headers={"Idempotency-Key": key}) as r:
                        status = r.status
                        retry_after = parse_retry_after(r.headers.get("Retry-After"))
                        if is_ack(r.status):
                            doc = await r.json()
                        else:
                            await r.read()
                except TimeoutError:
                    error = f"timeout after {self.request_timeout_s:g} s"
                except aiohttp.ClientError as exc:
                    error = f"{type(exc).__name__}: {exc}"[:200]
                sink.request(request_record(sent, status, error, time.monotonic() - t0))
                self.counts.requests += 1
                return status, retry_after, doc

            async def submission() -> None:
                key = str(uuid.uuid4())
                backoff = Backoff(self.retry, budget=budget)
                self.counts.first_attempts += 1
                while True:
                    status, retry_after, doc = await attempt(key)
                    if status is not None and is_ack(status) and doc is not None:
                        self.counts.acked += 1
                        sink.ack(LedgerEntry.now(str(doc["id"]), key, self.project,
                                                 status=status, source=self.source,
                                                 request=self.body))
                        return
                    if status is None:
                        self.counts.timeouts += 1
                    elif is_retryable(status):
                        self.counts.refused += 1
                    else:
                        self.counts.rejected += 1
                        return
                    delay = backoff.next_delay(retry_after)
                    if delay is None or self._stop.is_set():
                        self.counts.abandoned += 1
                        return
                    await asyncio.sleep(delay)

            tasks: set[asyncio.Task[None]] = set()
            lag = asyncio.create_task(self.lag.run(self._stop))
            start = time.monotonic()
            i = 0
            while not self._stop.is_set():
                due = start + i / self.rate
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(min(due - now, 0.05))
                    continue
                task = asyncio.create_task(submission())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                # behind schedule: one submission per loop turn, so the answers already in
                # are read before the next one goes out (a burst would time them out)
                await asyncio.sleep(0)
            if tasks:
                await asyncio.wait(tasks, timeout=15.0)
                for t in tasks:
                    t.cancel()
            await lag
        sink.close()
