"""The attempt runner against an in-memory fake of the agent API (our own port), with the real
local runtime and workload subprocess: lost lease, self-fencing, cancel, capacity."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from agenttest import Registry, S3Server

from controlplane.agent.api import ApiUnavailable, AttemptHeartbeat, LeaseLost
from controlplane.agent.attempt import AttemptRunner, Claim, Ending, RunnerSettings
from controlplane.agent.capacity import Capacity, Demand
from controlplane.agent.delivery import Courier
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import Spool
from controlplane.runtimes.local import LocalRuntime

# timing-sensitive (waits measured in fractions of a second): run alone by make test
pytestmark = pytest.mark.serial


class FakeApi:
    """Answers heartbeats per ``mode``: ok, 409 (lease lost), unavailable, cancel."""

    def __init__(self, mode: str = "ok", after: int = 1) -> None:
        self.mode = mode
        self.after = after  # heartbeats answered normally before the mode kicks in
        self.heartbeats = 0
        self.reports: list[tuple[str, str, dict[str, Any] | None]] = []
        self.events: list[dict[str, Any]] = []
        self.report_events: list[dict[str, Any]] = []  # those that came inside a report

    def attempt_heartbeat(self, attempt_id: str, token: int, progress: Any) -> AttemptHeartbeat:
        self.heartbeats += 1
        if self.heartbeats > self.after:
            if self.mode == "lost":
                raise LeaseLost("409 fencing token 1 is stale (current 2)")
            if self.mode == "unavailable":
                raise ApiUnavailable("connection refused")
            if self.mode == "cancel":
                return AttemptHeartbeat(True, None)
        return AttemptHeartbeat(False, None)

    def send_events(self, attempt_id: str, token: int, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)

    def report(self, attempt_id: str, token: int, state: str, reason: str,
               error: dict[str, str] | None = None, result: dict[str, Any] | None = None,
               events: list[dict[str, Any]] | None = None) -> None:
        self.reports.append((state, reason, error))
        self.report_events.extend(events or [])
        self.events.extend(events or [])


def make_runner(api: FakeApi, s3: S3Server, registry: Registry, capacity: Capacity,
                params: dict[str, Any], spool_dir: Path, lease: float = 1.5,
                heartbeat_seconds: float = 0.3) -> AttemptRunner:
    claim = Claim(attempt_id=str(uuid.uuid4()), operation_id=str(uuid.uuid4()), number=1,
                  fencing_token=1, lease_seconds=lease, project="p",
                  spec={"workload": {"kind": "train", "image": registry.trainer_image, "params": params},
                        "resources": {"cpu": 1}})
    assert capacity.reserve(claim.attempt_id, claim.demand()) is None
    metrics = AgentMetrics()
    spool = Spool(spool_dir, max_bytes=1 << 20, max_age_seconds=3600, metrics=metrics)
    return AttemptRunner(
        claim, api=api, runtime=LocalRuntime(), capacity=capacity,  # type: ignore[arg-type]
        metrics=metrics, settings=RunnerSettings(s3.endpoint, s3.bucket, tick=0.05),
        heartbeat_seconds=heartbeat_seconds, shutdown=threading.Event(), store_factory=lambda: s3.store(deadline=1.0),
        courier=Courier(api, spool, metrics))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode,ending", [("lost", Ending.LEASE_LOST), ("unavailable", Ending.LEASE_LOST),
                                         ("cancel", Ending.CANCELED)])
def test_workload_stopped_without_a_report_when_lease_is_lost_or_canceled(
    mode: str, ending: Ending, moto: S3Server, registry: Registry, tmp_path: Path,
) -> None:
    api = FakeApi(mode, after=2)
    capacity = Capacity(1)
    runner = make_runner(api, moto, registry, capacity, {"steps": 10_000, "step_delay": 0.01},
                         tmp_path)
    runner.start()
    deadline = time.monotonic() + 10
    while runner.handle is None and time.monotonic() < deadline:
        time.sleep(0.02)
    handle = runner.handle
    assert handle is not None
    runner.join(timeout=15)

    assert not runner.is_alive() and runner.ending is ending
    assert handle.process.poll() is not None  # type: ignore[attr-defined]  # workload stopped
    assert [r[0] for r in api.reports] == ["running"]  # no terminal report from a fenced agent
    assert capacity.free() == (1, 0)  # slot given back


def test_success_reported_only_with_verified_artifacts(moto: S3Server, registry: Registry,
                                                       tmp_path: Path) -> None:
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 20, "checkpoint_every": 10},
                         tmp_path)
    runner.run()  # on this thread: the workload dies with the thread that started it
    assert runner.ending is Ending.SUCCEEDED
    assert [r[0] for r in api.reports] == ["running", "succeeded"]
    assert "completion manifest verified" in api.reports[-1][1]
    kinds = [e["kind"] for e in api.events]
    assert kinds.count("checkpoint_written") == 2 and "artifact_written" in kinds


def test_an_attempt_shorter_than_the_heartbeat_interval_sends_no_heartbeat(
    moto: S3Server, registry: Registry, tmp_path: Path,
) -> None:
    # The claim granted the lease just now; the first heartbeat is one interval later. Then a
    # slow one: the interval does come, and the lease is still held through heartbeats.
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 2}, tmp_path / "short",
                         lease=30.0, heartbeat_seconds=10.0)
    runner.run()
    assert runner.ending is Ending.SUCCEEDED and api.heartbeats == 0
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 20, "step_delay": 0.05},
                         tmp_path / "slow", lease=1.5, heartbeat_seconds=0.3)
    runner.run()
    assert runner.ending is Ending.SUCCEEDED and api.heartbeats >= 2


def test_the_last_events_ride_in_the_final_report(moto: S3Server, registry: Registry,
                                                 tmp_path: Path) -> None:
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 3}, tmp_path)
    runner.run()
    assert runner.ending is Ending.SUCCEEDED
    assert "artifact_written" in [e["kind"] for e in api.report_events]  # no request of its own
    kinds = [e["kind"] for e in api.events]
    assert kinds.count("artifact_written") == 1 and kinds.count("start_failed") == 0


class NoTerminalReportApi(FakeApi):
    """The control plane never takes the final report (down until the lease runs out)."""

    def report(self, attempt_id: str, token: int, state: str, reason: str,
               error: dict[str, str] | None = None, result: dict[str, Any] | None = None,
               events: list[dict[str, Any]] | None = None) -> None:
        if state != "running":
            raise ApiUnavailable("connection refused")
        super().report(attempt_id, token, state, reason, error, result, events)


def test_events_of_an_undelivered_final_report_are_spooled_not_lost(
    moto: S3Server, registry: Registry, tmp_path: Path,
) -> None:
    api = NoTerminalReportApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 3}, tmp_path, lease=1.5)
    runner.run()
    assert runner.ending is Ending.LEASE_LOST and api.report_events == []
    batch = runner.courier.spool.read_batch(runner.claim.attempt_id, 200)
    assert batch is not None and "artifact_written" in [e["kind"] for e in batch.events]


def test_invalid_params_fail_deterministically_before_start(moto: S3Server, registry: Registry,
                                                             tmp_path: Path) -> None:
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"stepz": 3}, tmp_path)
    runner.run()
    assert runner.ending is Ending.START_FAILED and runner.handle is None
    state, reason, error = api.reports[-1]
    assert state == "failed" and error == {"kind": "deterministic", "message": reason}
    assert "unknown keys ['stepz']" in reason


def test_capacity_accounts_cpu_and_accelerator_slots() -> None:
    cap = Capacity(cpu_slots=3, accelerator_type="sim-a100", accelerator_count=2)
    assert cap.reserve("a", Demand(2, "sim-a100", 1)) is None
    assert cap.free() == (1, 1)
    assert "cpu slots" in (cap.reserve("b", Demand(2)) or "")
    assert "accelerators" in (cap.reserve("c", Demand(1, "sim-a100", 2)) or "")
    assert "sim-h100" in (cap.reserve("d", Demand(1, "sim-h100", 1)) or "")
    assert cap.reserve("e", Demand(1, "sim-a100", 1)) is None
    assert cap.free() == (0, 0)
    cap.release("a")
    assert cap.free() == (2, 1) and set(cap.held()) == {"e"}
    with pytest.raises(ValueError, match="cpu_slots"):
        Capacity(0)


class OutageApi(FakeApi):
    """Every call fails while ``down`` is set (the control plane is unreachable)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()

    def _check(self) -> None:
        if self.down.is_set():
            raise ApiUnavailable("connection refused")

    def attempt_heartbeat(self, attempt_id: str, token: int, progress: Any) -> AttemptHeartbeat:
        self._check()
        return super().attempt_heartbeat(attempt_id, token, progress)

    def send_events(self, attempt_id: str, token: int, events: list[dict[str, Any]]) -> None:
        self._check()
        super().send_events(attempt_id, token, events)

    def report(self, attempt_id: str, token: int, state: str, reason: str,
               error: dict[str, str] | None = None, result: dict[str, Any] | None = None,
               events: list[dict[str, Any]] | None = None) -> None:
        self._check()
        super().report(attempt_id, token, state, reason, error, result, events)


