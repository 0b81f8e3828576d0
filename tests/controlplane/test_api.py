"""The HTTP contract against a real API process and a real PostgreSQL."""

from __future__ import annotations

import concurrent.futures as cf
import uuid

import httpx
import psycopg
import pytest

from environments.local.launch import ControlPlane

from .helpers import Api, spec


@pytest.fixture
def user(cp_stack: ControlPlane) -> Api:
    return Api(cp_stack.api_url, cp_stack.user_token)


@pytest.fixture
def agent(cp_stack: ControlPlane) -> Api:
    return Api(cp_stack.api_url, cp_stack.agent_token)


def test_submit_is_idempotent_per_key(user: Api, cp_stack: ControlPlane) -> None:
    first = user.submit(spec("a"), key="k-1")
    assert first.status_code == 201
    op = first.json()
    assert op["state"] == "accepted" and op["project"] == cp_stack.project
    again = user.submit(spec("a"), key="k-1")
    assert again.status_code == 200 and again.json()["id"] == op["id"]
    clash = user.submit(spec("b"), key="k-1")
    assert clash.status_code == 409
    assert "already used for a different payload" in clash.json()["detail"]
    # the same key in another project is a different operation
    other = Api(cp_stack.api_url, cp_stack.other_user_token).submit(spec("a"), key="k-1")
    assert other.status_code == 201 and other.json()["id"] != op["id"]


def test_concurrent_duplicates_create_exactly_one_operation(user: Api,
                                                            cp_stack: ControlPlane) -> None:
    key = f"race-{uuid.uuid4()}"

    def go(_: int) -> tuple[int, str]:
        r = httpx.post(f"{cp_stack.api_url}/v1/operations", json=spec("race"), timeout=10,
                       headers={"Authorization": f"Bearer {cp_stack.user_token}",
                                "Idempotency-Key": key})
        return r.status_code, r.json()["id"]

    with cf.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(go, range(32)))
    codes = sorted(c for c, _ in results)
    assert codes.count(201) == 1 and codes.count(200) == 31
    assert len({i for _, i in results}) == 1
    with psycopg.connect(cp_stack.dsn) as conn:
        n = conn.execute("SELECT count(*) FROM operations WHERE idempotency_key = %s",
                         (key,)).fetchone()[0]
    assert n == 1


@pytest.mark.parametrize("body,field", [
    ({"name": "x", "workload": {"image": "127.0.0.1:5000/a:1"}, "resources": {"cpu": 0}}, "cpu"),
    ({"name": "x", "workload": {"image": "127.0.0.1:5000/a:1"}, "bogus": 1}, "bogus"),
    ({"name": "x", "workload": {"image": "NOT AN IMAGE"}}, "image"),
    ({"name": "x", "workload": {"image": "a:1"}, "max_retries": -1}, "max_retries"),
    ({"name": "", "workload": {"image": "a:1"}}, "name"),
    ({"name": "x", "workload": {"image": "a:1", "params": {"blob": "x" * 20000}}}, "params"),
])
def test_invalid_payload_is_422_naming_the_field(user: Api, body: dict, field: str) -> None:
    r = user.submit(body)
    assert r.status_code == 422
    locs = [".".join(map(str, e["loc"])) for e in r.json()["detail"]]
    assert any(field in loc for loc in locs), locs


def test_unknown_queue_and_missing_key(user: Api) -> None:
    # every 422 has the schema's body: a list of errors, each locating its field
    r = user.submit(spec(queue="nope"))
    assert r.status_code == 422
    assert r.json()["detail"] == [{"type": "invalid_reference", "loc": ["body", "queue"],
                                   "msg": "queue 'nope' does not exist"}]
    r = user.c.post("/v1/operations", json=spec())
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["header", "idempotency-key"]]


def test_auth_roles_and_project_isolation(user: Api, agent: Api, cp_stack: ControlPlane) -> None:
    op = user.submit(spec()).json()
    assert httpx.get(f"{cp_stack.api_url}/v1/operations/{op['id']}").status_code == 401
    bad = Api(cp_stack.api_url, "not-a-real-token-at-all")
    assert bad.c.get(f"/v1/operations/{op['id']}").status_code == 401
    other = Api(cp_stack.api_url, cp_stack.other_user_token)
    assert other.c.get(f"/v1/operations/{op['id']}").status_code == 404
    assert other.c.get(f"/v1/operations/{op['id']}/events").status_code == 404
    assert all(o["id"] != op["id"] for o in other.c.get("/v1/operations").json()["items"])
    assert agent.submit(spec()).status_code == 403  # agents cannot submit
    agent_id = agent.register("a-1")
    assert user.c.post(f"/v1/agents/{agent_id}/claim", json={"max": 1}).status_code == 403
    assert user.c.get("/v1/agents").status_code == 403


