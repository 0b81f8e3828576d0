"""The agent's main loop: register, heartbeat, claim while capacity is free, start runners.

Each claimed attempt gets its own ``AttemptRunner`` thread (lease keeper + reporter), so a
slow call for one attempt never delays the heartbeats of another. The main loop only does
agent-level work and capacity accounting; a ``SpoolFlusher`` thread delivers the events runners
left in the on-disk spool and announces any that had to be dropped.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane import storage
from controlplane.agent import cadence
from controlplane.agent.api import AgentApi, ApiError, ApiUnavailable, Registration
from controlplane.agent.attempt import AttemptRunner, Claim, RunnerSettings
from controlplane.agent.capacity import Capacity
from controlplane.agent.delivery import Courier
from controlplane.agent.flusher import SpoolFlusher
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import Spool
from controlplane.runtimes.base import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentIdentity:
    name: str
    pool: str
    zone: str
    region: str
    datasets: tuple[str, ...] = ()
    registries: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoopSettings:
    poll_seconds: float = 0.5  # idle claim interval when the API answers claims at once
    # longest a claim waits on the API for work (None: the heartbeat interval, see cadence.py)
    long_poll_seconds: float | None = None
    register_retry_seconds: float = 1.0
    shutdown_grace_seconds: float = 10.0
    spool_flush_seconds: float = 1.0  # flusher pass interval


@dataclass
class Agent:
    identity: AgentIdentity
    api: AgentApi
    runtime: Runtime
    capacity: Capacity
    runner_settings: RunnerSettings
    store_factory: Callable[[], storage.ObjectStore]
    spool: Spool  # metrics must be the spool's: its counters are the agent's
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    settings: LoopSettings = field(default_factory=LoopSettings)
    stop_event: threading.Event = field(default_factory=threading.Event)
    # Set when a slot is freed or a stop is asked: the main loop's sleep ends at once, so a
    # full agent claims as soon as a slot frees, not up to poll_seconds later while the
    # control plane has already routed work to it.
    wake: threading.Event = field(default_factory=threading.Event)
    runners: dict[str, AttemptRunner] = field(default_factory=dict)
    registration: Registration | None = None
    # the id of the claim being asked, kept until a claim call gets an answer (_claim)
    _claim_id: str | None = None
    flusher: SpoolFlusher | None = None
    courier: Courier = field(init=False)

    def __post_init__(self) -> None:
        self.courier = Courier(self.api, self.spool, self.metrics)
        self.capacity.on_release(self.wake.set)

    def stop(self) -> None:
        """Ask the agent to drain and exit (signal handlers call this)."""
        self.stop_event.set()
        self.wake.set()

    def capabilities(self) -> dict[str, object]:
        return {
            "cpu_slots": self.capacity.cpu_slots,
            "accelerator_type": self.capacity.accelerator_type,
            "accelerator_count": self.capacity.accelerator_count,
            "datasets": list(self.identity.datasets),
            "registries": list(self.identity.registries),
        }

    def register(self) -> Registration:
        """Register, retrying while the control plane is unavailable (agents start first)."""
        while not self.stop_event.is_set():
            try:
                reg = self.api.register(self.identity.name, self.identity.pool, self.identity.zone,
                                        self.identity.region, self.capabilities())
            except ApiUnavailable as exc:
                self.metrics.api_errors.labels("register", "unavailable").inc()
                log.warning("register failed, retrying: %s", exc)
                self.stop_event.wait(self.settings.register_retry_seconds)
                continue
            self.registration = reg
            self.metrics.info.info({"agent": self.identity.name, "agent_id": reg.agent_id,
                                    "pool": self.identity.pool, "zone": self.identity.zone,
                                    "region": self.identity.region, "runtime": self.runtime.name})
            log.info("registered as %s (lease %.1fs, heartbeat %.1fs)", reg.agent_id,
                     reg.lease_seconds, reg.heartbeat_seconds)
            return reg
        raise RuntimeError("agent stopped before it could register")

    def run(self) -> None:
        prepare = getattr(self.runtime, "prepare", None)  # the local runtime's warm parent
        if prepare is not None:  # in the background: registering and claiming need not wait
            threading.Thread(target=prepare, name="runtime-prepare", daemon=True).start()
        reg = self.register()
        self.flusher = SpoolFlusher(spool=self.spool, courier=self.courier, api=self.api,
                                    agent_name=self.identity.name, agent_id=reg.agent_id,
                                    interval=self.settings.spool_flush_seconds)
        self.flusher.start()
        next_heartbeat = 0.0
        next_claim = 0.0
        wait = cadence.claim_wait(reg.heartbeat_seconds, self.settings.long_poll_seconds)
        while not self.stop_event.is_set():
            self.wake.clear()  # before the capacity check: a slot freed after it wakes us
            now = time.monotonic()
            self._reap()
            if now >= next_claim:
                claimed = self._claim(reg, wait)
                if claimed is not None:  # the claim's query heartbeated the agent
                    next_heartbeat = now + reg.heartbeat_seconds
                next_claim = cadence.next_claim_at(now, claimed or 0, self.settings.poll_seconds)
                now = time.monotonic()
            if now >= next_heartbeat:
                next_heartbeat = now + reg.heartbeat_seconds
                self._call("heartbeat", lambda: self.api.heartbeat(reg.agent_id))
            self._publish_capacity()
            # Nothing to do before the next claim or heartbeat. A full agent sleeps until a slot
            # frees (wake) and claims then; at most poll_seconds without one (no network).
            if self.wake.wait(cadence.sleep_seconds(
                    time.monotonic(), [next_claim, next_heartbeat], self.settings.poll_seconds)):
                next_claim = min(next_claim, time.monotonic())  # a slot freed: claim now
        self._shutdown()

    def _call(self, name: str, fn: Callable[[], object]) -> object | None:
        try:
            return fn()
        except ApiError as exc:
            kind = "unavailable" if isinstance(exc, ApiUnavailable) else type(exc).__name__
            self.metrics.api_errors.labels(name, kind).inc()
            log.warning("%s failed: %s", name, exc)
            return None

    def _claim(self, reg: Registration, wait: float) -> int | None:
        """Attempts claimed; None when no claim was made (no capacity) or it failed."""
        cpu_free, _ = self.capacity.free()
        if cpu_free < 1:
            return None
        # One at a time: each claim is checked against what is left after the previous one.
        # A claim whose answer is lost (a reset connection) may still have been granted: the
        # next claim sends the same id, and gets it back instead of letting its lease lapse.
        if self._claim_id is None:
            self._claim_id = uuid.uuid4().hex
        claim_id = self._claim_id
        items = self._call("claim", lambda: self.api.claim(reg.agent_id, 1, wait=wait,
                                                           claim_id=claim_id))
        if items is None:
            return None
        self._claim_id = None
        started = 0
        for item in items:  # type: ignore[attr-defined]
            claim = Claim.from_api(item)
            if claim.attempt_id in self.runners:  # already ours and running
                continue
            self._start_runner(claim, reg)
            started += 1
        return started

    def _start_runner(self, claim: Claim, reg: Registration) -> None:
        self.metrics.claims.inc()
        reason = self.capacity.reserve(claim.attempt_id, claim.demand())
        if reason is not None:
            # The control plane routed more than fits: do not run it, let the lease lapse so it
            # is retried elsewhere, and say why.
            log.error("attempt %s does not fit this agent (%s): not starting it",
                      claim.attempt_id, reason)
            self._call("events", lambda: self.api.send_events(
                claim.attempt_id, claim.fencing_token,
                [{"kind": "log", "message": f"agent capacity exceeded: {reason}",
                  "data": {"pending_reason": f"agent capacity: {reason}"}}]))
            return
        runner = AttemptRunner(
            claim, api=self.api, runtime=self.runtime, capacity=self.capacity, metrics=self.metrics,
            settings=self.runner_settings, heartbeat_seconds=reg.heartbeat_seconds,
            shutdown=self.stop_event, store_factory=self.store_factory, courier=self.courier,
        )
        self.runners[claim.attempt_id] = runner
        log.info("claimed attempt %s (operation %s, #%d, token %d)", claim.attempt_id,
                 claim.operation_id, claim.number, claim.fencing_token)
        runner.start()

    def _reap(self) -> None:
        for attempt_id, runner in list(self.runners.items()):
            if not runner.is_alive():
                runner.join()
                del self.runners[attempt_id]

    def _publish_capacity(self) -> None:
        cpu_free, acc_free = self.capacity.free()
        self.metrics.set_capacity(self.capacity.cpu_slots, cpu_free, self.capacity.accelerator_count,
                                  acc_free)

    def _shutdown(self) -> None:
        """Stop claiming; runners see the stop event, stop their workloads and exit.

        Leases are not released early: the control plane moves the work after expiry and the
        next attempt resumes from the last complete checkpoint. Events still spooled get one
        last delivery try within the grace period; what is left waits on disk for the next start.
        """
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        for runner in list(self.runners.values()):
            runner.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.flusher is not None:
            self.flusher.stop()
            self.flusher.join(timeout=max(0.0, deadline - time.monotonic()))
            if not self.flusher.is_alive():
                try:
                    self.flusher.pass_once(deadline)
                except Exception:  # stopping anyway: the spool keeps what is left
                    log.exception("last spool flush failed")
        self.spool.close()
        self.api.close()