def test_events_survive_an_unreachable_api_in_the_spool_and_arrive_in_order(
    moto: S3Server, registry: Registry, tmp_path: Path,
) -> None:
    api = OutageApi()
    runner = make_runner(api, moto, registry, Capacity(1),
                         {"steps": 40, "checkpoint_every": 10, "step_delay": 0.03}, tmp_path,
                         lease=3.0)
    runner.start()
    deadline = time.monotonic() + 15
    while not api.events and time.monotonic() < deadline:
        time.sleep(0.02)
    api.down.set()  # shorter than the lease: the runner keeps its claim
    time.sleep(1.2)
    spooled = runner.metrics.registry.get_sample_value("controlplane_agent_events_spooled_total")
    api.down.clear()
    runner.join(timeout=30)

    assert runner.ending is Ending.SUCCEEDED and [r[0] for r in api.reports] == ["running", "succeeded"]
    assert spooled and spooled > 0  # the outage went to disk, not to a list
    steps = [e["data"]["step"] for e in api.events if e["kind"] == "checkpoint_written"]
    assert steps == [10, 20, 30, 40]
    kinds = [e["kind"] for e in api.events if e["kind"] != "progress"]
    assert kinds[-1] == "artifact_written"
    assert runner.courier.spool.pending_events() == 0
    assert runner.metrics.registry.get_sample_value(
        "controlplane_agent_events_dropped_total", {"reason": "spool_full"}) == 0


