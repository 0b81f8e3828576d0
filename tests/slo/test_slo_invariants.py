"""Invariants and dropped evidence on hand-made records: each rule is shown to pass, to catch
a violation, and to say "no data" when there was nothing to judge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slo.dropped import counter_increase, dropped_evidence
from slo.evidence import (
    AgentRecord,
    Attempt,
    Event,
    FaultRecord,
    Operation,
    PromQuery,
    PromSeries,
    RequestRecord,
)
from slo.invariants import (
    bounded_retries,
    eligible_placement,
    fencing,
    lease_granted_once,
    served_after_detection,
)

T0 = datetime(2025, 1, 6, 10, 0, tzinfo=UTC)
START, END = T0.timestamp(), T0.timestamp() + 300


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _event(n: int, seconds: float, kind: str, attempt: str | None = "att-1",
           actor: str | None = None, **extra: Any) -> Event:
    return Event(id=n, operation_id="op-1", attempt_id=attempt, time=_at(seconds), kind=kind,
                 actor=actor, **extra)


def _attempt(aid: str, state: str = "lost", op: str = "op-1", seconds: float = 10,
             agent: str | None = "agent-a") -> Attempt:
    return Attempt(id=aid, operation_id=op, number=1, state=state, created_at=_at(seconds),
                   agent_name=agent)


def _op(oid: str = "op-1", **extra: Any) -> Operation:
    return Operation(id=oid, project="p", state="succeeded", created_at=T0, **extra)


# --------------------------------------------------------------------------- fencing

FENCED = [
    _event(1, 20, "progress", actor="agent:agent-a"),
    _event(2, 60, "lease_expired", actor="reconciler"),
    _event(3, 61, "stale_report_refused", actor="agent:agent-a"),  # refused: that is fencing
]


def test_fencing_holds_when_the_stale_agent_is_only_refused() -> None:
    result = fencing([_attempt("att-1")], FENCED, START, END)
    assert result.judged == 1 and result.violations == () and result.no_data is None


def test_fencing_catches_an_agent_acting_after_its_lease_expired() -> None:
    late = _event(4, 62, "progress", actor="agent:agent-a")
    result = fencing([_attempt("att-1")], [*FENCED, late], START, END)
    assert len(result.violations) == 1 and "progress by agent:agent-a" in result.violations[0]


def test_fencing_orders_by_time_then_event_id() -> None:
    # same second: the agent's report has the lower id, so it came before the expiry
    same_time = [_event(1, 60, "progress", actor="agent:agent-a"),
                 _event(2, 60, "lease_expired", actor="reconciler")]
    assert fencing([_attempt("att-1")], same_time, START, END).violations == ()
    swapped = [_event(3, 60, "progress", actor="agent:agent-a"),
               _event(2, 60, "lease_expired", actor="reconciler")]
    assert len(fencing([_attempt("att-1")], swapped, START, END).violations) == 1


def test_fencing_lost_attempt_must_never_succeed() -> None:
    marked = _event(4, 70, "state_change", actor="api", to_state="succeeded")
    assert len(fencing([_attempt("att-1")], [*FENCED, marked], START, END).violations) == 1
    result = fencing([_attempt("att-1", state="succeeded")], FENCED, START, END)
    assert result.violations == ("attempt att-1: lost its lease but is succeeded in the snapshot",)


def test_fencing_without_a_lease_expiry_in_the_window_is_no_data() -> None:
    assert fencing([_attempt("att-1")], FENCED, START + 100, END).no_data is not None
    no_attempt = [_event(2, 60, "lease_expired", attempt=None)]
    result = fencing([], no_attempt, START, END)
    assert result.judged == 0 and "no lease expired" in (result.no_data or "")


# --------------------------------------------------------------------------- bounded retries

def test_bounded_retries() -> None:
    attempts = [_attempt(f"att-{n}", op="op-1", seconds=10 + n) for n in range(3)]
    ok = bounded_retries([_op(max_retries=2)], attempts, START, END)
    assert ok.judged == 1 and ok.violations == ()
    storm = bounded_retries([_op(max_retries=1)], attempts, START, END)
    assert storm.violations == ("operation op-1: 3 attempts, at most 2 allowed (max_retries 1)",)


def test_bounded_retries_no_data() -> None:
    attempts = [_attempt("att-1")]
    assert "max_retries" in (bounded_retries([_op()], attempts, START, END).no_data or "")
    outside = bounded_retries([_op(max_retries=0)], attempts, START + 100, END)
    assert outside.judged == 0 and outside.no_data is not None


# --------------------------------------------------------------------------- placement

AGENTS = (
    AgentRecord(name="agent-a", pool="cpu", zone="eu-1a", region="eu-1", datasets=("imagenet",)),
    AgentRecord(name="agent-gpu", pool="gpu", zone="us-1a", region="us-1",
                accelerator_type="a100", accelerator_count=4),
)


@pytest.mark.parametrize(
    ("op_fields", "agent", "violation"),
    [
        ({}, "agent-a", None),
        ({"placement": {"regions": ["eu-1"], "dataset": "imagenet"}}, "agent-a", None),
        ({"placement": {"regions": ["us-1"]}}, "agent-a", "region 'eu-1'"),
        ({"placement": {"dataset": "laion"}}, "agent-a", "dataset 'laion'"),
        ({"resources": {"cpu": 1, "accelerator": {"type": "a100", "count": 2}}}, "agent-gpu",
         None),
        ({"resources": {"cpu": 1, "accelerator": {"type": "a100", "count": 8}}}, "agent-gpu",
         "needs 8 x a100"),
        ({"resources": {"cpu": 1, "accelerator": {"type": "a100", "count": 1}}}, "agent-a",
         "needs 1 x a100"),
        ({}, "agent-ghost", "not in snapshot/agents.jsonl"),
        # CPU-only work on an accelerator node, even in an allowed region: seen in a selftest,
        # where the fallback defect chose the region's GPU node with the right dataset
        ({"placement": {"regions": ["us-1"]}}, "agent-gpu", "requested no accelerator"),
        ({"resources": {"cpu": 1, "accelerator": None}}, "agent-gpu", "requested no accelerator"),
    ],
)
def test_eligible_placement(op_fields: dict, agent: str, violation: str | None) -> None:
    result = eligible_placement([_op(**op_fields)], [_attempt("att-1", agent=agent)], AGENTS,
                                START, END)
    assert result.judged == 1
    if violation is None:
        assert result.violations == ()
    else:
        assert len(result.violations) == 1 and violation in result.violations[0]


def test_eligible_placement_no_data() -> None:
    attempts = [_attempt("att-1")]
    assert "agents.jsonl" in (eligible_placement([_op()], attempts, None, START, END).no_data
                              or "")
    assert eligible_placement([_op()], attempts, AGENTS, START + 100, END).no_data is not None


# --------------------------------------------------------------------------- dropped evidence

def _series(agent: str, values: list[float]) -> PromSeries:
    return PromSeries(metric={"agent": agent}, values=tuple((float(i), v)
                                                            for i, v in enumerate(values)))


def test_counter_increase_survives_restarts() -> None:
    assert counter_increase([3, 5, 9]) == 6
    assert counter_increase([3, 5, 1, 4]) == 2 + 1 + 3  # restarted at 1
    assert counter_increase([7]) == 0


def test_dropped_evidence_takes_the_larger_source_per_agent() -> None:
    events = [_event(1, 10, "evidence_dropped", attempt=None, actor="agent:a", data={"count": 5}),
              _event(2, 20, "evidence_dropped", attempt=None, data={"agent": "b", "count": 2}),
              _event(3, 30, "progress")]
    query = PromQuery(name="evidence_dropped", query="q",
                      series=(_series("a", [0, 3]), _series("c", [10, 14])))
    result = dropped_evidence(events, query)
    assert result.by_agent == {"a": 5, "b": 2, "c": 4}
    assert result.total == 11 and result.from_events == 7 and result.from_prometheus == 7
    none = dropped_evidence([_event(3, 30, "progress")], None)
    assert none.total == 0 and none.from_prometheus is None


# --------------------------------------------------------------------------- served after detection

def _req(seconds: float, status: int | None = 201, route: str = "/v1/operations",
         error: str | None = None) -> RequestRecord:
    return RequestRecord(time=_at(seconds), method="POST", route=route, status=status,
                         error=error, latency_ms=5.0)


PARTITION = [
    FaultRecord(time=_at(30), event="fault_start", fault="partition_database", target="api-1"),
    FaultRecord(time=_at(60), event="fault_end", fault="partition_database", target="api-1"),
]


def test_served_after_detection_forgives_failures_inside_the_grace_only() -> None:
    requests = [_req(31, 503), _req(33, 503), _req(36), _req(50), _req(59), _req(70, 503)]
    result = served_after_detection(requests, PARTITION, START, END, grace=5.0)
    # 31 s and 33 s are within 5 s of the fault start; 70 s is after the fault ended
    assert result.judged == 3 and result.violations == () and result.no_data is None


def test_served_after_detection_catches_a_replica_still_in_rotation() -> None:
    requests = [_req(40), _req(41, 503), _req(45, None, error="timeout"), _req(55, 500),
                _req(58, 503, route="s3:get")]  # object-store downloads are not the API
    result = served_after_detection(requests, PARTITION, START, END, grace=5.0)
    assert result.judged == 4 and len(result.violations) == 3
    assert "partition_database api-1" in result.violations[0]


def test_served_after_detection_without_requests_or_fault_is_no_data() -> None:
    assert served_after_detection([_req(20)], PARTITION, START, END, 5.0).no_data
    assert served_after_detection([_req(40)], [], START, END, 5.0).no_data


# --------------------------------------------------------------------------- lease-granted-once


def _claim(n: int, seconds: float, attempt: str, lease: Any = 5.0, op: str = "op-1") -> Event:
    data = {"fencing_token": n} if lease is None else {"fencing_token": n, "lease_seconds": lease}
    return Event(id=n, operation_id=op, attempt_id=attempt, time=_at(seconds), kind="claimed",
                 actor="agent:3f2a", data=data)


def _moved(n: int, seconds: float, attempt: str, to: str, actor: str) -> Event:
    return Event(id=n, operation_id="op-1", attempt_id=attempt, time=_at(seconds),
                 kind="transition", actor=actor, to_state=to)


def test_lease_granted_once_holds_when_the_next_grant_waits_for_the_lease() -> None:
    # the holder went silent: its lease expired after 5 s and the work was granted again later
    events = [_claim(1, 10, "att-1"), _event(2, 16, "lease_expired", actor="reconciler"),
              _claim(3, 18, "att-2")]
    result = lease_granted_once(events, START, END)
    assert result.judged == 2 and result.violations == () and result.no_data is None


def test_lease_granted_once_holds_when_the_holder_ended_its_lease_early() -> None:
    # a transient failure reported by the holder ends its lease at once: a quick retry is fine
    events = [_claim(1, 10, "att-1"), _moved(2, 11, "att-1", "retrying", "agent:cpu-1"),
              _claim(3, 12, "att-2")]
    assert lease_granted_once(events, START, END).violations == ()


def test_lease_granted_once_catches_a_second_grant_inside_the_first_lease() -> None:
    # the lease was taken away 0.5 s after it was granted for 5 s (a clock that lied) and
    # the work granted again while its first holder still held it
    events = [_claim(1, 10, "att-1"), _event(2, 10.5, "lease_expired", actor="reconciler"),
              _moved(3, 10.5, "att-1", "retrying", "reconciler"), _claim(4, 12, "att-2")]
    result = lease_granted_once(events, START, END)
    assert result.judged == 2 and len(result.violations) == 1
    assert "att-2 granted at 10:00:12" in result.violations[0]
    assert "att-1, granted at 10:00:10 for 5s" in result.violations[0]
    assert "3.0s left" in result.violations[0]


def test_lease_granted_once_a_stale_holders_refused_report_does_not_end_its_lease() -> None:
    events = [_claim(1, 10, "att-1"), _event(2, 11, "stale_report_refused", actor="agent:cpu-1"),
              _claim(3, 12, "att-2")]
    assert len(lease_granted_once(events, START, END).violations) == 1


def test_lease_granted_once_allows_the_database_clock_tolerance() -> None:
    edge = [_claim(1, 10, "att-1"), _claim(2, 14.9, "att-2")]
    assert lease_granted_once(edge, START, END).violations == ()
    assert len(lease_granted_once(edge, START, END, tolerance=0.0).violations) == 1


def test_lease_granted_once_judges_each_operation_on_its_own() -> None:
    events = [_claim(1, 10, "att-1", op="op-1"), _claim(2, 11, "att-9", op="op-2")]
    result = lease_granted_once(events, START, END)
    assert result.judged == 2 and result.violations == ()


def test_lease_granted_once_without_grants_in_the_window_is_no_data() -> None:
    result = lease_granted_once([_claim(1, 10, "att-1")], START + 60, END)
    assert result.judged == 0 and result.no_data and "no lease granted" in result.no_data
    assert lease_granted_once([], START, END).no_data is not None


def test_lease_granted_once_missing_lease_seconds_is_no_data_never_a_pass() -> None:
    # the earlier grant does not say how long it was for: the overlap cannot be measured
    for lease in (None, "5", 0, True):
        events = [_claim(1, 10, "att-1", lease=lease), _claim(2, 30, "att-2")]
        result = lease_granted_once(events, START, END)
        assert result.no_data is not None and "att-1" in result.no_data, lease
    # a first grant needs nothing from before it
    assert lease_granted_once([_claim(1, 10, "att-1", lease=None)], START, END).no_data is None


# --------------------------------------------------------------------------- leases-held

def _held(aid: str, state: str, started: float, finished: float | None) -> Attempt:
    return Attempt(id=aid, operation_id="op-1", number=1, state=state, created_at=_at(started),
                   started_at=_at(started), finished_at=_at(finished) if finished else None,
                   agent_name="agent-a")


def test_leases_held_passes_when_no_lease_was_lost_in_the_window() -> None:
    from slo.invariants import leases_held

    attempts = [_held("a1", "succeeded", 5, 60), _held("a2", "running", 20, None)]
    r = leases_held(attempts, [_event(1, 30, "attempt_heartbeat")], START, END)
    assert (r.judged, r.violations, r.no_data) == (2, (), None)


def test_leases_held_catches_an_expired_lease_and_a_lost_attempt() -> None:
    from slo.invariants import leases_held

    attempts = [_held("att-1", "lost", 5, 40), _held("a2", "lost", 5, 50)]
    r = leases_held(attempts, [_event(1, 40, "lease_expired", reason="lease expired")],
                    START, END)
    assert r.judged == 2 and len(r.violations) == 2
    assert "att-1" in r.violations[0] and "lease expired at" in r.violations[0]
    assert "a2" in r.violations[1] and "ended lost" in r.violations[1]
    # before the window: not this fault's doing
    early = leases_held([_held("a3", "lost", -60, -30), _held("a4", "succeeded", -10, 60)],
                        [_event(2, -30, "lease_expired", attempt="a3")], START, END)
    assert (early.judged, early.violations) == (1, ())


def test_leases_held_says_no_data_when_nothing_ran() -> None:
    from slo.invariants import leases_held

    r = leases_held([_attempt("a1", "succeeded")], [], START, END)  # never started
    assert r.judged == 0 and r.no_data == "no attempt held a lease during the window"
