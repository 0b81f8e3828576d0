"""Routing, admission, leases with fencing, retries, timeouts and circuit breakers, end to end
through the API and the reconciler process on a real PostgreSQL."""

from __future__ import annotations

import time

import httpx
import psycopg
import pytest

from environments.local.launch import ControlPlane

from .helpers import Api, claim_one, spec, wait_for, wait_state


@pytest.fixture
def user(cp_stack: ControlPlane) -> Api:
    return Api(cp_stack.api_url, cp_stack.user_token)


@pytest.fixture
def agent(cp_stack: ControlPlane) -> Api:
    return Api(cp_stack.api_url, cp_stack.agent_token, agent_name="agent-under-test")


@pytest.fixture
def admin(cp_stack: ControlPlane) -> Api:
    return Api(cp_stack.api_url, cp_stack.admin_token)


def test_no_eligible_destination_blocks_with_reason_then_unblocks(user: Api, agent: Api) -> None:
    agent.register("cpu-r1", region="region-1", datasets=["wiki"])
    op = user.submit(spec(placement={"regions": ["region-2"], "dataset": "wiki"})).json()
    blocked = wait_state(user, op["id"], "blocked")
    assert blocked["pending_reason"] == "no_eligible_destination"
    assert "region region-1 not in allowed ['region-2']" in blocked["state_reason"]
    time.sleep(1.0)
    assert user.op(op["id"])["state"] == "blocked"  # never placed somewhere ineligible
    # eligibility changes (a region-2 agent with the dataset registers): re-evaluated
    r2 = agent.register("cpu-r2", region="region-2", datasets=["wiki"])
    wait_state(user, op["id"], "dispatched")
    claim = claim_one(agent, r2)
    assert claim["operation_id"] == op["id"]
    routed = next(e for e in user.events(op["id"]) if e["to_state"] == "dispatched")
    assert routed["data"]["agent"] == "cpu-r2" and "cpu-r1" in routed["data"]["rejected"]


def test_queue_concurrency_and_priority(cp_stack: ControlPlane, user: Api, agent: Api) -> None:
    with psycopg.connect(cp_stack.dsn, autocommit=True) as c:
        c.execute("INSERT INTO queues (name, priority, concurrency) VALUES ('narrow', 0, 1)")
    a = user.submit(spec("n1", queue="narrow")).json()
    b = user.submit(spec("n2", queue="narrow")).json()
    agent_id = agent.register("cpu-1", cpu_slots=8)
    wait_state(user, a["id"], "dispatched")
    waiting = wait_for(lambda: (o := user.op(b["id"]))["pending_reason"] == "queue_concurrency"
                       and o, what="queue limit reason")
    assert waiting["state"] == "queued" and "concurrency limit (1)" in waiting["state_reason"]
    first = claim_one(agent, agent_id)
    agent.report(first, "running")
    agent.report(first, "succeeded", result={"ok": True})
    wait_state(user, b["id"], "dispatched")


def test_higher_priority_queue_goes_first(cp_stack: ControlPlane, user: Api, agent: Api) -> None:
    low = [user.submit(spec(f"low{i}")).json()["id"] for i in range(3)]
    high = user.submit(spec("high", queue="urgent")).json()["id"]
    agent_id = agent.register("cpu-1", cpu_slots=1)
    first = claim_one(agent, agent_id)
    assert first["operation_id"] == high
    assert all(user.op(i)["pending_reason"] == "capacity" for i in low)


def test_stale_agent_late_success_is_refused_after_lease_moved(cp_stack: ControlPlane, user: Api,
                                                               agent: Api) -> None:
    op = user.submit(spec()).json()
    old = agent.register("cpu-old")
    claim = claim_one(agent, old)
    assert agent.report(claim, "running").status_code == 200
    # the old agent goes silent (partition): no heartbeats; a new agent appears
    new = agent.register("cpu-new")
    wait_state(user, op["id"], "retrying", "queued", "dispatched", timeout=15)
    second = claim_one(agent, new, timeout=15)
    assert second["operation_id"] == op["id"]
    assert second["fencing_token"] > claim["fencing_token"]
    # the old agent wakes up and reports success with its old token: refused and counted
    late = agent.report(claim, "succeeded", result={"weights": "old"})
    assert late.status_code == 409 and "lost" in late.json()["detail"]
    assert agent.heartbeat(claim).status_code == 409
    agent.report(second, "running")
    assert agent.report(second, "succeeded", result={"weights": "new"}).status_code == 200
    final = wait_state(user, op["id"], "succeeded")
    assert final["result"] == {"weights": "new"}
    attempts = user.attempts(op["id"])
    assert [a["state"] for a in attempts] == ["lost", "succeeded"]  # one terminal success
    kinds = [e["kind"] for e in user.events(op["id"])]
    assert "lease_expired" in kinds and "stale_report_refused" in kinds
    metrics = httpx.get(f"{cp_stack.api_url}/metrics").text
    assert 'controlplane_stale_reports_total{agent="agent-under-test"} 2.0' in metrics


