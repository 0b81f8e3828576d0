"""The submit route's fast path (controlplane/api/fast_submit.py) answers the ordinary case as
the route does, and hands everything else to the route, which answers it once (no database:
the group's statement is replaced by a recorder)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from prometheus_client import REGISTRY

from controlplane.api import fast_submit, group_commit
from controlplane.api.app import Settings, create_app
from controlplane.store import Conflict
from controlplane.store import auth as auth_store
from controlplane.store.submissions import SubmitItem, SubmitResult

USER = auth_store.Principal("user", "00000000-0000-0000-0000-000000000001", "ml-team")
AUTH = {"Authorization": "Bearer a-user-token-long-enough"}
SPEC = {"name": "x", "workload": {"kind": "train", "image": "127.0.0.1:5000/ml/trainer:1.0"}}


class _Pool:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> Any:
        yield object()


class Store:
    """Stands in for submit_many: records each group; answers created, or fails."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail: Exception | None = None

    async def __call__(self, conn: Any, items: list[SubmitItem]) -> list[Any]:
        self.calls.append([i.key for i in items])
        if self.fail is not None:
            raise self.fail
        now = datetime(2026, 1, 1, tzinfo=UTC)
        return [SubmitResult({"id": f"00000000-0000-0000-0000-{n:012d}", "spec": i.spec,
                              "state": "accepted", "state_reason": "submission committed",
                              "pending_reason": None, "attempt_count": 0,
                              "idempotency_key": i.key, "current_attempt_id": None,
                              "pinned_agent": None, "created_at": now, "updated_at": now,
                              "result": None, "last_error": None, "first_error": None},
                             created=True) for n, i in enumerate(items)]


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    s = Store()
    monkeypatch.setattr(group_commit, "submit_many", s)
    return s


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch, store: Store) -> FastAPI:
    async def lookup(conn: Any, token: str) -> auth_store.Principal:
        return USER
    monkeypatch.setattr(auth_store, "lookup", lookup)
    app = create_app(Settings(dsn="postgresql://unused@127.0.0.1:1/none"))
    app.state.pool = _Pool()
    return app


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each submission: True when the fast path answered it, False when the route did."""
    seen: list[bool] = []
    real = fast_submit.FastSubmit._answer

    async def spy(self: Any, scope: dict[str, Any], body: bytes) -> Any:
        out = await real(self, scope, body)
        seen.append(out is not None)
        return out
    monkeypatch.setattr(fast_submit.FastSubmit, "_answer", spy)
    return seen


def post(app: FastAPI, *bodies: tuple[dict[str, Any], dict[str, str]]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return [await client.post("/v1/operations", json=b, headers=h) for b, h in bodies]
    return asyncio.run(go())


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_fast_answer_is_the_routes(app: FastAPI, store: Store,
                                       answered: list[bool]) -> None:
    # the first request looks its token up (the route); the second finds it cached (fast)
    labels = {"route": "/v1/operations", "method": "POST", "code": "201"}
    before = sample("controlplane_http_requests_total", labels)
    slow, fast = post(app, (SPEC, {**AUTH, "Idempotency-Key": "k"}),
                      (SPEC, {**AUTH, "Idempotency-Key": "k"}))
    assert answered == [False, True]
    assert (slow.status_code, fast.status_code) == (201, 201)
    assert slow.content == fast.content  # same key, same row: byte for byte
    assert slow.headers["content-type"] == fast.headers["content-type"] == "application/json"
    assert slow.headers["content-length"] == fast.headers["content-length"]
    assert store.calls == [["k"], ["k"]]
    # counted under the route's template either way
    assert sample("controlplane_http_requests_total", labels) == before + 2


@pytest.mark.parametrize("body,headers,status", [
    ({"workload": SPEC["workload"]}, {"Idempotency-Key": "k"}, 422),  # no name
    (SPEC, {}, 422),  # no Idempotency-Key
    ({**SPEC, "name": "a\u0000b"}, {"Idempotency-Key": "k"}, 422),  # NUL (an escape)
    (SPEC, {"Idempotency-Key": "k" * 201}, 422),  # too long a key
])
def test_what_the_fast_path_does_not_take_the_route_answers(
        app: FastAPI, store: Store, answered: list[bool], body: dict[str, Any],
        headers: dict[str, str], status: int) -> None:
    post(app, (SPEC, {**AUTH, "Idempotency-Key": "warm"}))  # the token is now cached
    r = post(app, (body, {**AUTH, **headers}))[0]
    assert r.status_code == status, r.text
    assert answered == [False, False]
    assert store.calls == [["warm"]]


def test_a_failed_commit_is_answered_by_the_route_without_a_second_commit(
        app: FastAPI, store: Store, answered: list[bool]) -> None:
    post(app, (SPEC, {**AUTH, "Idempotency-Key": "warm"}))
    labels = {"project": "ml-team", "queue": "default", "result": "rejected"}
    before = sample("controlplane_submissions_total", labels)
    store.fail = Conflict("Idempotency-Key 'k' was already used for a different payload")
    r = post(app, (SPEC, {**AUTH, "Idempotency-Key": "k"}))[0]
    assert r.status_code == 409 and "different payload" in r.text
    assert store.calls == [["warm"], ["k"]]  # one commit, not one per path
    assert sample("controlplane_submissions_total", labels) == before + 1
    # an unavailable database: the one retry, then the route's 503, still no second round
    store.fail = psycopg.OperationalError("server closed the connection unexpectedly")
    r = post(app, (SPEC, {**AUTH, "Idempotency-Key": "k2"}))[0]
    assert r.status_code == 503
    assert store.calls == [["warm"], ["k"], ["k2"], ["k2"]]
    assert answered == [False, False, False]


def test_a_cached_token_without_the_user_role_is_left_to_the_route(
        monkeypatch: pytest.MonkeyPatch, app: FastAPI, store: Store,
        answered: list[bool]) -> None:
    agent = auth_store.Principal("agent", "00000000-0000-0000-0000-000000000002", "ml-team")

    async def lookup(conn: Any, token: str) -> auth_store.Principal:
        return agent
    monkeypatch.setattr(auth_store, "lookup", lookup)
    # the first looks the token up (the route), the second finds it cached: refused both times
    first, second = post(app, (SPEC, {**AUTH, "Idempotency-Key": "k"}),
                         (SPEC, {**AUTH, "Idempotency-Key": "k"}))
    assert (first.status_code, second.status_code) == (403, 403), second.text
    assert answered == [False, False] and store.calls == []


DIGEST = "ab" * 32
DATASET = {"name": "rows", "sha256": DIGEST, "uri": "s3://ml-artifacts/datasets/churn/rows.csv"}


def test_declared_datasets_are_stored_and_returned(app: FastAPI, store: Store) -> None:
    plain, declared = post(app, (SPEC, {**AUTH, "Idempotency-Key": "plain"}),
                           ({**SPEC, "datasets": [DATASET]}, {**AUTH, "Idempotency-Key": "ds"}))
    assert (plain.status_code, declared.status_code) == (201, 201), declared.text
    assert plain.json()["datasets"] == [] and declared.json()["datasets"] == [DATASET]
    assert store.calls == [["plain"], ["ds"]]


@pytest.mark.parametrize("datasets,loc,why", [
    ([{**DATASET, "sha256": "AB" * 32}], ["body", "datasets", 0, "sha256"], "pattern"),
    ([DATASET, {**DATASET, "uri": "datasets/other.csv"}], ["body", "datasets"],
     "datasets[1].name: duplicate dataset name 'rows' (also datasets[0])"),
    ([{**DATASET, "uri": "s3://ml-artifacts/checkpoints/op/x"}], ["body", "datasets", 0, "uri"],
     "not an s3 URI of the artifact bucket: the object is not under datasets/"),
    ([{**DATASET, "uri": "https://example.org/datasets/rows.csv"}],
     ["body", "datasets", 0, "uri"], "scheme 'https' is not s3"),
    ([{"name": "rows", "sha256": DIGEST}], ["body", "datasets"],
     "datasets[0].uri: an operation reads every dataset it declares at start; 'rows' has no uri"),
    ([{**DATASET, "name": f"d{i}"} for i in range(65)], ["body", "datasets"], "at most 64"),
])
def test_bad_dataset_declarations_are_422s_naming_the_field(
        app: FastAPI, store: Store, datasets: list[dict[str, Any]], loc: list[Any],
        why: str) -> None:
    post(app, (SPEC, {**AUTH, "Idempotency-Key": "warm"}))  # the fast path would take it next
    r = post(app, ({**SPEC, "datasets": datasets}, {**AUTH, "Idempotency-Key": "k"}))[0]
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == loc and why in error["msg"], error
    assert store.calls == [["warm"]]  # nothing committed
