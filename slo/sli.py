"""SLI math on evidence records (pure: no I/O, no Prometheus, no platform specifics).

Every SLI reduces to a stream of Outcomes (time, good?). Ratio SLIs yield one outcome per
event (request, acknowledged submission, attempt, write, terminal operation); time-slice
SLIs yield one outcome per slice. Times are epoch seconds.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from slo import ledger as ledger_rules
from slo.evidence import Attempt, Event, Operation, RequestRecord, StoredObject
from slo.inference_ledger import InferenceRecord
from slo.ledger import LedgerEntry

TERMINAL_OPERATION_STATES = frozenset({"succeeded", "failed", "canceled"})
LIVE_ATTEMPT_STATES = frozenset({"dispatched", "running"})
# event kinds that prove a running attempt is alive (docs/EVIDENCE.md)
PROGRESS_KINDS = frozenset(
    {
        "progress",
        "heartbeat",
        "checkpoint_started",
        "checkpoint_written",
        "artifact_written",
        "resumed",
        "log",
    }
)


def ts(value: datetime) -> float:
    return value.timestamp()


@dataclass(frozen=True)
class Outcome:
    time: float
    good: bool
    subject: str = ""


def count(outcomes: Iterable[Outcome]) -> tuple[int, int]:
    """(good, total)."""
    good = total = 0
    for o in outcomes:
        total += 1
        good += o.good
    return good, total


def in_window(outcomes: Iterable[Outcome], start: float, end: float) -> list[Outcome]:
    return [o for o in outcomes if start <= o.time <= end]


# --------------------------------------------------------------------------- per-event SLIs


def request_ok(record: RequestRecord) -> bool:
    """Answered without a 5xx or a transport error/timeout; 4xx is the client's problem."""
    return record.error is None and record.status is not None and record.status < 500


# Routes the load generator prefixes with "s3:" are object-store downloads, not the platform's
# API: an artifact-store outage must show in artifact SLIs, not as API unavailability. Those
# with "serving:" are predictions, judged by the serving SLIs (inference.jsonl).
NON_API_ROUTE_PREFIXES = ("s3:", "serving:")


def api_availability(requests: Iterable[RequestRecord]) -> list[Outcome]:
    return [Outcome(ts(r.time) + r.latency_ms / 1000.0, request_ok(r), r.route) for r in requests
            if not r.route.startswith(NON_API_ROUTE_PREFIXES)]


# --------------------------------------------------------------------------- serving SLIs
# (slo/inference_ledger.py: one record per prediction request a client sent; docs/serving.md)


def _done_at(record: InferenceRecord) -> float:
    return ts(record.time) + record.latency_ms / 1000.0


def serving_success(records: Iterable[InferenceRecord]) -> list[Outcome]:
    """One outcome per request: answered (no transport error, no 5xx)?"""
    return [Outcome(_done_at(r), r.answered, r.version or "") for r in records]


def serving_latency(records: Iterable[InferenceRecord], threshold_ms: float) -> list[Outcome]:
    """One outcome per answered request: within ``threshold_ms``? A share of 0.99 good is a
    p99 within the threshold; failed requests belong to serving_success, not here."""
    return [Outcome(_done_at(r), r.latency_ms <= threshold_ms, r.version or "")
            for r in records if r.answered]


def serving_correctness(records: Iterable[InferenceRecord]) -> list[Outcome]:
    """One outcome per answered golden-set request: the golden answer?"""
    return [Outcome(_done_at(r), bool(r.correct), r.version or "")
            for r in records if r.answered and r.correct is not None]


def serving_good_version(records: Iterable[InferenceRecord],
                         bad_versions: frozenset[str]) -> list[Outcome]:
    """One outcome per answered request: answered by a version not in ``bad_versions``? The
    bad share is what a bad rollout cost its clients."""
    return [Outcome(_done_at(r), r.version not in bad_versions, r.version or "")
            for r in records if r.answered]