def test_transient_failures_retry_with_backoff_then_fail_keeping_first_error(
        user: Api, agent: Api) -> None:
    op = user.submit(spec(max_retries=2)).json()
    agent_ids = [agent.register(f"cpu-{i}", zone=f"zone-{i}") for i in range(3)]
    messages = ["registry unreachable: connection refused", "boom 2", "boom 3"]
    for msg in messages:
        claim = wait_for(lambda: next((c for a in agent_ids for c in agent.claim(a, 1)), None),
                         what="claim")
        r = agent.report(claim, "failed", error={"kind": "transient", "message": msg})
        assert r.status_code == 200
    final = wait_state(user, op["id"], "failed")
    assert "retries exhausted (2 allowed)" in final["state_reason"]
    assert "original error: registry unreachable" in final["state_reason"]
    assert final["first_error"]["message"] == messages[0]
    states = [e["to_state"] for e in user.events(op["id"]) if e["kind"] == "transition"]
    assert states.count("retrying") == 2 and states.count("dispatched") == 3


def test_deterministic_error_is_not_retried(user: Api, agent: Api) -> None:
    op = user.submit(spec(max_retries=5)).json()
    a = agent.register("cpu-1")
    claim = claim_one(agent, a)
    agent.report(claim, "failed", error={"kind": "deterministic",
                                         "message": "image not found: ml/trainer:nope"})
    final = wait_state(user, op["id"], "failed")
    assert "deterministic error: not retried" in final["state_reason"]
    assert len(user.attempts(op["id"])) == 1


def test_unclaimed_dispatch_is_rerouted_with_reason(user: Api, agent: Api) -> None:
    op = user.submit(spec()).json()
    agent.register("cpu-dead")  # registers, then never heartbeats nor claims
    wait_state(user, op["id"], "dispatched")
    live = agent.register("cpu-live")
    claim = wait_for(lambda: (agent.claim(live, 1) or [None])[0], timeout=20, what="reroute")
    assert claim["operation_id"] == op["id"]
    reroute = [e for e in user.events(op["id"]) if e["kind"] == "rerouted"]
    assert reroute and "cpu-dead did not claim" in reroute[0]["reason"]


def test_timeout_is_enforced(user: Api, agent: Api) -> None:
    op = user.submit(spec(timeout_seconds=1)).json()
    a = agent.register("cpu-1")
    claim = claim_one(agent, a)
    agent.report(claim, "running")
    for _ in range(4):  # keep the lease alive: only the timeout may end it
        agent.heartbeat(claim)
        time.sleep(0.5)
    final = wait_state(user, op["id"], "failed")
    assert "timeout" in final["state_reason"]
    assert agent.report(claim, "succeeded").status_code == 409


def test_cancel_tells_the_agent_to_stop(user: Api, agent: Api) -> None:
    op = user.submit(spec()).json()
    claim = claim_one(agent, agent.register("cpu-1"))
    agent.report(claim, "running")
    user.c.post(f"/v1/operations/{op['id']}/cancel")
    hb = agent.heartbeat(claim)
    assert hb.status_code == 200 and hb.json()["cancel"] is True
    assert agent.report(claim, "succeeded").status_code == 409


def test_circuit_breaker_stops_routing_to_a_failing_agent(user: Api, agent: Api,
                                                          admin: Api) -> None:
    bad = agent.register("cpu-bad")
    for i in range(3):
        user.submit(spec(f"f{i}", max_retries=0))
    for _ in range(3):
        c = claim_one(agent, bad)
        agent.report(c, "failed", error={"kind": "transient", "message": "node broken"})
    agents = {a["name"]: a for a in admin.c.get("/v1/agents").json()["items"]}
    assert agents["cpu-bad"]["breaker_open"] is True
    good = agent.register("cpu-good")
    op = user.submit(spec("after")).json()
    claim = claim_one(agent, good)
    assert claim["operation_id"] == op["id"]
    assert agent.claim(bad, 1) == []
    # operator closes the breaker by hand
    assert admin.c.post("/v1/agents/cpu-bad/breaker", json={"state": "closed"}).status_code == 200
    assert {a["name"]: a for a in admin.c.get("/v1/agents").json()["items"]}[
        "cpu-bad"]["breaker_open"] is False


