"""Long-polling claims: ``POST /v1/agents/{id}/claim?wait=S`` (controlplane/api/claimwait.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time

import pytest

from controlplane.api.claimwait import ClaimWakeups
from controlplane.store.agents import NOTIFY_MAX_AGENTS, claimable_agents, claimable_payload
from environments.local.launch import ControlPlane

from .helpers import Api, spec

# timing-sensitive (waits measured in fractions of a second): run alone by make test
pytestmark = pytest.mark.serial


def test_payload_names_the_agents_or_everyone() -> None:
    assert claimable_agents(claimable_payload(["b", "a"])) == {"a", "b"}
    assert claimable_agents("") is None
    too_many = [f"agent-{i}" for i in range(NOTIFY_MAX_AGENTS + 1)]
    assert claimable_payload(too_many) == ""  # would overflow pg_notify: wake everyone


def test_wake_reaches_only_the_named_agents_waiters() -> None:
    async def scenario() -> None:
        w = ClaimWakeups("postgresql://unused")
        a, b = w.arm("a"), w.arm("b")
        w.wake({"a"})
        assert a.is_set() and not b.is_set()
        w.disarm("a", a)
        w.wake(None)
        assert b.is_set()
        w.disarm("b", b)
        w.wake(None)  # nobody left: nothing to do, no error
    asyncio.run(scenario())


def _claim(api: Api, agent_id: str, wait: float) -> tuple[list[dict[str, object]], float]:
    t0 = time.monotonic()
    r = api.c.post(f"/v1/agents/{agent_id}/claim", params={"wait": wait}, json={"max": 1})
    r.raise_for_status()
    return r.json()["items"], time.monotonic() - t0


@pytest.mark.timeout(90)
def test_a_waiting_claim_gets_work_as_soon_as_it_is_routed(cp_stack: ControlPlane) -> None:
    user = Api(cp_stack.api_url, cp_stack.user_token)
    agent = Api(cp_stack.api_url, cp_stack.agent_token)
    agent_id = agent.register("lp-1")
    items, took = _claim(agent, agent_id, 0.5)  # starts the API's listener
    assert items == []
    # Until its LISTEN connection is up the API answers at once (documented); on a busy
    # machine that takes more than the first claim. Once up, an idle claim waits its time out.
    deadline = time.monotonic() + 15
    while True:
        items, took = _claim(agent, agent_id, 1.0)
        assert items == []
        if took >= 0.9 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert took >= 0.9, "the API's listener never came up: every claim answered at once"
    with cf.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_claim, agent, agent_id, 8.0)  # client timeout: 10 s
        time.sleep(0.5)
        op = user.submit(spec("lp")).json()
        items, took = waiting.result(timeout=30)
    assert [i["operation_id"] for i in items] == [op["id"]]
    assert took < 5.0, f"claim woke only after {took:.1f}s: no wake-up reached it"


def test_without_wait_the_claim_answers_at_once(cp_stack: ControlPlane) -> None:
    agent = Api(cp_stack.api_url, cp_stack.agent_token)
    agent_id = agent.register("lp-2")
    items, took = _claim(agent, agent_id, 0)
    assert items == [] and took < 1.0
    assert agent.c.post(f"/v1/agents/{agent_id}/claim", params={"wait": 8.5},
                        json={"max": 1}).status_code == 422  # bounded