def latency_quantile(records: Iterable[InferenceRecord], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of answered requests' latency in ms; None if none."""
    values = sorted(r.latency_ms for r in records if r.answered)
    if not values:
        return None
    return values[max(0, math.ceil(q * len(values)) - 1)]


@dataclass(frozen=True)
class DurabilityAudit:
    outcomes: tuple[Outcome, ...]
    missing: tuple[str, ...]  # idempotency keys acknowledged but not in the store
    # acknowledged keys stored more than once, or acknowledged under two different operation
    # ids (the same key created a new operation)
    duplicated: tuple[str, ...]
    # keys whose acknowledged operation id is not in the store while the key is: the platform
    # answers for that submission under a new id
    matched_by_key_only: tuple[str, ...] = ()


def submission_durability(
    ledger: Iterable[LedgerEntry], operations: Iterable[Operation]
) -> DurabilityAudit:
    """Each acknowledged (project, idempotency key) must exist exactly once in the store, under
    the operation id it was acknowledged with.

    The ledger may hold the same key twice (a client retry answered 200 with the same
    operation); that is one submission. The same key acknowledged with two different operation
    ids is a duplicate even if the store kept only one of them. Matching is by key, then by
    operation id when the store lacks the key."""
    ledger = list(ledger)
    by_id: dict[str, Operation] = {}
    per_key: dict[tuple[str, str], int] = {}
    for op in operations:
        by_id[op.id] = op
        if op.idempotency_key is not None:
            k = (op.project, op.idempotency_key)
            per_key[k] = per_key.get(k, 0) + 1
    acked = ledger_rules.submissions(ledger)
    # lost: one definition for the SLI and the database restore (slo/ledger.py)
    lost = {(e.project, e.idempotency_key) for e in ledger_rules.lost(
        ledger, set(by_id), {k for k, n in per_key.items() if n})}
    outcomes, missing, duplicated, by_key_only = [], [], [], []
    for k, sub in sorted(acked.items(), key=lambda kv: kv[1].first.acked_at):
        entry, ids = sub.first, sub.operation_ids
        stored = per_key.get(k, 0)
        if stored == 0:
            # the store lost the key column but kept the operation(s): still present
            stored = sum(1 for i in ids if i in by_id)
        # not ids.issubset(by_id): that copies the dict into a set per submission (quadratic)
        elif not all(i in by_id for i in ids):
            by_key_only.append(entry.idempotency_key)
        if k in lost:
            missing.append(entry.idempotency_key)
        elif stored > 1 or len(ids) > 1:
            duplicated.append(entry.idempotency_key)
        good = stored == 1 and len(ids) == 1
        outcomes.append(Outcome(ts(entry.acked_at), good, entry.idempotency_key))
    return DurabilityAudit(tuple(outcomes), tuple(missing), tuple(duplicated), tuple(by_key_only))


def _passes(value: float, op: str, threshold: float) -> bool:
    return {
        "lt": value < threshold,
        "lte": value <= threshold,
        "gt": value > threshold,
        "gte": value >= threshold,
    }[op]


def scheduling_delay(
    attempts: Iterable[Attempt], threshold: float, op: str, snapshot: float
) -> list[Outcome]:
    """Dispatch -> running per attempt. An attempt still waiting at the snapshot counts once
    it is already over the threshold; one that failed before starting is startup's business."""
    out = []
    for a in attempts:
        created = ts(a.created_at)
        if a.started_at is not None:
            delay = ts(a.started_at) - created
            out.append(Outcome(ts(a.started_at), _passes(delay, op, threshold), a.id))
        elif a.state == "dispatched" and not _passes(snapshot - created, op, threshold):
            out.append(Outcome(snapshot, False, a.id))
    return out


def startup_success(attempts: Iterable[Attempt]) -> list[Outcome]:
    """Attempts that reached running, against attempts that failed before it (the image,
    credential or data failure the SLI names, as the live metric controlplane_startup_failures
    counts). An attempt lost before it started (its agent died or was cut off) is not a start
    that failed: its operation's fate is judged by time-to-usable-result and durability."""
    out = []
    for a in attempts:
        if a.started_at is not None:
            out.append(Outcome(ts(a.started_at), True, a.id))
        elif a.state == "failed":
            when = a.finished_at or a.created_at
            out.append(Outcome(ts(when), False, a.id))
    return out


def success_time(op: Operation, events: Sequence[Event]) -> float | None:
    for e in events:
        if e.to_state == "succeeded":
            return ts(e.time)
    if op.state == "succeeded":
        return ts(op.updated_at or op.created_at)
    return None


def time_to_usable_result(
    operations: Iterable[Operation],
    events_by_op: dict[str, list[Event]],
    threshold: float,
    op: str,
    snapshot: float,
) -> list[Outcome]:
    out = []
    for o in operations:
        created = ts(o.created_at)
        done = success_time(o, events_by_op.get(o.id, []))
        if done is not None:
            out.append(Outcome(done, _passes(done - created, op, threshold), o.id))
        elif o.state == "failed":
            out.append(Outcome(ts(o.updated_at or o.created_at), False, o.id))
        elif o.state not in TERMINAL_OPERATION_STATES and not _passes(
            snapshot - created, op, threshold
        ):
            out.append(Outcome(snapshot, False, o.id))
    return out


# --------------------------------------------------------------------------- time slices

Interval = tuple[float, float]


def slices(start: float, end: float, width: float) -> list[Interval]:
    if width <= 0:
        raise ValueError("slice width must be > 0")
    n = max(1, math.ceil((end - start) / width - 1e-9))
    return [(start + i * width, min(end, start + (i + 1) * width)) for i in range(n)]


# Waiting for a destination: eligible and queued, or blocked because every eligible
# destination is down or full. Both are time the user waits before dispatch (queue age);
# `retrying` is a deliberate backoff and is not.
WAITING_STATES = frozenset({"queued", "blocked"})


def queued_intervals(
    events_by_op: dict[str, list[Event]], snapshot: float
) -> list[tuple[str, float, float]]:
    """(operation, started waiting, stopped waiting) from state-change events: a stretch in
    WAITING_STATES (queued <-> blocked moves continue it), ordered by time."""
    out = []
    for op_id, events in events_by_op.items():
        since: float | None = None
        for e in events:
            if e.to_state is None:
                continue
            if e.to_state in WAITING_STATES and since is None:
                since = ts(e.time)
            elif e.to_state not in WAITING_STATES and since is not None:
                out.append((op_id, since, ts(e.time)))
                since = None
        if since is not None:
            out.append((op_id, since, snapshot))
    return out


def max_age_in(intervals: Iterable[tuple[str, float, float]], lo: float, hi: float) -> float:
    """Oldest wait seen during [lo, hi): an interval's age grows until it ends or hi."""
    best = 0.0
    for _, start, end in intervals:
        if start < hi and end > lo:
            best = max(best, min(end, hi) - start)
    return best


def queue_age(
    intervals: Sequence[tuple[str, float, float]],
    start: float,
    end: float,
    width: float,
    threshold: float,
    op: str,
) -> list[Outcome]:
    return [
        Outcome(hi, _passes(max_age_in(intervals, lo, hi), op, threshold), f"slice@{lo:.0f}")
        for lo, hi in slices(start, end, width)
    ]


def stale_intervals(
    attempts: Iterable[Attempt],
    signals_by_attempt: dict[str, list[float]],
    bound: float,
    snapshot: float,
) -> list[Interval]:
    """Stretches during which a running attempt had been silent for longer than `bound`."""
    out = []
    for a in attempts:
        if a.started_at is None:
            continue
        start = ts(a.started_at)
        end = ts(a.finished_at) if a.finished_at is not None else snapshot
        points = (
            [start] + sorted(t for t in signals_by_attempt.get(a.id, []) if start < t < end) + [end]
        )
        for prev, nxt in itertools.pairwise(points):
            if nxt - prev > bound:
                out.append((prev + bound, nxt))
    return out


def active_progress(
    stale: Sequence[Interval], start: float, end: float, width: float
) -> list[Outcome]:
    return [
        Outcome(hi, not any(s < hi and e > lo for s, e in stale), f"slice@{lo:.0f}")
        for lo, hi in slices(start, end, width)
    ]


# --------------------------------------------------------------------------- object audit


@dataclass
class ObjectIndex:
    objects: dict[str, StoredObject] = field(default_factory=dict)

    @classmethod
    def of(cls, objects: Iterable[StoredObject]) -> ObjectIndex:
        return cls({o.key: o for o in objects})

    def verify(self, prefix: str, manifest_name: str) -> str | None:
        """None when `prefix/manifest_name` exists and every file it lists is present with
        the listed sha256; otherwise the reason."""
        prefix = prefix.rstrip("/")
        manifest = self.objects.get(f"{prefix}/{manifest_name}")
        if manifest is None:
            return f"no {manifest_name} under {prefix}/"
        files = manifest_files(manifest.content)
        if files is None:
            return f"{prefix}/{manifest_name} has no readable file list"
        for name, digest in files.items():
            obj = self.objects.get(f"{prefix}/{name}")
            if obj is None:
                return f"{prefix}/{name} listed in {manifest_name} but missing"
            if digest and obj.sha256 and obj.sha256 != digest:
                return f"{prefix}/{name} checksum differs from {manifest_name}"
        return None


def manifest_files(content: dict | None) -> dict[str, str] | None:
    """Accepts {"files": {name: sha256}}, {"files": [{"name"/"path", "sha256"}]} or {name: sha256}."""
    if not isinstance(content, dict):
        return None
    files = content.get("files", content)
    if isinstance(files, list):
        out = {}
        for item in files:
            if isinstance(item, dict) and (item.get("name") or item.get("path")):
                out[str(item.get("name") or item.get("path"))] = str(item.get("sha256") or "")
        return out
    if isinstance(files, dict):
        return {
            str(k): str(v) if isinstance(v, str) else str((v or {}).get("sha256", ""))
            for k, v in files.items()
        }
    return None


def write_prefix(event: Event, attempt_numbers: dict[str, int]) -> tuple[str, str] | None:
    """(prefix, manifest file) of a reported write, per docs/CONTRACTS.md section 3."""
    if event.kind == "checkpoint_written":
        prefix = event.data.get("prefix")
        if (
            not prefix
            and event.operation_id
            and event.attempt_id in attempt_numbers
            and "step" in event.data
        ):
            n = attempt_numbers[event.attempt_id]
            prefix = (
                f"checkpoints/{event.operation_id}/attempt-{n}/step-{int(event.data['step']):08d}"
            )
        return (str(prefix), "MANIFEST.json") if prefix else None
    if event.kind == "artifact_written":
        prefix = event.data.get("prefix")
        if not prefix and event.operation_id and event.attempt_id in attempt_numbers:
            prefix = f"artifacts/{event.operation_id}/attempt-{attempt_numbers[event.attempt_id]}"
        return (str(prefix), "COMPLETE.json") if prefix else None
    return None


def artifact_write_success(
    events: Iterable[Event], attempt_numbers: dict[str, int], index: ObjectIndex
) -> list[Outcome]:
    """A write the platform reported as done must be complete and verifiable in the store."""
    out = []
    for e in events:
        if e.kind == "checkpoint_written" and e.data.get("location") == "local":
            # kept on the node's own disk: what reached the store is its record (checksums);
            # whether its bytes were durable before it was reported is the
            # checkpoint-power-loss class's invariant (slo/checkpoint_invariants.py)
            key = e.data.get("record")
            ok = isinstance(key, str) and key in index.objects
            out.append(Outcome(ts(e.time), ok, str(key) if ok else
                               f"node-local checkpoint without its record in the store: {key}"))
            continue
        target = write_prefix(e, attempt_numbers)
        if target is None:
            if e.kind in ("checkpoint_written", "artifact_written"):
                out.append(Outcome(ts(e.time), False, f"{e.kind} without a prefix"))
            continue
        reason = index.verify(*target)
        out.append(Outcome(ts(e.time), reason is None, reason or target[0]))
    return out


def terminal_state_consistency(
    operations: Iterable[Operation],
    attempts_by_op: dict[str, list[Attempt]],
    events_by_op: dict[str, list[Event]],
    index: ObjectIndex,
) -> list[Outcome]:
    out = []
    for o in operations:
        if o.state not in TERMINAL_OPERATION_STATES:
            continue
        attempts = attempts_by_op.get(o.id, [])
        succeeded = [a for a in attempts if a.state == "succeeded"]
        reasons = []
        if any(a.state in LIVE_ATTEMPT_STATES for a in attempts):
            reasons.append("a live attempt under a terminal operation")
        if o.state == "succeeded":
            if len(succeeded) != 1:
                reasons.append(f"{len(succeeded)} succeeded attempts (want 1)")
            elif why := index.verify(
                f"artifacts/{o.id}/attempt-{succeeded[0].number}", "COMPLETE.json"
            ):
                reasons.append(why)
        elif succeeded:
            reasons.append(f"{o.state} but {len(succeeded)} attempt(s) succeeded")
        when = success_time(o, events_by_op.get(o.id, [])) or ts(o.updated_at or o.created_at)
        out.append(Outcome(when, not reasons, f"{o.id}: {'; '.join(reasons)}" if reasons else o.id))
    return out


# --------------------------------------------------------------------------- time series


def rolling_ratio(
    outcomes: Sequence[Outcome], times: Sequence[float], window: float
) -> list[float | None]:
    """Share of good outcomes in (t - window, t] for each t; None where there are none."""
    ordered = sorted(outcomes, key=lambda o: o.time)
    stamps = [o.time for o in ordered]
    good_prefix = [0]
    for o in ordered:
        good_prefix.append(good_prefix[-1] + o.good)
    out: list[float | None] = []
    for t in times:
        lo = bisect.bisect_right(stamps, t - window)
        hi = bisect.bisect_right(stamps, t)
        n = hi - lo
        out.append(None if n == 0 else (good_prefix[hi] - good_prefix[lo]) / n)
    return out


def sample_times(start: float, end: float, step: float) -> list[float]:
    if step <= 0:
        raise ValueError("step must be > 0")
    n = math.floor((end - start) / step + 1e-9)
    return [start + i * step for i in range(n + 1)]


def first_breach(
    times: Sequence[float],
    values: Sequence[float | None],
    target: float,
    after: float,
    until: float = math.inf,
) -> float | None:
    """First sample in [after, until] below target."""
    for t, v in zip(times, values):
        if after <= t <= until and v is not None and v < target:
            return t
    return None


def recovery_time(
    times: Sequence[float],
    values: Sequence[float | None],
    target: float,
    fault_start: float,
    hold: int,
    horizon: float = math.inf,
) -> float | None:
    """Seconds from fault start until the SLI is back within objective for good: the first
    sample of the final good run in [fault_start, horizon] that holds `hold` samples with data
    and is not followed by another breach before the horizon. 0 when it never breached in that
    span. None when it is still breached at the horizon, or came back too late to hold: a
    breach that starts long after the fault (work stuck for good) must not read as recovered."""
    seen = [(t, v) for t, v in zip(times, values) if fault_start <= t <= horizon and v is not None]
    last_breach = max((i for i, (_, v) in enumerate(seen) if v < target), default=None)
    if last_breach is None:
        return 0.0
    good_run = seen[last_breach + 1 :]
    if len(good_run) < hold:
        return None
    return good_run[0][0] - fault_start


# --------------------------------------------------------------------------- experiment data


def progress_steps(events: Iterable[Event]) -> dict[str, float]:
    """Highest step each attempt reported (progress or checkpoint events)."""
    best: dict[str, float] = {}
    for e in events:
        step = e.data.get("step")
        if (
            e.attempt_id
            and e.kind in ("progress", "checkpoint_written")
            and isinstance(step, (int, float))
        ):
            best[e.attempt_id] = max(best.get(e.attempt_id, 0.0), float(step))
    return best


@dataclass(frozen=True)
class ProgressLoss:
    operation_id: str
    attempt_id: str
    lost_steps: float
    intervals: float | None  # lost steps / checkpoint interval, when the interval is known
    resumed_from: float
    torn_checkpoint_used: bool


def checkpoint_progress_loss(
    attempts: Sequence[Attempt],
    events: Sequence[Event],
    checkpoint_every: float | None,
    index: ObjectIndex,
) -> list[ProgressLoss]:
    """For each retry attempt of one operation that ran: steps recomputed vs the best earlier
    attempt, and whether it resumed from a checkpoint that is not complete (torn).

    An attempt that never reached its resume point recomputed nothing: one lost on an agent
    that was already down, before it was claimed, or one whose workload was started and
    killed before it chose where to resume (a workload says so at once: ``resumed``, or its
    first ``progress`` from scratch). It is not a loss itself, and the attempt that ran after
    it is measured against the best progress before either."""
    steps = progress_steps(events)
    resumed = {
        e.attempt_id: float(e.data.get("from_step", 0))
        for e in events
        if e.kind == "resumed" and e.attempt_id
    }
    local = {e.attempt_id for e in events
             if e.kind == "resumed" and e.attempt_id and e.data.get("source") == "local"}
    ordered = sorted(attempts, key=lambda a: a.number)
    out = []
    for i, a in enumerate(ordered):
        if i == 0 or not _ran(a, steps, resumed):
            continue
        before = max((steps.get(p.id, 0.0) for p in ordered[:i]), default=0.0)
        start = resumed.get(a.id, 0.0)
        lost = max(0.0, before - start)
        torn = False
        if start > 0 and a.id in local:
            # a node-local copy: complete only when an earlier attempt recorded it in the
            # store (written once its bytes were durable on the node)
            torn = not any(
                f"local-checkpoints/{a.operation_id}/attempt-{p.number}/step-{int(start):08d}.json"
                in index.objects for p in ordered[:i])
        elif start > 0:
            candidates = [
                f"checkpoints/{a.operation_id}/attempt-{p.number}/step-{int(start):08d}"
                for p in ordered[:i]
            ]
            torn = all(index.verify(c, "MANIFEST.json") is not None for c in candidates)
        intervals = lost / checkpoint_every if checkpoint_every else None
        out.append(ProgressLoss(a.operation_id, a.id, lost, intervals, start, torn))
    return out


def _ran(a: Attempt, steps: dict[str, float], resumed: dict[str, float]) -> bool:
    # Where it restarted from is known only once it resumed or made progress. A start alone
    # is not: measured on an upgrade game day, a workload killed 0.3 s after its start by its
    # agent's drain was counted as restarting from step 0 (174 steps "lost") while the next
    # attempt resumed from the checkpoint at 170. Its "started" transition is not required
    # either: that may be what was lost.
    return a.id in steps or a.id in resumed


def group_by(items: Iterable, key: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for item in items:
        k = getattr(item, key)
        if k is not None:
            out.setdefault(k, []).append(item)
    return out