def test_operator_route_override_pins_but_never_breaks_eligibility(user: Api, agent: Api,
                                                                   admin: Api) -> None:
    agent.register("cpu-plain")
    op = user.submit(spec(placement={"dataset": "wiki"})).json()
    wait_state(user, op["id"], "blocked")
    r = admin.c.post(f"/v1/operations/{op['id']}/route", json={"agent": "cpu-plain"})
    assert r.status_code == 409 and "dataset wiki not present" in r.json()["detail"]
    assert admin.c.post(f"/v1/operations/{op['id']}/route",
                        json={"agent": "ghost"}).status_code == 404
    # two eligible agents; ranking prefers the bigger one, the operator pins the smaller
    big = agent.register("cpu-big", cpu_slots=8)
    small = agent.register("cpu-small", cpu_slots=2)
    time.sleep(3.5)  # both stop heartbeating: the next operation waits (unavailable)
    pinned = user.submit(spec("pin-me")).json()
    wait_state(user, pinned["id"], "blocked")
    r = admin.c.post(f"/v1/operations/{pinned['id']}/route", json={"agent": "cpu-small"})
    assert r.status_code == 200 and r.json()["pinned_agent"] == "cpu-small"
    agent.c.post(f"/v1/agents/{big}/heartbeat")
    agent.c.post(f"/v1/agents/{small}/heartbeat")
    claim = claim_one(agent, small)
    assert claim["operation_id"] == pinned["id"]
    assert agent.claim(big, 1) == []
    assert any(e["kind"] == "route_override" for e in user.events(pinned["id"]))


def test_two_reconcilers_never_double_retry(cp_stack: ControlPlane, user: Api,
                                            agent: Api) -> None:
    cp_stack.start_reconciler(1)  # a second replica on the same database
    ops = [user.submit(spec(f"d{i}", max_retries=5)).json()["id"] for i in range(12)]
    a = agent.register("cpu-1", cpu_slots=16)
    claims = wait_for(lambda: (c := agent.claim(a, 16)) and c, what="claims")
    while len(claims) < 12:
        claims += agent.claim(a, 16)
        time.sleep(0.1)
    for c in claims:
        agent.report(c, "running")
    # the agent dies: every lease expires at about the same time, both reconcilers see them
    for op_id in ops:
        wait_for(lambda op_id=op_id: len(user.attempts(op_id)) >= 1 and
                 user.attempts(op_id)[0]["state"] == "lost", timeout=20, what="lease expiry")
    time.sleep(1.0)
    with psycopg.connect(cp_stack.dsn) as conn:
        rows = conn.execute(
            "SELECT operation_id, count(*) FILTER (WHERE kind = 'lease_expired'),"
            " count(*) FILTER (WHERE to_state = 'retrying')"
            " FROM events WHERE operation_id = ANY(%s::uuid[]) GROUP BY operation_id",
            (ops,)).fetchall()
        lost = conn.execute("SELECT count(*) FROM attempts WHERE state = 'lost'").fetchone()[0]
    assert len(rows) == 12 and lost == 12
    for _, expired, retried in rows:
        assert expired == 1 and retried == 1


def test_final_report_carries_its_events_and_is_idempotent(user: Api, agent: Api) -> None:
    op = user.submit(spec()).json()
    claim = claim_one(agent, agent.register("cpu-1"))
    assert agent.report(claim, "running").status_code == 200
    last = [{"kind": "progress", "data": {"step": 10, "total": 10}},
            {"kind": "artifact_written", "message": "artifacts at x", "data": {"prefix": "x"}}]
    first = agent.report(claim, "succeeded", result={"files": 2}, events=last)
    assert first.status_code == 200 and not first.json().get("duplicate")
    # the answer was lost: the same report again is a duplicate, its events are not recorded twice
    again = agent.report(claim, "succeeded", result={"files": 2}, events=last)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    events = user.events(op["id"])
    kinds = [e["kind"] for e in events]
    assert kinds.count("artifact_written") == 1 and kinds.count("progress") == 1
    # recorded before the state changed, in the same transaction
    ended = [i for i, e in enumerate(events) if e.get("to_state") == "succeeded"]
    assert ended == [len(events) - 1] and kinds.index("artifact_written") < ended[0]
    assert user.attempts(op["id"])[0]["progress"] == {"step": 10, "total": 10}
    # not the same report (another result, or another state): refused as before
    assert agent.report(claim, "succeeded", result={"files": 3}).status_code == 409
    assert agent.report(claim, "failed", events=last).status_code == 409
    assert [e["kind"] for e in user.events(op["id"])].count("artifact_written") == 1


def test_a_failed_report_repeated_is_a_duplicate_but_not_after_a_timeout(user: Api,
                                                                        agent: Api) -> None:
    op = user.submit(spec(max_retries=0)).json()
    claim = claim_one(agent, agent.register("cpu-1"))
    error = {"kind": "deterministic", "message": "bad params"}
    assert agent.report(claim, "failed", reason="bad params", error=error).status_code == 200
    again = agent.report(claim, "failed", reason="bad params", error=error)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert wait_state(user, op["id"], "failed")["state"] == "failed"
    # ended by the reconciler (timeout), the agent's own failure is not "the same report"
    op2 = user.submit(spec(timeout_seconds=1)).json()
    claim2 = claim_one(agent, agent.register("cpu-2"))
    agent.report(claim2, "running")
    for _ in range(4):
        agent.heartbeat(claim2)
        time.sleep(0.5)
    wait_state(user, op2["id"], "failed")
    assert agent.report(claim2, "failed", reason="x", error=error).status_code == 409
