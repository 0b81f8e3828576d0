"""The training workload's tracking sink: params, metrics and artifacts to an MLflow tracking
server over its REST API, on a thread of its own, so tracking that blinks never stops training.

What the trainer is promised (docs/tracking.md; the tracking-outage game day checks each):
- ``log_metric`` / ``log_params`` / ``log_artifact`` never wait for MLflow: they hand over to a
  bounded buffer (controlplane/workload/tracking_buffer.py) and return;
- no metric point lost: a point leaves the buffer only once MLflow acknowledged its batch;
  a batch whose answer was lost is sent again as the same rows (key, step, timestamp);
- one run per attempt: the run carries the tag ``gameday.attempt_id``, looked up before any
  create, and again before a create is retried after an answer that never came;
- every run terminated: ``finish`` sends what is left, then FINISHED/FAILED, waiting for
  tracking at most ``finish_wait_seconds`` (the one bounded wait training ever does); what
  could not be delivered by then is counted in the summary, never silently lost.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from controlplane import defects
from controlplane.workload.mlflow_rest import (
    ATTEMPT_TAG,
    MlflowRest,
    TrackingRefused,
    TrackingUnavailable,
)
from controlplane.workload.tracking_buffer import MetricPoint, PointBuffer, TrackingPolicy

FINISHED, FAILED = "FINISHED", "FAILED"


@dataclass
class TrackingSummary:
    """What happened to what the trainer handed over (the workload's tracking ledger)."""

    attempt_id: str
    run_id: str | None
    experiment_id: str | None
    points_logged: int  # handed over by the trainer: the points it was acknowledged
    points_acknowledged: int  # taken by MLflow
    points_dropped: int  # pushed out by the buffer bound
    points_undelivered: int  # still buffered when the finish wait ran out
    points_refused: int  # a batch MLflow refused (4xx)
    runs_found_at_lookup: int  # >1: a duplicate run for this attempt existed already
    status_sent: str | None  # FINISHED/FAILED once MLflow took it, else None
    unavailable_calls: int
    unavailable_seconds: float  # summed outages seen by the sender
    finish_wait_seconds: float  # how long training waited for tracking at its end
    longest_log_call_seconds: float  # the longest any log_* call held the trainer
    errors: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Event = Callable[[str, dict[str, Any]], None]


class TrackingSink:
    def __init__(self, client: MlflowRest, *, experiment: str, attempt_id: str, run_name: str,
                 policy: TrackingPolicy | None = None, on_event: Event | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 rng: random.Random | None = None) -> None:
        self.policy = policy or TrackingPolicy()
        self.policy.validate()
        self.client, self.experiment, self.attempt_id = client, experiment, attempt_id
        self.run_name = run_name
        self._event = on_event or (lambda _m, _d: None)
        self._clock, self._wall_ms = clock, wall_ms
        self._rng = rng or random.SystemRandom()
        self._buffer = PointBuffer(self.policy.max_points)
        self._params: dict[str, str] = {}
        self._params_sent = True
        self._artifacts: list[tuple[str, bytes]] = []
        self._status: str | None = None  # asked for by finish
        self._status_sent: str | None = None
        self._given_up = False
        self._end_tried = False  # the seeded defect tracking-finish-once's one try
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="tracking-sink", daemon=True)
        self._experiment_id: str | None = None
        self._run: dict[str, Any] | None = None
        self._found = 0
        self._unavailable_calls = 0
        self._unavailable_s = 0.0
        self._down_since: float | None = None
        self._errors: list[str] = []
        self._waited = 0.0
        self._longest_call = 0.0
        self._start_ms = wall_ms()

    # -- the trainer's side: never blocks on MLflow ------------------------------------------
    def start(self, params: dict[str, Any] | None = None) -> None:
        self.log_params(params or {})
        self._thread.start()

    def log_params(self, params: dict[str, Any]) -> None:
        began = self._clock()
        with self._cv:
            self._params.update({k: str(v) for k, v in params.items()})
            self._params_sent = not self._params
            self._cv.notify()
            self._held(began)

    def log_metric(self, key: str, value: float, step: int) -> None:
        began = self._clock()
        with self._cv:
            self._buffer.add(MetricPoint(key, float(value), int(step), self._wall_ms()))
            if len(self._buffer) >= self.policy.batch_points:
                self._cv.notify()
            self._held(began)

    def log_artifact(self, name: str, data: bytes) -> None:
        began = self._clock()
        with self._cv:
            self._artifacts.append((name, data))
            self._cv.notify()
            self._held(began)

    def _held(self, began: float) -> None:
        """How long a log call held the trainer (the lock is shared with the sender, which
        never holds it across a network call): the evidence that training was not stalled."""
        self._longest_call = max(self._longest_call, self._clock() - began)

    def finish(self, status: str = FINISHED) -> TrackingSummary:
        """Deliver what is left and terminate the run; wait for that at most
        ``finish_wait_seconds``, then return the summary whatever tracking did."""
        if status not in (FINISHED, FAILED):
            raise ValueError(f"run status {status!r}: expected {FINISHED} or {FAILED}")
        began = self._clock()
        with self._cv:
            self._status = status
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(self.policy.finish_wait_seconds)
        with self._cv:
            self._given_up = True  # a sender still retrying stops at its next look
            self._cv.notify()
        self._waited = self._clock() - began
        return self.summary()

    def summary(self) -> TrackingSummary:
        with self._cv:
            return TrackingSummary(
                attempt_id=self.attempt_id,
                run_id=self._run["info"]["run_id"] if self._run else None,
                experiment_id=self._experiment_id, points_logged=self._buffer.logged,
                points_acknowledged=self._buffer.acknowledged,
                points_dropped=self._buffer.dropped,
                points_undelivered=len(self._buffer), points_refused=self._buffer.refused,
                runs_found_at_lookup=self._found, status_sent=self._status_sent,
                unavailable_calls=self._unavailable_calls,
                unavailable_seconds=round(self._unavailable_s, 3),
                finish_wait_seconds=round(self._waited, 3),
                longest_log_call_seconds=round(self._longest_call, 6), errors=self._errors[-10:])

    # -- the sender thread ---------------------------------------------------------------------
    def _run(self) -> None:
        retry = 0
        while True:
            with self._cv:
                if self._given_up or self._done():
                    return
                if not self._has_work():
                    self._cv.wait(self.policy.flush_seconds)
            try:
                self._step()
            except TrackingUnavailable as exc:
                self._note_down(str(exc))
                time.sleep(self._rng.uniform(0.0, self.policy.backoff_cap(retry)))
                retry += 1
                continue
            except TrackingRefused as exc:  # not retried: say so and go on with the rest
                self._errors.append(str(exc))
                self._event("tracking refused", {"error": str(exc)})
            self._note_up()
            retry = 0

    def _done(self) -> bool:
        return (self._status_sent is not None and not self._buffer and not self._artifacts
                and self._params_sent)

    def _has_work(self) -> bool:
        return (self._run is None or not self._params_sent or bool(self._buffer)
                or bool(self._artifacts) or self._status is not None)

    def _note_down(self, error: str) -> None:
        self._unavailable_calls += 1
        if self._down_since is None:
            self._down_since = self._clock()
            self._event("tracking unavailable, buffering", {"error": error,
                                                            "buffered": len(self._buffer)})

    def _note_up(self) -> None:
        if self._down_since is not None:
            away = self._clock() - self._down_since
            self._unavailable_s += away
            self._down_since = None
            self._event("tracking available again", {"away_seconds": round(away, 3),
                                                     "buffered": len(self._buffer)})

    def _step(self) -> None:
        """One unit of work; raises TrackingUnavailable when MLflow is away."""
        if self._run is None:
            self._ensure_run()
            return
        run_id = self._run["info"]["run_id"]
        if (self._status is not None and not self._end_tried
                and defects.enabled("tracking-finish-once")):
            self._end_once(run_id, self._status)
            return
        with self._cv:
            params = dict(self._params) if not self._params_sent else None
            batch = self._buffer.peek(self.policy.batch_points)
        if params:
            self.client.log_batch(run_id, params=params)
            with self._cv:
                self._params_sent = self._params == params
            return
        if batch:
            self._send(run_id, batch)
            return
        if self._artifacts:
            name, data = self._artifacts[0]
            self.client.put_artifact(self._run["info"]["artifact_uri"], name, data)
            with self._cv:
                self._artifacts.pop(0)
            return
        if self._status is not None and self._status_sent is None:
            if self._end_tried:  # the seeded defect's run end failed: never told again
                with self._cv:
                    self._given_up = True
                return
            self._terminate(run_id, self._status)

    def _send(self, run_id: str, batch: list[MetricPoint]) -> None:
        try:
            self.client.log_batch(run_id, metrics=[p.to_json() for p in batch])
        except TrackingUnavailable:
            if defects.enabled("tracking-flush-drops-batch"):
                with self._cv:
                    self._buffer.discard(batch)
            raise
        except TrackingRefused:
            with self._cv:  # counted apart: MLflow saw these points and said no
                self._buffer.refuse(batch)
            raise
        with self._cv:
            self._buffer.acknowledge(batch)

    def _terminate(self, run_id: str, status: str) -> None:
        """The run's end, sent once everything else was delivered; retried like the rest."""
        self.client.terminate(run_id, status, self._wall_ms())
        with self._cv:
            self._status_sent = status

    def _end_once(self, run_id: str, status: str) -> None:
        """SEEDED DEFECT tracking-finish-once: the run's end is sent as soon as training ends,
        ahead of what is still buffered, and only once: when tracking is away at that moment,
        the run stays RUNNING for good (the points still go)."""
        self._end_tried = True
        try:
            self._terminate(run_id, status)
        except TrackingUnavailable:
            self._errors.append("run status not sent: tracking unavailable at finish")
            raise

    def _ensure_run(self) -> None:
        """The attempt's run: looked up by its tag first, created only when none exists. A create
        whose answer was lost may have been committed, so its retry starts with the lookup too."""
        if self._experiment_id is None:
            self._experiment_id = self.client.experiment_id(self.experiment)
        found = self.client.runs_tagged(self._experiment_id, ATTEMPT_TAG, self.attempt_id)
        if found:
            with self._cv:
                self._found = max(self._found, len(found))
                self._run = found[0]
            return
        run = self.client.create_run(self._experiment_id, self.run_name, self._start_ms,
                                     {ATTEMPT_TAG: self.attempt_id})
        with self._cv:
            self._run = run
