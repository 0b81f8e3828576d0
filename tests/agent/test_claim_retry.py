"""After a claim call fails in transit (a reset connection: the control plane may have granted
it), the agent asks again with the same claim id, and takes a new id once a claim is answered;
an attempt it gets back that it already runs is not started twice."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from controlplane.agent.api import ApiUnavailable, Registration
from controlplane.agent.attempt import RunnerSettings
from controlplane.agent.capacity import Capacity
from controlplane.agent.loop import Agent, AgentIdentity, LoopSettings
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import Spool

REG = Registration("agent-1", lease_seconds=5.0, heartbeat_seconds=1.0)


class _Api:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.claim_ids: list[str | None] = []

    def claim(self, agent_id: str, n: int, wait: float = 0.0,
              claim_id: str | None = None) -> list[dict[str, Any]]:
        self.claim_ids.append(claim_id)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _agent(tmp_path: Path, api: _Api) -> Agent:
    return Agent(
        identity=AgentIdentity("a", "cpu", "z", "r"), api=api,  # type: ignore[arg-type]
        runtime=SimpleNamespace(name="local"),  # type: ignore[arg-type]
        capacity=Capacity(4), runner_settings=RunnerSettings(s3_endpoint=None, bucket="b"),
        store_factory=lambda: None,  # type: ignore[arg-type,return-value]
        spool=Spool(tmp_path / "spool", max_bytes=1 << 20, max_age_seconds=60.0,
                    metrics=AgentMetrics()),
        settings=LoopSettings(poll_seconds=60.0, spool_flush_seconds=60.0))


def test_a_failed_claim_is_asked_again_with_the_same_id(tmp_path: Path) -> None:
    api = _Api([ApiUnavailable("POST claim: ReadError: reset"),
                ApiUnavailable("POST claim: ReadTimeout"), [], []])
    agent = _agent(tmp_path, api)
    assert agent._claim(REG, 0.0) is None
    assert agent._claim(REG, 0.0) is None
    assert agent._claim(REG, 0.0) == 0  # answered: this claim is over
    assert agent._claim(REG, 0.0) == 0
    first, second, third, fourth = api.claim_ids
    assert first and first == second == third  # the same claim until it is answered
    assert fourth and fourth != first


def test_an_attempt_already_running_here_is_not_started_again(tmp_path: Path) -> None:
    item = {"attempt_id": "att-1", "operation_id": "op-1", "number": 1, "fencing_token": 7,
            "lease_expires_at": "2026-12-06T00:00:05+00:00", "lease_seconds": 5.0,
            "spec": {"workload": {"kind": "sleep"}}, "project": "p"}
    api = _Api([[item]])
    agent = _agent(tmp_path, api)
    agent.runners["att-1"] = SimpleNamespace()  # type: ignore[assignment]
    assert agent._claim(REG, 0.0) == 0
    assert list(agent.runners) == ["att-1"]
