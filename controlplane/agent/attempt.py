"""One claimed attempt, supervised on its own thread: resolve image, start, keep lease, report.

The thread holds the attempt's lease by heartbeat while the workload runs and is the only
place that reports the attempt's state, always with the claim's fencing token. It stops the
workload when:

* the control plane answers 409 (another owner holds a newer token: we were fenced off), also
  to the events it forwards;
* the lease *must* have expired by our own clock because heartbeats could not get through
  (self-fencing: the control plane may already have handed the work to another agent);
* the control plane asks to cancel; or the agent shuts down.

A success is reported only after the completion manifest of the artifacts has been read back
and verified; while the store is unavailable the runner keeps the lease and keeps trying.

Events go through a ``Courier``: what the API cannot take now waits in the agent's on-disk
spool (never in an unbounded list), and what is left when the thread ends (lease lost, agent
stopping) stays there for the agent's flusher.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from controlplane import defects, registry, storage
from controlplane.agent.api import AgentApi, ApiRejected, ApiUnavailable, LeaseLost
from controlplane.agent.capacity import Capacity, Demand
from controlplane.agent.delivery import EVENTS_PER_REQUEST, Courier, Delivery, coalesce_progress
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import ClaimKey
from controlplane.pipelines import manifest as pipeline_manifest
from controlplane.runtimes.base import (
    InvalidWorkload,
    LaunchSpec,
    Outcome,
    RunHandle,
    RunResult,
    Runtime,
)
from controlplane.workload.events import WorkloadEvent

log = logging.getLogger(__name__)
# After a failed heartbeat the next try comes this soon (at most one interval): 2/s per attempt
# against an API that refuses, and only until the lease runs out.
HEARTBEAT_RETRY_SECONDS = 0.5
# Spooled batches sent per supervision tick: a drained backlog must not delay heartbeats.
FLUSH_BATCHES_PER_TICK = 5
# How long a workload's closing event (artifact_written) may wait for its exit, to ride inside
# the final report; a workload still running after that has its events sent as usual.
CLOSING_EVENT_HOLD_SECONDS = 1.0
# How long progress alone may wait in memory before it is sent. Progress is a level (only the
# newest is kept), so a short attempt's progress rides inside its final report and a long
# one's goes at most about twice a second, not every tick. Any other event sends it at once.
PROGRESS_HOLD_SECONDS = 0.5


class Ending(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    START_FAILED = "start_failed"
    LEASE_LOST = "lease_lost"
    CANCELED = "canceled"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class Claim:
    attempt_id: str
    operation_id: str
    number: int
    fencing_token: int
    lease_seconds: float
    spec: dict[str, Any]
    project: str

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> Claim:
        return cls(str(item["attempt_id"]), str(item["operation_id"]), int(item["number"]),
                   int(item["fencing_token"]), float(item["lease_seconds"]), dict(item["spec"]),
                   str(item.get("project", "")))

    def key(self) -> ClaimKey:
        return ClaimKey(self.attempt_id, self.operation_id, self.fencing_token)

    def demand(self) -> Demand:
        resources = self.spec.get("resources") or {}
        acc = resources.get("accelerator") or {}
        return Demand(int(resources.get("cpu", 1)), acc.get("type"), int(acc.get("count", 0)))


@dataclass(frozen=True)
class RunnerSettings:
    s3_endpoint: str | None
    bucket: str
    registries: tuple[str, ...] = ()  # registries this agent may pull from (empty: any)
    insecure_registries: bool | None = None
    image_timeout: float = 3.0
    tick: float = 0.2
    stop_grace: float = 2.0


@dataclass
class _Observed:
    """What the runner learned from the workload's events (goes into the result)."""

    progress: dict[str, Any] | None = None
    last_checkpoint: str | None = None
    resumed_from_step: int | None = None
    torn_skipped: list[str] = field(default_factory=list)
    weights_sha256: str | None = None
    start_failed: str | None = None  # the workload's own reason it could not start


