"""The cloud game-day lock (environments/cloud/lock.py) against a stubbed Kubernetes
``CoordinationV1Api``: no cluster here. The stub keeps Lease objects as the API server would
(JSON, a resourceVersion bumped on every write, 409 on a create of an existing name or a
replace carrying a stale resourceVersion), so optimistic concurrency is exercised for real."""

from __future__ import annotations

import copy
import json
import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from environments.cloud.lock import INFO_ANNOTATION, LEASE_NAME, LeaseLock
from environments.schedule import ScheduleError

NS = "mlp-controlplane"
T0 = datetime(2025, 3, 4, 6, 0, tzinfo=UTC)


class StubLeaseApi:
    """read/create/replace_namespaced_lease of CoordinationV1Api, in memory."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self._ser = client.ApiClient()
        self._lock = threading.Lock()
        self.forbid: set[str] = set()

    def _model(self, data: dict[str, Any]) -> Any:
        return self._ser.deserialize(SimpleNamespace(data=json.dumps(data)), "V1Lease")

    def _check(self, verb: str) -> None:
        self.calls.append((verb, LEASE_NAME))
        if verb in self.forbid:
            raise ApiException(status=403, reason="Forbidden")

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        with self._lock:
            self._check("get")
            if (namespace, name) not in self.leases:
                raise ApiException(status=404, reason="Not Found")
            return self._model(copy.deepcopy(self.leases[(namespace, name)]))

    def create_namespaced_lease(self, namespace: str, body: Any, **_: Any) -> Any:
        with self._lock:
            self._check("create")
            data = self._ser.sanitize_for_serialization(body)
            key = (namespace, data["metadata"]["name"])
            if key in self.leases:
                raise ApiException(status=409, reason="AlreadyExists")
            data["metadata"]["resourceVersion"] = "1"
            self.leases[key] = data
            return self._model(copy.deepcopy(data))

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        with self._lock:
            self._check("update")
            data = self._ser.sanitize_for_serialization(body)
            current = self.leases.get((namespace, name))
            if current is None:
                raise ApiException(status=404, reason="Not Found")
            if data["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
            data["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
            self.leases[(namespace, name)] = data
            return self._model(copy.deepcopy(data))

    def spec(self) -> dict[str, Any]:
        return self.leases[(NS, LEASE_NAME)]["spec"]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def api() -> StubLeaseApi:
    return StubLeaseApi()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lock(api: StubLeaseApi, clock: Clock, holder: str, **kw: Any) -> LeaseLock:
    return LeaseLock(api, NS, holder, lease_seconds=120, clock=clock, renew_every=0, **kw)


def test_lease_lock_against_stubbed_kubernetes_api_acquires_by_creating_the_lease(
        api: StubLeaseApi, clock: Clock) -> None:
    a = lock(api, clock, "run-a")
    a.acquire({"run_id": "run-a", "run_dir": "/runs/run-a"})
    spec = api.spec()
    assert spec["holderIdentity"] == "run-a" and spec["leaseDurationSeconds"] == 120
    assert spec["renewTime"].startswith("2025-03-04T06:00:00")
    meta = api.leases[(NS, LEASE_NAME)]["metadata"]
    assert json.loads(meta["annotations"][INFO_ANNOTATION])["run_dir"] == "/runs/run-a"


def test_lease_lock_against_stubbed_kubernetes_api_refuses_while_held_and_names_the_holder(
        api: StubLeaseApi, clock: Clock) -> None:
    lock(api, clock, "run-a").acquire({"run_id": "run-a"})
    clock.now += timedelta(seconds=119)  # not expired yet
    with pytest.raises(ScheduleError, match="already running.*run-a.*never overlap"):
        lock(api, clock, "run-b").acquire({"run_id": "run-b"})
    assert api.spec()["holderIdentity"] == "run-a"


def test_lease_lock_against_stubbed_kubernetes_api_renewal_keeps_it_from_expiring(
        api: StubLeaseApi, clock: Clock) -> None:
    a = lock(api, clock, "run-a")
    a.acquire({"run_id": "run-a"})
    clock.now += timedelta(seconds=100)
    a.renew()
    assert api.spec()["renewTime"].startswith("2025-03-04T06:01:40")
    clock.now += timedelta(seconds=100)  # 200 s after acquire, 100 s after the renewal
    with pytest.raises(ScheduleError, match="already running"):
        lock(api, clock, "run-b").acquire({"run_id": "run-b"})
    assert a.lost is None


def test_lease_lock_against_stubbed_kubernetes_api_renews_in_the_background(
        api: StubLeaseApi) -> None:
    a = LeaseLock(api, NS, "run-a", lease_seconds=120, renew_every=0.05)
    a.acquire({"run_id": "run-a"})
    first = api.leases[(NS, LEASE_NAME)]["metadata"]["resourceVersion"]
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    while api.leases[(NS, LEASE_NAME)]["metadata"]["resourceVersion"] == first:
        assert datetime.now(UTC) < deadline, "the Lease was never renewed"
    a.release()
    assert api.spec().get("holderIdentity") is None


def test_lease_lock_against_stubbed_kubernetes_api_takes_over_only_an_expired_lease(
        api: StubLeaseApi, clock: Clock) -> None:
    lock(api, clock, "crashed-run").acquire({"run_id": "crashed-run"})  # its pod died: no release
    clock.now += timedelta(seconds=121)
    b = lock(api, clock, "run-b")
    b.acquire({"run_id": "run-b"})
    spec = api.spec()
    assert spec["holderIdentity"] == "run-b" and spec["leaseTransitions"] == 1
    assert spec["acquireTime"].startswith("2025-03-04T06:02:01")
    # the crashed run's late release (if it ever came back) must not free run-b's lock
    stale = lock(api, clock, "crashed-run")
    stale._held = True
    stale.release()
    assert api.spec()["holderIdentity"] == "run-b"


def test_lease_lock_against_stubbed_kubernetes_api_release_frees_it_for_the_next_run(
        api: StubLeaseApi, clock: Clock) -> None:
    a = lock(api, clock, "run-a")
    a.acquire({"run_id": "run-a"})
    a.release()
    assert api.spec().get("holderIdentity") is None
    a.release()  # idempotent: no second write
    assert [v for v, _ in api.calls].count("update") == 1
    lock(api, clock, "run-b").acquire({"run_id": "run-b"})  # immediately, no expiry wait
    assert api.spec()["holderIdentity"] == "run-b"


def test_lease_lock_against_stubbed_kubernetes_api_a_racing_taker_gets_a_conflict(
        api: StubLeaseApi, clock: Clock) -> None:
    lock(api, clock, "crashed-run").acquire({"run_id": "crashed-run"})
    clock.now += timedelta(seconds=300)
    real_replace = api.replace_namespaced_lease

    def racing_replace(name: str, namespace: str, body: Any, **kw: Any) -> Any:
        # another runner takes it over between our read and our replace
        current = api.read_namespaced_lease(name, namespace)
        current.spec.holder_identity = "run-c"
        real_replace(name, namespace, current)
        return real_replace(name, namespace, body, **kw)

    api.replace_namespaced_lease = racing_replace  # type: ignore[method-assign]
    with pytest.raises(ScheduleError, match="409 Conflict"):
        lock(api, clock, "run-b").acquire({"run_id": "run-b"})
    assert api.spec()["holderIdentity"] == "run-c"


def test_lease_lock_against_stubbed_kubernetes_api_reports_a_lost_lease(
        api: StubLeaseApi, clock: Clock) -> None:
    a = lock(api, clock, "run-a")
    a.acquire({"run_id": "run-a"})
    api.leases[(NS, LEASE_NAME)]["spec"]["holderIdentity"] = "someone-else"
    a.renew()
    assert a.lost and "someone-else" in a.lost


def test_lease_lock_against_stubbed_kubernetes_api_forbidden_says_which_permission(
        api: StubLeaseApi, clock: Clock) -> None:
    api.forbid = {"create"}
    with pytest.raises(ScheduleError, match="HTTP 403.*leases get/create/update"):
        lock(api, clock, "run-a").acquire({"run_id": "run-a"})
