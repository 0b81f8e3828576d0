"""The one-game-day-at-a-time lock of a cloud environment: a Kubernetes
``coordination.k8s.io/v1`` Lease in the control-plane namespace.

A file lock (``environments.schedule.GameDayLock``) only guards one filesystem; game-day pods each
have their own, so in the cloud the lock lives in the cluster. Same interface as GameDayLock
(``acquire(info)`` raises ScheduleError when held, ``release()``), so ``gameday run`` uses either.

- holder = the run id; the run's details go in an annotation (who holds it, where its evidence
  goes) so a refused run can say who is in the way;
- renewed by a background thread every ``lease_seconds / 3`` while the game day runs;
- taken over only when expired (``renewTime + leaseDurationSeconds`` in the past: its pod died
  without releasing); never from a live holder;
- released at the end by clearing ``holderIdentity`` (an update: no delete permission needed);
- every write is a replace carrying the ``resourceVersion`` that was read, so two runners racing
  for the same expired Lease cannot both win (the loser gets 409 Conflict and is refused).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from environments.schedule import ScheduleError

LEASE_NAME = "gameday-lock"
INFO_ANNOTATION = "gameday.platform/run"
DEFAULT_LEASE_SECONDS = 120


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class LeaseLock:
    """``api`` is a ``kubernetes.client.CoordinationV1Api`` (or anything with its
    read/create/replace_namespaced_lease methods: the tests pass a stub)."""

    api: Any
    namespace: str
    holder: str
    name: str = LEASE_NAME
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    clock: Callable[[], datetime] = _now
    renew_every: float | None = None  # default lease_seconds / 3; 0 = no renewal thread
    lost: str | None = None  # set by the renewal thread when the Lease is no longer ours
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _held: bool = False

    # -- acquire / release ------------------------------------------------------------------
    def acquire(self, info: dict[str, Any]) -> None:
        now = self.clock()
        spec = client.V1LeaseSpec(holder_identity=self.holder, acquire_time=now, renew_time=now,
                                  lease_duration_seconds=self.lease_seconds, lease_transitions=0)
        meta = client.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                   labels={"app.kubernetes.io/component": "gameday"},
                                   annotations={INFO_ANNOTATION: json.dumps(info, default=str)})
        try:
            self.api.create_namespaced_lease(self.namespace, client.V1Lease(metadata=meta, spec=spec))
        except ApiException as exc:
            if exc.status != 409:
                raise ScheduleError(self._api_error("create", exc)) from None
            self._take_over_if_expired(info, now)
        self._held = True
        self._start_renewal()

    def _take_over_if_expired(self, info: dict[str, Any], now: datetime) -> None:
        current = self._read()
        spec = current.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        if holder and holder != self.holder and not self._expired(spec, now):
            who = (current.metadata.annotations or {}).get(INFO_ANNOTATION) or holder
            raise ScheduleError(
                f"a game day is already running on this environment (Lease "
                f"{self.namespace}/{self.name} held by {who}, renewed "
                f"{spec.renew_time.isoformat() if spec.renew_time else 'never'}); "
                "game days never overlap")
        transitions = (spec.lease_transitions or 0) + (1 if holder and holder != self.holder else 0)
        current.spec = client.V1LeaseSpec(
            holder_identity=self.holder, acquire_time=now, renew_time=now,
            lease_duration_seconds=self.lease_seconds, lease_transitions=transitions)
        current.metadata.annotations = {**(current.metadata.annotations or {}),
                                        INFO_ANNOTATION: json.dumps(info, default=str)}
        self._replace(current, "take over")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if not self._held:
            return
        self._held = False
        try:
            current = self._read()
        except ScheduleError:
            return  # nothing we can clear; it expires by itself after lease_seconds
        if current.spec is None or current.spec.holder_identity != self.holder:
            return  # somebody else's now: never release another run's lock
        current.spec.holder_identity = None
        current.spec.renew_time = self.clock()
        self._replace(current, "release")

    # -- renewal ----------------------------------------------------------------------------
    def renew(self) -> None:
        """One renewal; sets ``lost`` (and stops renewing) when the Lease is not ours any more."""
        try:
            current = self._read()
            if current.spec is None or current.spec.holder_identity != self.holder:
                holder = current.spec.holder_identity if current.spec else None
                self.lost = f"Lease {self.namespace}/{self.name} is now held by {holder!r}"
                self._stop.set()
                return
            current.spec.renew_time = self.clock()
            self._replace(current, "renew")
        except ScheduleError:
            # A missed renewal is not yet a lost lock (the API may be briefly away during a
            # fault); the next one retries well before leaseDurationSeconds runs out.
            pass

    def _start_renewal(self) -> None:
        every = self.lease_seconds / 3 if self.renew_every is None else self.renew_every
        if every <= 0:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(every):
                self.renew()

        self._thread = threading.Thread(target=loop, name="gameday-lease-renewal", daemon=True)
        self._thread.start()

    # -- API --------------------------------------------------------------------------------
    def _expired(self, spec: Any, now: datetime) -> bool:
        renewed = spec.renew_time or spec.acquire_time
        if renewed is None:
            return True
        if renewed.tzinfo is None:
            renewed = renewed.replace(tzinfo=UTC)
        return renewed + timedelta(seconds=spec.lease_duration_seconds or 0) < now

    def _read(self) -> Any:
        try:
            return self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            raise ScheduleError(self._api_error("read", exc)) from None

    def _replace(self, lease: Any, what: str) -> None:
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:
                raise ScheduleError(
                    f"Lease {self.namespace}/{self.name}: another game day changed it while this "
                    f"one tried to {what} it (409 Conflict); game days never overlap") from None
            raise ScheduleError(self._api_error(what, exc)) from None

    def _api_error(self, what: str, exc: ApiException) -> str:
        hint = (" (the game-day Role needs leases get/create/update in this namespace)"
                if exc.status == 403 else "")
        return (f"Lease {self.namespace}/{self.name}: {what} failed: HTTP {exc.status} "
                f"{exc.reason}{hint}")