class AttemptRunner(threading.Thread):
    def __init__(self, claim: Claim, *, api: AgentApi, runtime: Runtime, capacity: Capacity,
                 metrics: AgentMetrics, settings: RunnerSettings, heartbeat_seconds: float,
                 shutdown: threading.Event, store_factory: Callable[[], storage.ObjectStore],
                 courier: Courier) -> None:
        super().__init__(name=f"attempt-{claim.attempt_id[:8]}", daemon=True)
        self.claim = claim
        self.api = api
        self.runtime = runtime
        self.capacity = capacity
        self.metrics = metrics
        self.settings = settings
        self.heartbeat_seconds = heartbeat_seconds
        self.shutdown = shutdown
        self.store_factory = store_factory
        self.courier = courier
        self.key = claim.key()
        self.handle: RunHandle | None = None
        self.ending: Ending | None = None
        self.observed = _Observed()
        self._outbox: list[dict[str, Any]] = []
        self._closing_seen_at: float | None = None  # artifact_written read, not yet sent
        self._progress_held_since: float | None = None  # only progress read, not yet sent
        # monotonic on purpose: a step of the wall clock must not move our self-fencing
        # deadline (which clock decides what: controlplane/clock.py)
        self._lease_deadline = time.monotonic() + claim.lease_seconds
        # The claim has just granted the lease: the first heartbeat is due one interval later,
        # so an attempt shorter than that sends none (one request less per short attempt).
        self._next_heartbeat = time.monotonic() + heartbeat_seconds
        self._pending_reason: str | None = None
        self._heartbeat_failing = False

    # --- thread body ------------------------------------------------------------------------

    def run(self) -> None:
        self.metrics.attempts_running.inc()
        self.courier.spool.own(self.key)  # this thread delivers the claim's events itself
        try:
            self.ending = self._run()
        except LeaseLost as exc:
            log.warning("attempt %s: lease lost (%s): stopping workload", self.claim.attempt_id, exc)
            self.ending = Ending.LEASE_LOST
        except Exception as exc:  # the runner must never leave a workload running unowned
            log.exception("attempt %s: agent error", self.claim.attempt_id)
            self.ending = Ending.FAILED
            try:
                self._final_report("failed", f"agent error: {type(exc).__name__}: {exc}",
                                   transient=True, stop_first=True)
            except LeaseLost:
                self.ending = Ending.LEASE_LOST
        finally:
            if self.handle is not None:
                # Also when the thread exits normally: the workload's death signal is tied to it.
                self.handle.stop(self.settings.stop_grace)
            self._spool_leftovers()
            self.courier.spool.disown(self.claim.attempt_id)
            self.capacity.release(self.claim.attempt_id)
            self.metrics.attempts_running.dec()
            self.metrics.attempts_finished.labels((self.ending or Ending.FAILED).value).inc()
            log.info("attempt %s (operation %s) ended: %s", self.claim.attempt_id,
                     self.claim.operation_id, self.ending)

    def _run(self) -> Ending:
        workload = self.claim.spec.get("workload") or {}
        image = str(workload.get("image", ""))
        pinned = self._resolve(image)
        if pinned is None:
            return Ending.START_FAILED
        # A claim granted as the agent began to stop (before the start, or while it ran: a
        # new warm parent takes about a second): the workload would be killed at once, with
        # the attempt recorded as started and no step or resume point to show for it (a game
        # day counts that as progress lost). Not reported: the lease expires and the
        # reconciler retries it, as for the agent's other attempts.
        if self.shutdown.is_set():
            return Ending.SHUTDOWN
        try:
            self.handle = self.runtime.start(self._launch_spec(workload, pinned))
        except InvalidWorkload as exc:
            self._start_failed("invalid_workload", str(exc), transient=False)
            return Ending.START_FAILED
        if self.shutdown.is_set():
            return Ending.SHUTDOWN  # run() stops the workload
        self._report_running(f"workload started ({self.runtime.name}, {pinned})")
        result = self._supervise()
        if result is None:
            return self.ending or Ending.SHUTDOWN
        # Read, not sent: the last events go inside the final report.
        self._observe(self.handle.drain_events())
        if result.outcome is Outcome.SUCCEEDED:
            return self._report_success(pinned)
        reason = result.reason
        if self.observed.start_failed:  # e.g. which dataset was missing or not as declared
            reason = f"{reason.rstrip(': ')}: {self.observed.start_failed}"
        self._final_report("failed", reason, transient=result.transient)
        return Ending.FAILED

    # --- start --------------------------------------------------------------------------------

    def _resolve(self, image: str) -> str | None:
        started = time.monotonic()
        try:
            ref = registry.ImageRef.parse(image)
            if self.settings.registries and ref.registry not in self.settings.registries:
                # Routing should never send this here; fail closed if it did.
                raise registry.ImageNotFound(
                    f"registry {ref.registry} is not one this agent may pull from "
                    f"({', '.join(self.settings.registries)})")
            pinned = registry.resolve_digest(image, timeout=self.settings.image_timeout,
                                             insecure=self.settings.insecure_registries)
        except registry.RegistryError as exc:
            self.metrics.image_resolve_seconds.labels(exc.reason).observe(time.monotonic() - started)
            self._start_failed(exc.reason, str(exc), transient=exc.transient)
            return None
        self.metrics.image_resolve_seconds.labels("ok").observe(time.monotonic() - started)
        return pinned

    def _launch_spec(self, workload: dict[str, Any], pinned: str) -> LaunchSpec:
        demand = self.claim.demand()
        return LaunchSpec(
            operation_id=self.claim.operation_id, attempt_id=self.claim.attempt_id,
            attempt_number=self.claim.number, project=self.claim.project,
            kind=str(workload.get("kind", "")), image=pinned, params=dict(workload.get("params") or {}),
            cpu=demand.cpu, accelerator_type=demand.accelerator_type,
            accelerator_count=demand.accelerator_count, s3_endpoint=self.settings.s3_endpoint,
            bucket=self.settings.bucket, timeout_seconds=self.claim.spec.get("timeout_seconds"),
            labels=dict(self.claim.spec.get("labels") or {}),
            workload_class=self.claim.spec.get("workload_class"),
            interruptible=bool((self.claim.spec.get("placement") or {}).get("interruptible")),
            # a pipeline step's inputs, or the operation's declared datasets, read at start
            pipeline_inputs=(json.dumps(given, sort_keys=True) if (
                given := pipeline_manifest.given_inputs(self.claim.spec)) is not None else None),
        )

    def _start_failed(self, reason: str, message: str, *, transient: bool) -> None:
        kind = "transient" if transient else "deterministic"
        self._outbox.append({"kind": "start_failed", "message": message,
                             "data": {"reason": reason, "error_kind": kind}})
        self._forward_events()
        self._final_report("failed", f"{reason}: {message}", transient=transient)

    # --- supervise ----------------------------------------------------------------------------

    def _supervise(self) -> RunResult | None:
        assert self.handle is not None
        while True:
            result = self.handle.result()
            if result is not None:  # events not sent yet go with the final report
                return result
            # The heartbeat first, and no event calls while it fails: one that met a silent
            # connection would hold the heartbeat's next try back a whole deadline. The events
            # wait in the spool; the lease cannot wait.
            if time.monotonic() >= self._next_heartbeat:
                self._heartbeat()
                if self.ending is Ending.CANCELED:
                    return None
            if self._heartbeat_failing:
                self._spool_outbox()
            elif not self._holding_closing_event() and not self._holding_progress():
                self._forward_events()
            self._note_pending_reason()
            if time.monotonic() >= self._lease_deadline:
                raise LeaseLost(f"no successful heartbeat for {self.claim.lease_seconds:.1f}s: "
                                "lease expired by our clock")
            if self.shutdown.is_set():
                self.ending = Ending.SHUTDOWN
                return None
            # Not a plain sleep: an exit ends the wait, so the slot, the artifacts' check and
            # the final report do not wait out the rest of a tick (half a tick per attempt).
            self.handle.wait(self.settings.tick)

    def _heartbeat(self) -> None:
        sent = time.monotonic()
        self._next_heartbeat = sent + self.heartbeat_seconds
        try:
            reply = self.api.attempt_heartbeat(self.claim.attempt_id, self.claim.fencing_token,
                                               self.observed.progress)
        except ApiUnavailable as exc:
            self.metrics.api_errors.labels("attempt_heartbeat", "unavailable").inc()
            log.warning("attempt %s: heartbeat failed: %s", self.claim.attempt_id, exc)
            # soon again: the lease has only what the interval left of it (a silent try has
            # already waited its deadline, so this is at once then)
            self._next_heartbeat = sent + min(self.heartbeat_seconds, HEARTBEAT_RETRY_SECONDS)
            self._heartbeat_failing = True
            return
        self._heartbeat_failing = False
        # Measured from when we sent it: the server's clock started no earlier.
        self._lease_deadline = sent + self.claim.lease_seconds
        if reply.cancel:
            log.info("attempt %s: cancel requested: stopping workload", self.claim.attempt_id)
            self.ending = Ending.CANCELED

    def _report_running(self, reason: str) -> None:
        """Say the workload runs; retried while the API cannot be reached and the lease
        holds. A lost answer is harmless: the same report again is answered as a duplicate.
        Without the retry one reset connection failed an attempt whose workload was fine."""
        while True:
            try:
                self.api.report(self.claim.attempt_id, self.claim.fencing_token, "running", reason)
                return
            except ApiUnavailable as exc:
                self.metrics.api_errors.labels("report", "unavailable").inc()
                log.warning("attempt %s: running report not delivered yet: %s",
                            self.claim.attempt_id, exc)
            self._tend_lease("before the running report got through", on_shutdown=True)
            time.sleep(max(self.settings.tick, 0.2))

    def _note_pending_reason(self) -> None:
        assert self.handle is not None
        reason = self.handle.pending_reason()
        if reason != self._pending_reason:
            self._pending_reason = reason
            if reason:
                self._outbox.append({"kind": "log", "message": f"pending: {reason}",
                                     "data": {"pending_reason": reason}})

    def _forward_events(self) -> Delivery:
        """Deliver new events after the spooled ones; raises LeaseLost if the claim is refused."""
        if self.handle is not None:
            self._observe(self.handle.drain_events())
        if not self._outbox and not self.courier.spool.has_pending(self.claim.attempt_id):
            return Delivery.DONE
        batch, self._outbox = coalesce_progress(self._outbox), []
        return self.courier.forward(self.key, batch, max_batches=FLUSH_BATCHES_PER_TICK)

    def _spool_outbox(self) -> None:
        """New events straight to the spool, not sent: the flush after the next good heartbeat
        delivers them in order (to disk during an outage, not to a list in memory)."""
        if self.handle is not None:
            self._observe(self.handle.drain_events())
        if self._outbox:
            self.courier.spool.append(self.key, coalesce_progress(self._outbox))
            self._outbox = []  # only once on disk: a failed append keeps them in hand

    def _holding_closing_event(self) -> bool:
        """True while the workload's closing event waits to ride inside the final report.

        A workload writes ``artifact_written`` and exits, so its exit is usually a few ms
        behind. A tick that fell between the two sent the event in a request of its own: a
        third of short attempts, measured. The wait is bounded: a workload that stays up after
        it is not held back (CLOSING_EVENT_HOLD_SECONDS)."""
        if self.handle is not None:
            self._observe(self.handle.drain_events())
        if not any(e.get("kind") == "artifact_written" for e in self._outbox):
            return False
        if self._closing_seen_at is None:
            self._closing_seen_at = time.monotonic()
        return time.monotonic() - self._closing_seen_at < CLOSING_EVENT_HOLD_SECONDS

    def _holding_progress(self) -> bool:
        """True while the outbox holds nothing but progress, for at most
        PROGRESS_HOLD_SECONDS, and nothing of the claim waits in the spool.

        Each forward is a request and a transaction: a short attempt sent one for its progress
        alone (0.97 per attempt, measured), which the final report would have carried anyway.
        A held event is lost only if the agent itself dies within the hold; a workload's exit,
        a stop or a lost lease still sends it (with the report, or through the spool)."""
        if self.handle is not None:
            self._observe(self.handle.drain_events())
        if (not self._outbox or any(e.get("kind") != "progress" for e in self._outbox)
                or self.courier.spool.has_pending(self.claim.attempt_id)):
            self._progress_held_since = None
            return False
        now = time.monotonic()
        if self._progress_held_since is None:
            self._progress_held_since = now
        if now - self._progress_held_since < PROGRESS_HOLD_SECONDS:
            return True
        self._progress_held_since = None
        return False

    def _spool_leftovers(self) -> None:
        """Events still in memory when the thread ends go to the spool for the flusher."""
        try:
            self._spool_outbox()
        except Exception:  # never let this mask how the attempt ended
            log.exception("attempt %s: could not spool leftover events", self.claim.attempt_id)

    def _observe(self, events: list[WorkloadEvent]) -> None:
        for event in events:
            data = event.data
            if event.kind == "progress":
                self.observed.progress = {"step": data.get("step"), "total": data.get("total")}
            elif event.kind == "checkpoint_written":
                self.observed.last_checkpoint = data.get("prefix")
            elif event.kind == "resumed":
                self.observed.resumed_from_step = data.get("from_step")
            elif event.kind == "checkpoint_skipped_torn":
                self.observed.torn_skipped.append(str(data.get("prefix")))
            elif event.kind == "artifact_written":
                self.observed.weights_sha256 = data.get("weights_sha256")
            elif event.kind == "start_failed":
                self.observed.start_failed = event.message[:500]
            self._outbox.append(event.to_json())

    # --- finish -------------------------------------------------------------------------------

    def _report_success(self, pinned: str) -> Ending:
        if defects.enabled("success-without-artifacts"):  # seeded defect: trust the exit code
            self._final_report("succeeded", "workload exited 0 (artifacts not verified)",
                               result={"image": pinned, "bucket": self.settings.bucket})
            return Ending.SUCCEEDED
        manifest, reason = self._verify_artifacts()
        if manifest is None:
            self.metrics.artifact_verify_failures.inc()
            self._final_report("failed", f"workload exited 0 but its artifacts are incomplete: {reason}",
                               transient=True)
            return Ending.FAILED
        pipeline = self.claim.spec.get("pipeline")
        given = pipeline_manifest.given_inputs(self.claim.spec)
        if given is not None:  # it must have consumed exactly what it was given, less the
            # sources it names as left out under its declared degrade policy
            why = pipeline_manifest.inputs_mismatch(given, manifest.get("inputs"),
                                                    manifest.get("sources"))
            if why is not None:
                self._final_report("failed", f"completion manifest: {why}", transient=False)
                return Ending.FAILED
        prefix = storage.artifact_prefix(self.claim.operation_id, self.claim.number)
        result = {
            "artifacts_prefix": prefix,
            "completion_manifest": prefix + storage.ARTIFACT_MANIFEST,
            "files": manifest["files"],
            "image": pinned,
            "bucket": self.settings.bucket,
            "weights_sha256": manifest["files"]["model.npy"]["sha256"],
            "resumed_from_step": self.observed.resumed_from_step,
            "last_checkpoint": self.observed.last_checkpoint,
            "torn_checkpoints_skipped": self.observed.torn_skipped,
        }
        if given is not None:  # the digests consumed: what its result was computed from
            result["inputs"] = sorted(manifest.get("inputs") or [])
        if pipeline is not None:  # what the control plane checks before downstream starts
            result["checks"] = manifest.get("checks") or {}
            if manifest.get("sources"):  # the datasets read at start, and any left out
                result["sources"] = manifest["sources"]
            if pipeline.get("side_effect"):
                result["side_effect"] = self._side_effect_once(pipeline["side_effect"],
                                                               result["inputs"])
        self._final_report("succeeded", "workload succeeded; completion manifest verified", result=result)
        return Ending.SUCCEEDED

    def _side_effect_once(self, effect: dict[str, Any], inputs: list[str]) -> dict[str, Any]:
        """A release step's registration under its stable action identity. The payload names
        what is registered by the digests it consumed, the same for every attempt, so a retry
        after a lost answer, or a later attempt, gets the first receipt instead of registering
        a second model. Retried while the API is unavailable and the lease holds."""
        payload = {"inputs": inputs}
        while True:
            try:
                answer = self.api.side_effect(self.claim.operation_id, effect["action_id"],
                                              effect["kind"], payload)
                return {"action_id": effect["action_id"], "receipt": answer.get("receipt"),
                        "created": answer.get("created")}
            except ApiUnavailable as exc:
                log.warning("attempt %s: side effect not recorded yet: %s",
                            self.claim.attempt_id, exc)
            self._tend_lease("before the side effect could be recorded")
            time.sleep(max(self.settings.tick, 0.2))

    def _verify_artifacts(self) -> tuple[dict[str, Any] | None, str | None]:
        """Read back COMPLETE.json and checksums, holding the lease while the store is down
        or slow."""
        if defects.enabled("result-not-read-back"):  # seeded defect: trust the workload's word
            return {"files": {"model.npy": {"sha256": self.observed.weights_sha256}}}, None
        store = self.store_factory()
        while True:
            try:
                return self._holding_lease(lambda: storage.verify_artifacts(
                    store, self.claim.operation_id, self.claim.number))
            except storage.StorageUnavailable as exc:
                log.warning("attempt %s: cannot verify artifacts yet: %s", self.claim.attempt_id, exc)
            self._tend_lease("while waiting for the object store", on_shutdown=True)
            time.sleep(self.settings.tick)

    def _holding_lease(self, call: Callable[[], Any]) -> Any:
        """Run a blocking call (object store reads) on a helper thread while this thread keeps
        heartbeating: a browned-out store answers each read late or only after retries, and a
        read of several seconds on this thread would let the lease run out although nothing
        is wrong with the attempt. Its result or exception is returned or raised here."""
        if defects.enabled("verify-starves-lease"):  # seeded defect: block the heartbeat
            return call()
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as is
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, name=f"store-{self.claim.attempt_id[:8]}", daemon=True).start()
        while not done.wait(self.settings.tick):
            # on LeaseLost the read goes on by itself and its answer is dropped: not ours now
            self._tend_lease("while reading the object store", on_shutdown=True)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def _final_report(self, state: str, reason: str, *, transient: bool = True,
                      result: dict[str, Any] | None = None, stop_first: bool = False) -> None:
        """Report a terminal state; retried while the API is unavailable and the lease holds."""
        if stop_first and self.handle is not None:
            self.handle.stop(self.settings.stop_grace)
        error = None
        if state == "failed":
            error = {"kind": "transient" if transient else "deterministic", "message": reason}
        # The last events ride inside the report (recorded in its transaction, before the state
        # changes); older spooled ones go first through the courier, as the control plane
        # refuses events once the attempt is terminal. While the API cannot take them they are
        # tried again, for one lease length at most and while the lease holds, before the
        # report goes without them.
        events_until = time.monotonic() + self.claim.lease_seconds
        carried: list[dict[str, Any]] | None = None
        try:
            while True:
                if carried is None:
                    carried = self._take_report_events()
                    if carried is None:
                        delivery = self._events_before_report()
                        if delivery is Delivery.MORE:
                            self._keep_lease_while_draining()
                            continue
                        if delivery is Delivery.UNAVAILABLE and time.monotonic() < events_until:
                            self._keep_lease_while_draining()
                            time.sleep(max(self.settings.tick, 0.2))
                            continue
                        carried = []
                try:
                    self.api.report(self.claim.attempt_id, self.claim.fencing_token, state, reason,
                                    error=error, result=result, events=carried)
                    carried = []
                    return
                except ApiUnavailable as exc:
                    # Sent again as is: a report that was committed but whose answer was lost
                    # is answered as a duplicate, so its events are recorded once either way.
                    self.metrics.api_errors.labels("report", "unavailable").inc()
                    log.warning("attempt %s: report not delivered yet: %s", self.claim.attempt_id, exc)
                except ApiRejected as exc:
                    self.metrics.api_errors.labels("report", "rejected").inc()
                    log.error("attempt %s: report rejected: %s", self.claim.attempt_id, exc)
                    return
                if time.monotonic() >= self._lease_deadline:
                    raise LeaseLost("lease expired before the final report got through")
                time.sleep(max(self.settings.tick, 0.5))
        finally:
            if carried:  # not delivered: back to the outbox, spooled when the thread ends
                self._outbox = carried + self._outbox

    def _take_report_events(self) -> list[dict[str, Any]] | None:
        """The attempt's last events to send inside its final report, or None when they must
        go through the courier first (older ones are spooled, or too many for one request)."""
        if self.handle is not None:
            self._observe(self.handle.drain_events())
        if self.courier.spool.has_pending(self.claim.attempt_id):
            return None
        batch = coalesce_progress(self._outbox)
        if len(batch) > EVENTS_PER_REQUEST:
            return None
        self._outbox = []
        return batch

    def _events_before_report(self) -> Delivery:
        try:
            return self._forward_events()
        except LeaseLost:
            raise
        except Exception:  # the report matters more; the events stay spooled for the flusher
            log.exception("attempt %s: events not forwarded before the final report",
                          self.claim.attempt_id)
            return Delivery.UNAVAILABLE

    def _keep_lease_while_draining(self) -> None:
        self._tend_lease("while delivering spooled events before the final report")

    def _tend_lease(self, doing: str, *, on_shutdown: bool = False) -> None:
        """While waiting on something: heartbeat when due, and give up (LeaseLost) once the
        lease has run out by our clock, or, if asked, once the agent is shutting down."""
        if time.monotonic() >= self._next_heartbeat:
            self._heartbeat()
        if time.monotonic() >= self._lease_deadline:
            raise LeaseLost(f"lease expired {doing}")
        if on_shutdown and self.shutdown.is_set():
            raise LeaseLost(f"agent shutting down {doing}")
