"""A claim whose answer is lost (a reset connection on a gray network) is not lost: the agent
asks again with the same claim id and gets the same attempt, token and a renewed lease,
instead of letting the lease lapse and the work wait for a retry. End to end through the API
and the reconciler on a real PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

from environments.local.launch import ControlPlane

from .helpers import Api, spec, wait_for, wait_state


def _claim(api: Api, agent_id: str, claim_id: str | None) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"max": 1}
    if claim_id is not None:
        body["claim_id"] = claim_id
    r = api.c.post(f"/v1/agents/{agent_id}/claim", json=body)
    r.raise_for_status()
    return r.json()["items"]


def test_the_same_claim_id_gets_back_what_a_lost_answer_granted(cp_stack: ControlPlane) -> None:
    user = Api(cp_stack.api_url, cp_stack.user_token)
    agent = Api(cp_stack.api_url, cp_stack.agent_token, agent_name="gray-agent")
    agent_id = agent.register("cpu-gray")
    op = user.submit(spec("redelivered")).json()
    wait_state(user, op["id"], "dispatched")
    first = wait_for(lambda: _claim(agent, agent_id, "claim-1"), what="the first claim")
    # its answer never reached the agent; it asks again with the same id
    time.sleep(0.5)
    again = _claim(agent, agent_id, "claim-1")
    assert [(c["attempt_id"], c["fencing_token"]) for c in again] == [
        (first[0]["attempt_id"], first[0]["fencing_token"])]
    assert again[0]["lease_expires_at"] > first[0]["lease_expires_at"]  # renewed
    # another claim id (a new claim) does not get it again, and nothing else is granted
    assert _claim(agent, agent_id, "claim-2") == []
    assert agent.report(again[0], "running").status_code == 200
    # once running, the old claim id gets nothing back either: it is not a start any more
    assert _claim(agent, agent_id, "claim-1") == []
    kinds = [e["kind"] for e in user.events(op["id"]) if e.get("attempt_id")]
    assert kinds.count("claimed") == 1 and kinds.count("claim_redelivered") == 1
    assert "lease_expired" not in kinds


def test_a_claim_id_of_another_agent_or_a_bad_one_gets_nothing(cp_stack: ControlPlane) -> None:
    user = Api(cp_stack.api_url, cp_stack.user_token)
    agent = Api(cp_stack.api_url, cp_stack.agent_token, agent_name="gray-agent")
    mine = agent.register("cpu-mine")
    op = user.submit(spec("mine")).json()
    wait_state(user, op["id"], "dispatched")
    granted = wait_for(lambda: _claim(agent, mine, "shared-id"), what="a claim")
    other = agent.register("cpu-other")
    assert _claim(agent, other, "shared-id") == []  # the id is the agent's, not global
    bad = agent.c.post(f"/v1/agents/{mine}/claim", json={"max": 1, "claim_id": "a b"})
    assert bad.status_code == 422 and "claim_id" in bad.text
    assert agent.report(granted[0], "running").status_code == 200
