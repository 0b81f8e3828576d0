"""The reconciler process: routes waiting work, expires leases, wakes retries, enforces
timeouts, and exports the gauges. Two replicas may run at once (see store/scheduling.py).

Every loop iteration and database round trip is recorded in ``Reconciler.health``, which
controlplane/health.py serves as /healthz (loop alive) and /readyz (database reachable).

Leases are granted, renewed and expired on the database's clock (``now()`` in the queries of
store/), never on this process's wall clock; the loop's own timing is monotonic. Which clock
decides what, and why: controlplane/clock.py."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import psycopg

from controlplane import clock, defects, metrics
from controlplane.db import CONNECT_TIMEOUT, ListenConnection
from controlplane.health import ReconcilerHealth, default_stall_seconds
from controlplane.states import TERMINAL, OpState
from controlplane.store import agents as agent_store
from controlplane.store import pipelines as pipeline_store
from controlplane.store import scheduling
from controlplane.store.operations import NOTIFY_CHANNEL

log = logging.getLogger("controlplane.reconciler")


# Notifications that only mean "route now": new work, or a slot freed by an attempt that
# ended (store/agents.py). Any other one says the fleet changed, so blocked work is re-checked.
WAKE_ONLY = frozenset({"submitted", "freed"})


@dataclass(frozen=True)
class ReconcilerSettings:
    dsn: str
    interval: float = 0.5  # fallback tick; NOTIFY wakes the routing pass sooner
    # Fallback tick while no work is open (scheduling.open_work): nothing is timed then, and
    # new work arrives with a NOTIFY. Only work that appears without one (while LISTEN was
    # down, a restored database) waits this long; no longer than the gauges' own cadence.
    idle_interval: float = 2.0
    agent_timeout: float = 15.0  # an agent without heartbeat this long is not routed to
    lease_seconds: float = 15.0  # initial lease of a dispatched attempt (time to claim)
    retry_base: float = 1.0
    progress_stale_seconds: float = 60.0
    gauge_interval: float = 2.0
    # The finished states' counts read every finished operation kept (no index can make that
    # cheap), so they are refreshed this often; the open states every gauge_interval.
    finished_gauge_interval: float = 60.0
    blocked_recheck_seconds: float = 10.0
    debounce: float = 0.02
    stall_seconds: float | None = None  # /healthz bound; None: from the intervals (stall_bound)

    @property
    def stall_bound(self) -> float:
        if self.stall_seconds:
            return self.stall_seconds
        # an idle loop iterates every idle_interval: a healthy one must never look stalled
        return max(default_stall_seconds(self.interval), 5 * self.idle_interval)


class Reconciler:
    def __init__(self, settings: ReconcilerSettings,
                 health: ReconcilerHealth | None = None) -> None:
        self.s = settings
        self.health = health or ReconcilerHealth(settings.stall_bound)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._fleet: tuple | None = None  # last fleet seen by routing; None = re-check blocked
        self._blocked_cursor: scheduling.Cursor | None = None  # blocked sweep in progress
        self._last_full = 0.0
        self._last_timed = 0.0
        self._listening = False  # a NOTIFY can wake us: only then may the loop idle
        self.idle = False  # the last pass found no open work
        self._finished_at: float | None = None  # when the finished states were last counted
        self._finished: dict[str, int] = {}

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def run(self) -> None:
        listener = asyncio.create_task(self._listen())
        last_gauges = 0.0
        conn: psycopg.AsyncConnection | None = None
        loop = asyncio.get_running_loop()
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(
                            self.s.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                            application_name="reconciler")
                    await self.tick(conn)
                    self.idle = self._listening and not await scheduling.open_work(conn)
                    if loop.time() - last_gauges >= self.s.gauge_interval:
                        await self.export_gauges(conn)
                        last_gauges = loop.time()
                    self.health.db_succeeded()
                except psycopg.Error as exc:
                    self.health.db_failed(f"{type(exc).__name__}: {exc}".strip())
                    metrics.DISPATCH_FAILURES.labels(type(exc).__name__).inc()
                    log.warning("reconciler pass failed; reconnecting",
                                extra={"action": "pass_failed", "error": str(exc)})
                    if conn is not None:
                        await conn.close()
                    conn = None
                    self.idle = False
                    # the LISTEN connection may be as dead as this one without knowing it yet
                    # (nothing is read on it until a NOTIFY): open it again too
                    listener.cancel()
                    listener = asyncio.create_task(self._listen())
                    await asyncio.sleep(0.5)
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.s.idle_interval
                                           if self.idle else self.s.interval)
                    # debounce: let a burst of submissions collect into one routing pass
                    await asyncio.sleep(self.s.debounce)
                except TimeoutError:
                    pass
                self._wake.clear()
                self.health.beat()
        finally:
            listener.cancel()
            if conn is not None:
                await conn.close()

    async def tick(self, conn: psycopg.AsyncConnection) -> None:
        now = asyncio.get_running_loop().time()
        exp = scheduling.PassStats()
        # lease/retry/timeout checks are time-driven: once per interval is enough, while
        # routing also runs on every wake-up (a burst of submissions)
        if now - self._last_timed >= self.s.interval:
            self._last_timed = now
            if not defects.enabled("leases-never-expire"):  # seeded defect: test only
                exp = await scheduling.expire_leases(conn, retry_base=self.s.retry_base)
            metrics.LEASE_EXPIRIES.inc(exp.expired)
            metrics.RETRIES.inc(exp.retried)
            metrics.REROUTES.inc(exp.rerouted)
            for pool in exp.lost_pools:
                metrics.ATTEMPTS_FINISHED.labels(pool, "lost", "lease_expired").inc()
            metrics.RECONCILER_PASSES.labels("expire").inc()
            await scheduling.wake_retries(conn)
            await scheduling.enforce_timeouts(conn)
        # pipelines first: a step whose upstream manifest was just accepted is routed below
        await pipeline_store.advance(conn)
        if now - self._last_full > self.s.blocked_recheck_seconds:
            self._fleet, self._last_full = None, now  # periodic safety net for blocked work
        st, self._fleet, self._blocked_cursor = await scheduling.schedule(
            conn, alive_seconds=self.s.agent_timeout, lease_seconds=self.s.lease_seconds,
            last_fleet=self._fleet, blocked_after=self._blocked_cursor)
        if st.dispatched:  # wake the agents' long-polling claims (api/claimwait.py)
            await agent_store.notify_claimable(conn)
        if self._blocked_cursor is not None:
            self._wake.set()  # a blocked sweep is half done: continue without waiting
        metrics.RECONCILER_PASSES.labels("schedule").inc()
        metrics.DISPATCHES.inc(len(st.dispatched))
        for waited in st.dispatched:
            metrics.DISPATCH_LATENCY.observe(waited)
        if exp.expired or st.dispatched:
            log.info("pass", extra={"action": "reconcile", "dispatched": len(st.dispatched),
                                    "blocked": st.blocked, "waiting": st.waiting,
                                    "expired": exp.expired, "retried": exp.retried,
                                    "rerouted": exp.rerouted, "failed": exp.failed})

    async def export_gauges(self, conn: psycopg.AsyncConnection) -> None:
        now = asyncio.get_running_loop().time()
        finished = (self._finished_at is None
                    or now - self._finished_at >= self.s.finished_gauge_interval)
        g = await scheduling.gauges(conn, self.s.progress_stale_seconds, finished=finished)
        if finished:
            self._finished_at = now
            self._finished = {s.value: g["states"].get(s.value, 0) for s in TERMINAL}
        for state in OpState:
            counts = self._finished if state in TERMINAL else g["states"]
            metrics.OPERATIONS.labels(state.value).set(counts.get(state.value, 0))
        for queue, age in g["queue_age"].items():
            metrics.QUEUE_AGE.labels(queue).set(age)
        metrics.PENDING.clear()
        for queue, reason, n in g["pending"]:
            metrics.PENDING.labels(queue, reason).set(n)
        metrics.PROGRESS_STALE.set(g["progress_stale"])
        # reported, never used: every lease decision above is on the database's clock
        metrics.CLOCK_OFFSET.set(round(clock.wall() - g["db_time"], 3))

    async def _listen(self) -> None:
        """LISTEN for submissions so routing starts at once instead of at the next tick."""
        while not self._stop.is_set():
            try:
                async with await ListenConnection.connect(
                        self.s.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                        application_name="reconciler-listen") as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self._listening = True
                    async for n in conn.notifies():
                        if n.payload not in WAKE_ONLY:
                            self._fleet = None  # agents/breakers/pins changed: re-route blocked
                        self._wake.set()
            except (psycopg.Error, OSError):
                pass
            finally:
                self._listening = False
                self.idle = False
                self._wake.set()  # end an idle wait: tick at the busy cadence until it is back
            await asyncio.sleep(1.0)


def run(settings: ReconcilerSettings, health: ReconcilerHealth | None = None) -> None:
    async def main() -> None:
        r = Reconciler(settings, health)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, r.stop)
        log.info("reconciler started", extra={"action": "start"})
        await r.run()
        log.info("reconciler stopped", extra={"action": "stop"})

    asyncio.run(main())