class OutageFromFirstEvents(OutageApi):
    """Unreachable from the first events request on, for ``seconds``: a short attempt ends
    inside the outage, with events spooled and its final report still to send."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.timer: threading.Timer | None = None

    def send_events(self, attempt_id: str, token: int, events: list[dict[str, Any]]) -> None:
        if self.timer is None:
            self.down.set()
            self.timer = threading.Timer(self.seconds, self.down.clear)
            self.timer.start()
        super().send_events(attempt_id, token, events)


def test_spooled_events_go_before_a_final_report_sent_after_an_outage(
    moto: S3Server, registry: Registry, tmp_path: Path,
) -> None:
    # The control plane refuses events once the attempt is terminal: a report sent without
    # the spooled ones would lose them for good.
    api = OutageFromFirstEvents(seconds=1.5)
    runner = make_runner(api, moto, registry, Capacity(1),
                         {"steps": 20, "checkpoint_every": 10, "step_delay": 0.02}, tmp_path,
                         lease=3.0)
    runner.run()
    assert runner.ending is Ending.SUCCEEDED and [r[0] for r in api.reports] == ["running", "succeeded"]
    assert api.timer is not None and not api.down.is_set()  # the outage happened and ended
    kinds = [e["kind"] for e in api.events if e["kind"] != "progress"]
    assert kinds == ["checkpoint_started", "checkpoint_written"] * 2 + ["artifact_written"]
    assert runner.courier.spool.pending_events() == 0


class _EventsHandle:
    """A handle whose workload is still running and has written the events ``emit`` gave."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, kind: str) -> None:
        from controlplane.workload.events import WorkloadEvent
        self.events.append(WorkloadEvent(kind, "", {"step": len(self.events) + 1}))

    def drain_events(self) -> list[Any]:
        out, self.events = self.events, []
        return out


def test_the_closing_event_is_held_for_the_report_only_for_a_bounded_time(
        moto: S3Server, registry: Registry, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.agent import attempt
    runner = make_runner(FakeApi(), moto, registry, Capacity(1), {"steps": 3}, tmp_path)
    handle = _EventsHandle()
    handle.emit("artifact_written")  # the closing event, and no exit yet
    runner.handle = handle  # type: ignore[assignment]
    assert runner._holding_closing_event()  # exit expected any moment: wait for the report
    monkeypatch.setattr(attempt, "CLOSING_EVENT_HOLD_SECONDS", 0.0)
    assert not runner._holding_closing_event()  # it did not exit: sent as usual
    runner._outbox.clear()
    assert not runner._holding_closing_event()  # nothing closing: nothing held


def test_progress_alone_is_held_only_for_a_bounded_time(
        moto: S3Server, registry: Registry, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.agent import attempt
    runner = make_runner(FakeApi(), moto, registry, Capacity(1), {"steps": 3}, tmp_path)
    handle = _EventsHandle()
    runner.handle = handle  # type: ignore[assignment]
    assert not runner._holding_progress()  # nothing read: nothing held
    handle.emit("progress")
    assert runner._holding_progress()  # progress alone: it may wait for the report
    monkeypatch.setattr(attempt, "PROGRESS_HOLD_SECONDS", 0.0)
    assert not runner._holding_progress()  # held long enough: sent as usual
    monkeypatch.setattr(attempt, "PROGRESS_HOLD_SECONDS", 60.0)
    assert runner._holding_progress()  # the hold starts again after that
    handle.emit("checkpoint_written")
    assert not runner._holding_progress()  # any other event sends the progress with it
    runner._outbox = [e for e in runner._outbox if e["kind"] == "progress"]
    runner.courier.spool.append(runner.key, [{"kind": "log", "message": "older", "data": {}}])
    assert not runner._holding_progress()  # something spooled: the courier must drain it


def test_a_short_attempt_sends_its_progress_inside_its_final_report(
        moto: S3Server, registry: Registry, tmp_path: Path) -> None:
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 3}, tmp_path,
                         lease=30.0, heartbeat_seconds=10.0)
    runner.claim.spec["workload"].update(kind="sleep", params={"seconds": 0.2})
    runner.run()
    assert runner.ending is Ending.SUCCEEDED, api.reports
    assert api.events == api.report_events  # no request of its own for the events
    assert [e["kind"] for e in api.report_events] == ["progress", "artifact_written"]


