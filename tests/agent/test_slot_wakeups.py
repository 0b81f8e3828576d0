"""A freed slot is used at once: the runner learns of its workload's exit without waiting out a
supervision tick, and a full agent claims as soon as a slot frees instead of at its next poll.

Before, a short attempt held its slot up to one tick (0.2 s) after its workload had exited,
and a full agent claimed again only up to ``poll_seconds`` (0.5 s) after a slot freed, while
the control plane had already routed work to it. With 5 slots per agent, 20 operations/s of
0.2 s sleeps then ran at 15.6/s with queue->running p95 7.6 s; with both fixed, 19.8/s and
p95 0.34 s (`gameday bench runtime`, docs/performance.md).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from controlplane.agent.api import Registration
from controlplane.agent.attempt import RunnerSettings
from controlplane.agent.capacity import Capacity, Demand
from controlplane.agent.loop import Agent, AgentIdentity, LoopSettings
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import Spool
from controlplane.runtimes.local import LocalRunHandle

LONG = 60.0  # a poll or tick the behaviour under test must not wait for


def test_release_calls_the_listeners_once_per_reservation() -> None:
    cap = Capacity(1)
    calls: list[int] = []
    cap.on_release(lambda: calls.append(1))
    assert cap.reserve("a", Demand(1)) is None
    cap.release("a")
    assert calls == [1]
    cap.release("a")  # nothing held any more: nothing freed, nobody woken
    cap.release("never-held")
    assert calls == [1]


def test_a_local_handle_wait_returns_when_the_workload_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE, text=True)
    handle = LocalRunHandle(proc)
    t0 = time.monotonic()
    handle.wait(LONG)
    assert time.monotonic() - t0 < LONG / 2 and handle.result() is not None


def test_a_local_handle_wait_returns_after_its_timeout_while_the_workload_runs() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    handle = LocalRunHandle(proc)
    try:
        handle.wait(0.05)
        assert handle.result() is None
    finally:
        handle.stop(0.5)


class _ClaimRecorder:
    """The agent API as far as the main loop uses it: claims are answered at once, empty."""

    def __init__(self) -> None:
        self.claims: list[float] = []
        self.registered = threading.Event()

    def register(self, *_: Any) -> Registration:
        self.registered.set()
        return Registration("agent-1", lease_seconds=LONG, heartbeat_seconds=LONG)

    def claim(self, agent_id: str, n: int, wait: float = 0.0,
              claim_id: str | None = None) -> list[dict[str, Any]]:
        self.claims.append(time.monotonic())
        return []

    def heartbeat(self, agent_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_full_agent_claims_as_soon_as_a_slot_frees(tmp_path: Path) -> None:
    api = _ClaimRecorder()
    capacity = Capacity(1)
    assert capacity.reserve("running", Demand(1)) is None  # full from the start
    agent = Agent(
        identity=AgentIdentity("a", "cpu", "z", "r"), api=api,  # type: ignore[arg-type]
        runtime=SimpleNamespace(name="local"),  # type: ignore[arg-type]  # nothing starts
        capacity=capacity, runner_settings=RunnerSettings(s3_endpoint=None, bucket="b"),
        store_factory=lambda: None,  # type: ignore[arg-type,return-value]
        spool=Spool(tmp_path / "spool", max_bytes=1 << 20, max_age_seconds=LONG,
                    metrics=AgentMetrics()),
        settings=LoopSettings(poll_seconds=LONG, spool_flush_seconds=LONG))
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        assert api.registered.wait(10)
        time.sleep(0.3)  # the loop has found no free slot and sleeps (up to poll_seconds)
        assert api.claims == []
        freed = time.monotonic()
        capacity.release("running")
        deadline = time.monotonic() + 10
        while not api.claims and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.claims and api.claims[0] - freed < LONG / 2, "no claim after the slot freed"
    finally:
        agent.stop()
        loop.join(10)
    assert not loop.is_alive(), "stop() must end the loop's sleep too"