def test_list_filters_and_paginates(user: Api) -> None:
    ids = [user.submit(spec(f"p{i}"), key=f"page-{i}").json()["id"] for i in range(7)]
    user.submit(spec("u", queue="urgent"))
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, "queue": "default"}
        if cursor:
            params["cursor"] = cursor
        page = user.c.get("/v1/operations", params=params).json()
        seen += [o["id"] for o in page["items"]]
        assert len(page["items"]) <= 3
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids  # stable order, no duplicates, nothing missing
    urgent = user.c.get("/v1/operations", params={"queue": "urgent"}).json()["items"]
    assert [o["name"] for o in urgent] == ["u"]
    assert user.c.get("/v1/operations", params={"state": "bogus"}).status_code == 422
    assert user.c.get("/v1/operations", params={"cursor": "zzz"}).status_code == 422


def test_cancel_and_events_record_every_transition(user: Api) -> None:
    op = user.submit(spec(placement={"dataset": "nowhere"})).json()
    r = user.c.post(f"/v1/operations/{op['id']}/cancel", json={"reason": "not needed"})
    assert r.status_code == 200 and r.json()["state"] == "canceled"
    again = user.c.post(f"/v1/operations/{op['id']}/cancel")
    assert again.status_code == 409 and "already canceled" in again.json()["detail"]
    evs = user.events(op["id"])
    transitions = [(e["from_state"], e["to_state"]) for e in evs if e["kind"] == "transition"]
    assert transitions[0] == (None, "accepted")
    assert transitions[-1][1] == "canceled"
    assert all(e["actor"] and e["time"] for e in evs)
    assert evs[-1]["reason"] == "not needed"


def test_side_effects_return_the_same_receipt(user: Api) -> None:
    op = user.submit(spec()).json()
    body = {"action_id": "register-model-v1", "kind": "model_registration",
            "payload": {"model": "m", "version": 1}}
    first = user.c.post(f"/v1/operations/{op['id']}/side-effects", json=body)
    second = user.c.post(f"/v1/operations/{op['id']}/side-effects", json=body)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["receipt"] == second.json()["receipt"]
    changed = user.c.post(f"/v1/operations/{op['id']}/side-effects",
                          json={**body, "payload": {"model": "other"}})
    assert changed.status_code == 409


def test_health_metrics_and_openapi(user: Api, cp_stack: ControlPlane) -> None:
    user.submit(spec())
    base = cp_stack.api_url
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{base}/readyz").status_code == 200
    text = httpx.get(f"{base}/metrics").text
    assert 'controlplane_submissions_total{project="ml-team",queue="default",result="accepted"}' in text
    assert "controlplane_http_request_duration_seconds_bucket" in text
    paths = httpx.get(f"{base}/openapi.json").json()["paths"]
    assert "/v1/operations" in paths and "/v1/attempts/{attempt_id}/report" in paths


def test_readyz_fails_when_database_unreachable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from environments.local.launch import gameday_cmd, spawn, wait_http
    from environments.local.pgserver import free_port

    port, dead = free_port(), free_port()
    p = spawn("api-nodb", gameday_cmd("controlplane", "api", "--port", str(port)), tmp_path,
              {"CONTROLPLANE_DSN": f"postgresql://postgres@127.0.0.1:{dead}/x"}, port)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", p)
        r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert r.status_code == 503 and "database" in r.json()["detail"]
    finally:
        p.stop()


def test_a_workload_class_fills_defaults_and_refuses_what_it_does_not_allow(user: Api) -> None:
    r = user.submit(spec("prep", workload_class="batch-preprocessing"))
    assert r.status_code == 201, r.text
    op = r.json()
    assert op["max_retries"] == 5 and op["resources"]["cpu"] == 4
    assert op["workload_class"] == "batch-preprocessing"
    r = user.submit(spec("prep", workload_class="batch-preprocessing", timeout_seconds=60))
    assert r.status_code == 422
    assert "timeout_seconds: not overridable for workload_class 'batch-preprocessing'" in r.text
    r = user.submit(spec("nb", workload_class="interactive-notebook",
                         placement={"interruptible": True}))
    assert r.status_code == 422 and "placement.interruptible" in r.text