def test_a_claim_that_arrives_as_the_agent_stops_starts_no_workload(
        moto: S3Server, registry: Registry, tmp_path: Path) -> None:
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 3}, tmp_path)
    runner.shutdown.set()  # SIGTERM landed between the claim's answer and the start
    runner.run()
    assert runner.ending is Ending.SHUTDOWN
    assert runner.handle is None and api.reports == []  # never started, never "running"
    assert runner.capacity.free() == (1, 0)  # the slot is given back


class _StoppingRuntime(LocalRuntime):
    """The agent begins to stop while the workload starts."""

    def __init__(self, shutdown: threading.Event) -> None:
        super().__init__()
        self.shutdown = shutdown

    def start(self, spec: Any) -> Any:
        handle = super().start(spec)
        self.shutdown.set()
        return handle


def test_a_workload_started_as_the_agent_stops_is_stopped_not_reported_running(
        moto: S3Server, registry: Registry, tmp_path: Path) -> None:
    api = FakeApi()
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 10_000, "step_delay": 0.01},
                         tmp_path)
    runner.runtime = _StoppingRuntime(runner.shutdown)
    runner.run()
    assert runner.ending is Ending.SHUTDOWN and api.reports == []
    assert runner.handle is not None and runner.handle.process.poll() is not None  # type: ignore[attr-defined]


class _RunningHandle(_EventsHandle):
    """A workload that keeps running; its supervision loop ends after ``ticks`` waits."""

    def __init__(self, runner: AttemptRunner, ticks: int = 1) -> None:
        super().__init__()
        self.runner, self.ticks = runner, ticks

    def result(self) -> None:
        return None

    def pending_reason(self) -> None:
        return None

    def wait(self, seconds: float) -> None:
        self.ticks -= 1
        if self.ticks <= 0:
            self.runner.shutdown.set()


class _OrderApi(FakeApi):
    def __init__(self, mode: str = "ok", after: int = 0) -> None:
        super().__init__(mode, after)
        self.calls: list[str] = []

    def attempt_heartbeat(self, attempt_id: str, token: int, progress: Any) -> AttemptHeartbeat:
        self.calls.append("heartbeat")
        return super().attempt_heartbeat(attempt_id, token, progress)

    def send_events(self, attempt_id: str, token: int, events: list[dict[str, Any]]) -> None:
        self.calls.append("events")
        super().send_events(attempt_id, token, events)


@pytest.mark.parametrize("mode", ["ok", "unavailable"])
def test_a_due_heartbeat_goes_before_the_tick_s_events_and_a_failing_one_sends_none(
        mode: str, moto: S3Server, registry: Registry, tmp_path: Path) -> None:
    """An events call that met a silent connection would hold a due heartbeat back a whole
    deadline (network-gray): the heartbeat first, and while it fails the events go to the
    spool, not to the API."""
    api = _OrderApi(mode)
    runner = make_runner(api, moto, registry, Capacity(1), {"steps": 3}, tmp_path, lease=30.0)
    handle = _RunningHandle(runner, ticks=2)
    handle.emit("checkpoint_written")
    runner.handle = handle  # type: ignore[assignment]
    runner._next_heartbeat = 0.0  # due now
    assert runner._supervise() is None and runner.ending is Ending.SHUTDOWN
    if mode == "ok":
        assert api.calls[:2] == ["heartbeat", "events"]
        assert [e["kind"] for e in api.events] == ["checkpoint_written"]
    else:
        # two ticks, the retry due only 0.5 s later: and no events call in either
        assert api.calls == ["heartbeat"]
        assert not api.events
        assert runner.courier.spool.has_pending(runner.claim.attempt_id)
