"""Per-experiment invariants (pure): promises a failure class makes that must hold whatever the
SLIs say, judged on evidence records scoped to one experiment's [fault start, horizon].

Each returns how many subjects it judged and the violations; when it had nothing to judge it
says why (`no_data`), because an experiment that never exercised what it claims to test has
not shown that the promise holds. Names are what RecoveryObjective `invariants:` may list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from slo import checkpoint_invariants as ck
from slo import outcome_invariants as oc
from slo import overload_invariants as ov
from slo import pipelines as pl
from slo import rollout_invariants as ro
from slo import scale_up_invariants as su
from slo import serving_invariants as sv
from slo import storage_invariants as st
from slo import tracking_invariants as tr
from slo.evidence import (
    AgentRecord,
    Attempt,
    Event,
    Evidence,
    FaultRecord,
    Operation,
    RequestRecord,
)
from slo.invariant_result import InvariantResult, fault_spans
from slo.sli import NON_API_ROUTE_PREFIXES, ObjectIndex, group_by, request_ok, ts

__all__ = ["InvariantResult", "fault_spans"]  # re-exported: where callers have always found them

# events an agent may still send about an attempt whose lease it lost: the platform's refusal
FENCED_KINDS_ALLOWED = frozenset({"stale_report_refused"})
AGENT_ACTOR_PREFIX = "agent:"



def _id_key(value: str | int | None) -> tuple[int, int, str]:
    # event ids are integers (serial) on some platforms, strings on others
    if isinstance(value, int):
        return (0, value, "")
    return (1, 0, "" if value is None else str(value))


def _order(e: Event) -> tuple[float, tuple[int, int, str]]:
    return (ts(e.time), _id_key(e.id))


def _when(e: Event) -> str:
    return e.time.strftime("%H:%M:%S")


def fencing(
    attempts: Iterable[Attempt], events: Iterable[Event], start: float, end: float
) -> InvariantResult:
    """After an attempt's lease expired (a `lease_expired` event in the window), no agent may
    be recorded acting for it except to be refused, and it must never end up succeeded."""
    ordered = sorted((e for e in events if e.attempt_id), key=_order)
    lost_at: dict[str, int] = {}
    for i, e in enumerate(ordered):
        if e.kind == "lease_expired" and start <= ts(e.time) <= end:
            lost_at.setdefault(str(e.attempt_id), i)
    if not lost_at:
        return InvariantResult(
            "fencing", 0, no_data="no lease expired in the experiment window "
            "(no lease_expired event with an attempt_id)")
    violations = []
    for i, e in enumerate(ordered):
        attempt = str(e.attempt_id)
        first = lost_at.get(attempt)
        if first is None or i <= first:
            continue
        actor = e.actor or ""
        if actor.startswith(AGENT_ACTOR_PREFIX) and e.kind not in FENCED_KINDS_ALLOWED:
            violations.append(f"attempt {attempt}: {e.kind} by {actor} at {_when(e)} "
                              "after its lease expired")
        elif e.to_state == "succeeded":
            violations.append(f"attempt {attempt}: marked succeeded at {_when(e)} "
                              "after its lease expired")
    for a in attempts:
        if a.id in lost_at and a.state == "succeeded":
            violations.append(f"attempt {a.id}: lost its lease but is succeeded in the snapshot")
    return InvariantResult("fencing", len(lost_at), tuple(violations))


# transitions that end a holder's lease before it runs out: its own report (success, failure,
# failure -> retrying) or a cancel (by anyone: a canceled operation is never granted again)
HOLDER_ENDS = frozenset({"succeeded", "failed", "retrying", "canceled"})
# database members' clocks may differ by this much after a failover (grants are stamped by
# whichever member was primary)
LEASE_CLOCK_TOLERANCE = 0.25


def _lease_seconds(e: Event) -> float | None:
    value = e.data.get("lease_seconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _ended_by_holder(e: Event) -> bool:
    if e.to_state not in HOLDER_ENDS:
        return False
    return e.to_state == "canceled" or (e.actor or "").startswith(AGENT_ACTOR_PREFIX)


def lease_granted_once(
    events: Iterable[Event], start: float, end: float,
    tolerance: float = LEASE_CLOCK_TOLERANCE,
) -> InvariantResult:
    """No lease granted twice: an operation's work is never granted (a `claimed` event) while
    an earlier grant of the same operation may still be held. An earlier grant is held until
    its holder ends it (its own report, or a cancel) and at least for the `lease_seconds` it
    was granted for (claimed event data), on the database's clock that stamps both grants:
    renewals only extend a lease, so a second grant inside the first `lease_seconds` with no
    end from the holder is a double grant whatever the renewals said. (A double grant after a
    renewal would need the renewal times, which the events do not carry: not judged.)

    Judged: the grants in [start, end]. An earlier grant without `lease_seconds` makes the
    whole result no data: an overlap that cannot be measured is never a pass."""
    ordered = sorted((e for e in events if e.attempt_id and e.operation_id), key=_order)
    grants = [(i, e) for i, e in enumerate(ordered) if e.kind == "claimed"]
    in_window = [(i, e) for i, e in grants if start <= ts(e.time) <= end]
    if not in_window:
        return InvariantResult("lease-granted-once", 0,
                               no_data="no lease granted in the experiment window "
                               "(no claimed event with an attempt_id)")
    ends: dict[str, list[int]] = {}
    for i, e in enumerate(ordered):
        if _ended_by_holder(e):
            ends.setdefault(str(e.attempt_id), []).append(i)
    violations: list[str] = []
    unmeasured: set[str] = set()
    for j, b in in_window:
        for i, a in grants:
            if i >= j or a.operation_id != b.operation_id or a.attempt_id == b.attempt_id:
                continue
            if any(k < j for k in ends.get(str(a.attempt_id), ())):
                continue  # its holder ended it before the new grant
            lease = _lease_seconds(a)
            if lease is None:
                unmeasured.add(str(a.attempt_id))
                continue
            held = ts(a.time) + lease - ts(b.time)
            if held > tolerance:
                violations.append(
                    f"operation {b.operation_id}: attempt {b.attempt_id} granted at {_when(b)} "
                    f"while attempt {a.attempt_id}, granted at {_when(a)} for {lease:g}s and not "
                    f"ended by its holder, still held its lease ({held:.1f}s left)")
    no_data = None
    if unmeasured:
        no_data = (f"{len(unmeasured)} earlier grant(s) granted again carry no lease_seconds "
                   f"(claimed event data): {', '.join(sorted(unmeasured)[:3])}")
    return InvariantResult("lease-granted-once", len(in_window), tuple(violations), no_data)


def _attempts_in(attempts: Iterable[Attempt], start: float, end: float) -> list[Attempt]:
    return [a for a in attempts if start <= ts(a.created_at) <= end]


def bounded_retries(
    operations: Iterable[Operation], attempts: Sequence[Attempt], start: float, end: float
) -> InvariantResult:
    """Attempts per operation <= 1 + its max_retries, for operations with an attempt created
    in the window (all of the operation's attempts count)."""
    scope = {a.operation_id for a in _attempts_in(attempts, start, end)}
    by_op = group_by(attempts, "operation_id")
    in_scope = [op for op in operations if op.id in scope]
    if not in_scope:
        return InvariantResult("bounded-retries", 0,
                               no_data="no operation had an attempt created in the window")
    judged = [op for op in in_scope if op.max_retries is not None]
    if not judged:
        return InvariantResult(
            "bounded-retries", 0, no_data=f"none of the {len(in_scope)} operations in the window "
            "records max_retries (snapshot/operations.jsonl)")
    violations = []
    for op in judged:
        assert op.max_retries is not None
        n = len(by_op.get(op.id, []))
        if n > 1 + op.max_retries:
            violations.append(f"operation {op.id}: {n} attempts, at most "
                              f"{1 + op.max_retries} allowed (max_retries {op.max_retries})")
    return InvariantResult("bounded-retries", len(judged), tuple(violations))


def placement_violation(op: Operation, agent: AgentRecord | None, agent_name: str | None) -> (
        str | None):
    """Why `agent` may not run `op` under its hard constraints, or None when it may."""
    if agent is None:
        return f"agent {agent_name!r} is not in snapshot/agents.jsonl"
    placement, resources = op.placement, op.resources
    if placement is not None and placement.regions and agent.region not in placement.regions:
        return (f"agent {agent.name} is in region {agent.region!r}, operation allows "
                f"{', '.join(placement.regions)}")
    if placement is not None and placement.dataset and placement.dataset not in agent.datasets:
        return f"agent {agent.name} does not hold dataset {placement.dataset!r}"
    acc = resources.accelerator if resources is not None else None
    if acc is not None and acc.count > 0 and (
            agent.accelerator_type != acc.type or agent.accelerator_count < acc.count):
        return (f"agent {agent.name} has {agent.accelerator_count} x {agent.accelerator_type}, "
                f"operation needs {acc.count} x {acc.type}")
    if (acc is None or acc.count <= 0) and agent.accelerator_count > 0:
        # accelerator nodes are tainted for accelerator work: CPU-only work there is a
        # fallback onto capacity it may not take, whatever its region and data say
        return (f"agent {agent.name} is an accelerator node ({agent.accelerator_count} x "
                f"{agent.accelerator_type}); the operation requested no accelerator")
    return None


def eligible_placement(
    operations: Iterable[Operation],
    attempts: Iterable[Attempt],
    agents: Sequence[AgentRecord] | None,
    start: float,
    end: float,
) -> InvariantResult:
    """Every attempt created in the window ran on an agent meeting its operation's hard
    constraints (region, dataset, accelerator); an agent not in agents.jsonl is a violation."""
    if agents is None:
        return InvariantResult("eligible-placement", 0,
                               no_data="snapshot/agents.jsonl is missing from the evidence")
    scope = _attempts_in(attempts, start, end)
    if not scope:
        return InvariantResult("eligible-placement", 0,
                               no_data="no attempt was created in the window")
    ops = {o.id: o for o in operations}
    by_name = {a.name: a for a in agents}
    violations = []
    for a in scope:
        why = placement_violation(ops[a.operation_id], by_name.get(a.agent_name or ""),
                                  a.agent_name)
        if why:
            violations.append(f"attempt {a.id} of {a.operation_id}: {why}")
    return InvariantResult("eligible-placement", len(scope), tuple(violations))



def served_after_detection(
    requests: Iterable[RequestRecord], faults: Iterable[FaultRecord], start: float, end: float,
    grace: float,
) -> InvariantResult:
    """Once the platform has had ``grace`` seconds to notice a fault (load-balancer health
    checks), no API request fails while the fault lasts: the fault is masked, not merely
    recovered from afterwards. For faults a healthy platform hides completely, such as one
    replica of several losing its database."""
    spans = [(name, t0 + grace, t1) for name, t0, t1 in fault_spans(faults, start, end)]
    if not spans:
        return InvariantResult("served-after-detection", 0,
                               no_data="no fault_start in the window")
    judged, violations = 0, []
    for r in requests:
        if r.route.startswith(NON_API_ROUTE_PREFIXES):
            continue
        t = ts(r.time)
        for name, lo, hi in spans:
            if lo <= t <= hi:
                judged += 1
                if not request_ok(r):
                    violations.append(f"{r.method} {r.route} at {r.time.strftime('%H:%M:%S.%f')[:-3]}"
                                      f" during {name}: {r.status or r.error}")
                break
    if not judged:
        return InvariantResult(
            "served-after-detection", 0, no_data=f"no API request during the fault after the "
            f"{grace:g}s detection grace ({', '.join(n for n, _, _ in spans)})")
    return InvariantResult("served-after-detection", judged, tuple(violations))


def leases_held(
    attempts: Iterable[Attempt], events: Iterable[Event], start: float, end: float
) -> InvariantResult:
    """No attempt that held a lease in the window lost it: no `lease_expired` event and no
    attempt ending `lost` in [start, end]. For faults the platform must absorb without moving
    any work (credential rotation): a lost lease there means an agent was locked out."""
    held = [a for a in attempts if a.started_at is not None and ts(a.started_at) <= end
            and (a.finished_at is None or ts(a.finished_at) >= start)]
    if not held:
        return InvariantResult("leases-held", 0,
                               no_data="no attempt held a lease during the window")
    violations = [f"attempt {e.attempt_id} of {e.operation_id}: lease expired at {_when(e)}"
                  f" ({e.reason or 'no reason'})"
                  for e in sorted(events, key=_order)
                  if e.kind == "lease_expired" and start <= ts(e.time) <= end]
    seen = {v.split()[1] for v in violations}
    violations += [f"attempt {a.id} of {a.operation_id}: ended lost at "
                   f"{a.finished_at.strftime('%H:%M:%S')}" for a in held
                   if a.state == "lost" and a.id not in seen and a.finished_at is not None
                   and start <= ts(a.finished_at) <= end]
    return InvariantResult("leases-held", len(held), tuple(violations))


# A brownout may slow the store's clients down and make each write take a few tries, but the
# request rate the store sees must not grow beyond this multiple of its rate just before the
# fault: capped exponential backoff with jitter keeps it near or below 1 (writers wait), an
# immediate retry loop multiplies it by the number of tries a fast error answer allows.
MAX_RETRY_AMPLIFICATION = 2.0
BROWNOUT_FAULT = "s3_brownout"


def _requests(record: FaultRecord) -> int | None:
    counters = record.details.get("counters")
    value = counters.get("requests") if isinstance(counters, dict) else None
    return value if isinstance(value, int) else None


def retry_amplification(faults: Iterable[FaultRecord], start: float, end: float,
                        limit: float = MAX_RETRY_AMPLIFICATION) -> InvariantResult:
    """The object store's request rate during each S3 brownout in the window, as a multiple
    of its rate in the baseline measured just before it (both counted by the store itself,
    recorded on the brownout's fault_start / fault_end), is at most ``limit``."""
    ordered = sorted(faults, key=lambda f: ts(f.time))
    judged, violations, why, ratios = 0, [], [], []
    for f in ordered:
        if f.fault != BROWNOUT_FAULT or f.event != "fault_start" or not start <= ts(f.time) <= end:
            continue
        stop = next((g for g in ordered if g.fault == BROWNOUT_FAULT and g.event == "fault_end"
                     and g.target == f.target and ts(g.time) >= ts(f.time)), None)
        baseline = f.details.get("baseline") or {}
        base_n, base_s = baseline.get("requests"), baseline.get("seconds")
        first, last = _requests(f), _requests(stop) if stop is not None else None
        if stop is None or first is None or last is None:
            why.append(f"brownout at {f.time.strftime('%H:%M:%S')}: no request counts at "
                       "its start and end")
            continue
        if not isinstance(base_n, int) or not isinstance(base_s, int | float) or base_s <= 0 \
                or base_n <= 0:
            why.append(f"brownout at {f.time.strftime('%H:%M:%S')}: no S3 request in its "
                       "baseline to compare with")
            continue
        seconds = ts(stop.time) - ts(f.time)
        if seconds <= 0:
            continue
        judged += 1
        ratio = ((last - first) / seconds) / (base_n / base_s)
        ratios.append(f"{(last - first) / seconds:.1f}/s against {base_n / base_s:.1f}/s before: "
                      f"{ratio:.2f}x")
        if ratio > limit:
            violations.append(
                f"brownout at {f.time.strftime('%H:%M:%S')}: {last - first} S3 requests in "
                f"{seconds:.1f} s ({(last - first) / seconds:.1f}/s) against {base_n / base_s:.1f}/s "
                f"before it: {ratio:.1f}x (at most {limit:g}x)")
    if not judged:
        return InvariantResult("bounded-retry-amplification", 0,
                               no_data="; ".join(why) or "no S3 brownout in the window")
    return InvariantResult("bounded-retry-amplification", judged, tuple(violations),
                           measured="; ".join(ratios) + f" (at most {limit:g}x)")


# (evidence, window start, window end, detection grace in seconds) -> result
Judge = Callable[[Evidence, float, float, float], InvariantResult]
INVARIANTS: dict[str, Judge] = {
    "fencing": lambda ev, lo, hi, _: fencing(ev.attempts, ev.events, lo, hi),
    "bounded-retries": lambda ev, lo, hi, _: bounded_retries(ev.operations, ev.attempts, lo, hi),
    "eligible-placement": lambda ev, lo, hi, _: eligible_placement(
        ev.operations, ev.attempts, ev.agents, lo, hi),
    "served-after-detection": lambda ev, lo, hi, grace: served_after_detection(
        ev.requests, ev.faults, lo, hi, grace),
    "lease-granted-once": lambda ev, lo, hi, _: lease_granted_once(ev.events, lo, hi),
    "leases-held": lambda ev, lo, hi, _: leases_held(ev.attempts, ev.events, lo, hi),
    "bounded-retry-amplification": lambda ev, lo, hi, _: retry_amplification(ev.faults, lo, hi),
    "serving-availability": lambda ev, lo, hi, _: sv.serving_availability(ev.inference, lo, hi),
    "serving-latency-p99": lambda ev, lo, hi, _: sv.serving_latency_p99(ev.inference, lo, hi),
    "bad-version-share": lambda ev, lo, hi, _: ro.bad_version_share(ev.inference, ev.faults,
                                                                    lo, hi),
    # model-store-unavailable (slo/scale_up_invariants.py)
    "store-outage-availability": lambda ev, lo, hi, _: su.store_outage_availability(
        ev.inference, ev.faults, lo, hi),
    "no-half-loaded-model": lambda ev, lo, hi, _: su.no_half_loaded_model(ev.inference, lo, hi),
    "unready-with-reason": lambda ev, lo, hi, _: su.unready_with_reason(ev.faults, lo, hi),
}


def _pipeline_judge(name: str) -> Judge:
    """The pipeline invariants (slo/pipelines.py)."""
    def judge(ev: Evidence, lo: float, hi: float, _: float) -> InvariantResult:
        if name == "stale-cache-reuse":
            return pl.stale_cache_reuse(ev.pipeline_steps, lo, hi)
        if name == "cache-hit-when-unchanged":
            return pl.cache_hit_when_unchanged(ev.pipeline_steps, lo, hi)
        if name == "side-effect-once":
            return pl.side_effect_once(ev.side_effects, lo, hi)
        if name == "partial-failure-visibility":
            return pl.partial_failure_visibility(ev.pipelines, ev.pipeline_steps, lo, hi)
        if name == "sources-accounted":
            return pl.sources_accounted(ev.pipelines, ev.pipeline_steps, ev.faults, lo, hi)
        return pl.release_after_checks(ev.pipelines, ev.pipeline_steps, lo, hi)
    return judge


for _name in ("stale-cache-reuse", "cache-hit-when-unchanged", "side-effect-once",
              "partial-failure-visibility", "release-after-checks", "sources-accounted"):
    INVARIANTS[_name] = _pipeline_judge(_name)


def _storage_judge(name: str) -> Judge:
    """The database storage invariants (slo/storage_invariants.py)."""
    def judge(ev: Evidence, lo: float, hi: float, _: float) -> InvariantResult:
        if name == "bounded-latency":
            return st.bounded_latency(ev.requests, ev.faults, lo, hi)
        return st.promotions(ev.faults, lo, hi, 0 if name == "no-failover" else 1, name)
    return judge


for _name in ("bounded-latency", "no-failover", "at-most-one-failover"):
    INVARIANTS[_name] = _storage_judge(_name)


def _checkpoint_judge(name: str) -> Judge:
    """The checkpoint-power-loss invariants (slo/checkpoint_invariants.py)."""
    def judge(ev: Evidence, lo: float, hi: float, _: float) -> InvariantResult:
        index = ObjectIndex.of(ev.objects)
        runs = ck.interrupted(ev.faults, ev.attempts, ev.events, index, lo, hi)
        if name == "reported-checkpoints-durable":
            return ck.reported_checkpoints_durable(runs, lo, hi)
        if name == "durable-resume":
            return ck.durable_resume(runs, ev.attempts, index, lo, hi)
        return ck.power_loss_visible(runs, ev.faults, ev.events, lo, hi)
    return judge


for _name in ("reported-checkpoints-durable", "durable-resume", "power-loss-visible"):
    INVARIANTS[_name] = _checkpoint_judge(_name)


def _outcome_judge(name: str) -> Judge:
    """The outcome invariants (slo/outcome_invariants.py)."""
    def judge(ev: Evidence, lo: float, hi: float, _: float) -> InvariantResult:
        if name == "artifacts-complete":
            return oc.artifacts_complete(ev.attempts, ev.events, ObjectIndex.of(ev.objects),
                                         lo, hi)
        if name == "routed-to-live-agents":
            return oc.routed_to_live_agents(ev.attempts, ev.agent_liveness, lo, hi)
        return oc.retired_credentials_refused(ev.faults, lo, hi)
    return judge


for _name in ("artifacts-complete", "routed-to-live-agents", "retired-credentials-refused"):
    INVARIANTS[_name] = _outcome_judge(_name)


def _tracking_judge(name: str) -> Judge:
    """The tracking invariants (slo/tracking_invariants.py)."""
    judges = {"metric-points-kept": tr.metric_points_kept,
              "one-run-per-attempt": tr.one_run_per_attempt,
              "runs-terminated": tr.runs_terminated,
              "training-unaffected": tr.training_unaffected}

    def judge(ev: Evidence, lo: float, hi: float, _: float) -> InvariantResult:
        subjects = tr.tracked(ev.attempts, ev.events, ev.tracking_runs or (), lo, hi)
        return judges[name](subjects, ev.tracking_runs)
    return judge


for _name in ("metric-points-kept", "one-run-per-attempt", "runs-terminated",
              "training-unaffected"):
    INVARIANTS[_name] = _tracking_judge(_name)


# (evidence, window start, window end, the recovery objective's RTO in seconds) -> result:
# the invariants whose promise is "within the RTO"
RtoJudge = Callable[[Evidence, float, float, float], InvariantResult]


def _overload_judge(name: str) -> RtoJudge:
    """The overload invariants (slo/overload_invariants.py)."""
    def judge(ev: Evidence, lo: float, hi: float, rto: float) -> InvariantResult:
        if name == "goodput-recovered":
            return ov.goodput_recovered(ev.requests, ev.faults, lo, hi, rto)
        return ov.request_amplification(ev.requests, ev.faults, lo, hi, rto)
    return judge


RTO_INVARIANTS: dict[str, RtoJudge] = {
    **{_name: _overload_judge(_name)
       for _name in ("goodput-recovered", "bounded-request-amplification")},
    "restarted-within-rto": lambda ev, lo, hi, rto: sv.restarted_within_rto(ev.faults, lo, hi, rto),
    "rolled-back-within-rto": lambda ev, lo, hi, rto: ro.rolled_back_within_rto(ev.faults, lo, hi,
                                                                                rto),
    "scaled-up-ready-within-rto": lambda ev, lo, hi, rto: su.scaled_up_ready_within_rto(
        ev.faults, lo, hi, rto),
}
KNOWN_INVARIANTS: tuple[str, ...] = (*INVARIANTS, *RTO_INVARIANTS)


def check_invariant(name: str, evidence: Evidence, start: float, end: float,
                    detection_grace: float = 10.0,
                    rto_seconds: float | None = None) -> InvariantResult:
    """Judge one named invariant over [start, end] (the experiment's fault start to horizon);
    ``rto_seconds``: the recovery objective's RTO, for the invariants promised within it."""
    if name in RTO_INVARIANTS:
        if rto_seconds is None:
            return InvariantResult(name, 0, no_data="no RTO to judge it against")
        return RTO_INVARIANTS[name](evidence, start, end, rto_seconds)
    return INVARIANTS[name](evidence, start, end, detection_grace)
