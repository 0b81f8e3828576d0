"""An attempt that ends frees a slot: its report wakes the reconciler's routing pass (a
``freed`` NOTIFY on the work channel) when work is queued, so the queued work is routed at
once instead of at the reconciler's next tick. With nothing queued, nothing is sent: a
reconciler pass per finished attempt would cost CPU for nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from controlplane.store.operations import NOTIFY_CHANNEL
from environments.local.launch import ControlPlane

from .helpers import Api, claim_one, spec, wait_state

# timing-sensitive (a 3 s lease and agent timeout between routing and claim): run alone by
# make test
pytestmark = pytest.mark.serial


def _freed(conn: psycopg.Connection, seconds: float) -> bool:
    """Whether a ``freed`` notification arrives within ``seconds`` (returns at the first)."""
    return any(n.payload == "freed" for n in conn.notifies(timeout=seconds))


SUCCEEDED = {"state": "succeeded", "result": {"ok": True}}
FAILED = {"state": "failed", "error": {"kind": "deterministic", "message": "x"}}


@pytest.mark.parametrize("first_end, second_end", [(SUCCEEDED, FAILED), (FAILED, SUCCEEDED)],
                         ids=["succeeded-then-failed", "failed-then-succeeded"])
def test_a_terminal_report_wakes_routing_only_while_work_is_queued(
        cp_stack: ControlPlane, first_end: dict[str, Any], second_end: dict[str, Any]) -> None:
    user = Api(cp_stack.api_url, cp_stack.user_token)
    agent = Api(cp_stack.api_url, cp_stack.agent_token)
    agent_id = agent.register("one-slot", cpu_slots=1)
    first = user.submit(spec("first", max_retries=0)).json()["id"]
    claim = claim_one(agent, agent_id)
    assert claim["operation_id"] == first
    second = user.submit(spec("second", max_retries=0)).json()["id"]
    wait_state(user, second, "queued")  # the only slot is taken
    with psycopg.connect(cp_stack.dsn, autocommit=True) as listen:
        listen.execute(f"LISTEN {NOTIFY_CHANNEL}")
        assert agent.report(claim, "running").status_code == 200
        assert not _freed(listen, 0.5)  # nothing ended
        # the stack's agent timeout is 3 s: the agent must look alive to be routed to
        agent.c.post(f"/v1/agents/{agent_id}/heartbeat").raise_for_status()
        assert agent.report(claim, **first_end).status_code == 200
        assert _freed(listen, 2.0)
        wait_state(user, second, "dispatched")
        claim = claim_one(agent, agent_id)
        assert claim["operation_id"] == second
        assert agent.report(claim, **second_end).status_code == 200
        assert not _freed(listen, 1.0)  # nothing queued: no routing pass asked
