"""Invariants of the checkpoint-power-loss class (pure; registered in slo/invariants.py).

An agent's host loses power (fault ``power_loss``, environments/local/power_loss.py): every write on
its node disk that was not fsynced is gone. What a job promised about its checkpoints before
that, it promised with a record in the object store (``local-checkpoints/<op>/attempt-<n>/
step-<N>.json``, written once the bytes were durable on the node) and a ``checkpoint_written``
event. Judged per operation that ran again after a power loss of the window:

* ``reported-checkpoints-durable``: the first resume after the loss starts at or after the
  newest checkpoint promised before it (nothing reported was lost with the unsynced writes);
* ``durable-resume``: every resume after the loss starts from a checkpoint recorded durably by
  an earlier attempt (a node-local copy: its record; the store's copy: a manifest that
  verifies), never from bytes nobody recorded (a write the loss cut short);
* ``power-loss-visible``: each power loss carries faultfs's crash report (what it dropped),
  and every promised checkpoint the resume could not use is named by a
  ``checkpoint_skipped_local`` event: the loss is in the evidence, not only in the numbers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slo.evidence import Attempt, Event, FaultRecord
from slo.invariant_result import InvariantResult
from slo.sli import ObjectIndex, ts

FAULT = "power_loss"
_RECORD = re.compile(r"^local-checkpoints/(?P<op>[^/]+)/attempt-(?P<n>\d+)/step-(?P<step>\d{8})\.json$")


@dataclass(frozen=True)
class Interrupted:
    """One operation's run across a power loss."""
    operation_id: str
    lost_at: float
    promised: int  # newest checkpoint step promised before the loss (record or report)
    resume: Event | None  # the first ``resumed`` event of a later attempt (None: from scratch)
    started_over: bool  # a later attempt made progress without a resumed event (step 0)
    resumes: tuple[Event, ...]  # every resume of a later attempt


def _losses(faults: Iterable[FaultRecord], start: float, end: float) -> list[FaultRecord]:
    return sorted((f for f in faults if f.fault == FAULT and f.event == "fault_start"
                   and start <= ts(f.time) <= end), key=lambda f: ts(f.time))


def _records(index: ObjectIndex) -> dict[tuple[str, int], set[int]]:
    """(operation, attempt number) -> the steps it recorded as node-local checkpoints."""
    out: dict[tuple[str, int], set[int]] = {}
    for key in index.objects:
        m = _RECORD.match(key)
        if m:
            out.setdefault((m["op"], int(m["n"])), set()).add(int(m["step"]))
    return out


def interrupted(faults: Iterable[FaultRecord], attempts: Sequence[Attempt],
                events: Sequence[Event], index: ObjectIndex, start: float,
                end: float) -> list[Interrupted]:
    """Every operation with a checkpoint promised before a power loss of the window and an
    attempt created after it that ran (resumed or made progress)."""
    losses = _losses(faults, start, end)
    if not losses:
        return []
    records = _records(index)
    by_op: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_op.setdefault(a.operation_id, []).append(a)
    out = []
    for op_id, op_attempts in by_op.items():
        for loss in losses:
            t = ts(loss.time)
            before = [a for a in op_attempts if ts(a.created_at) <= t]
            after = {a.id for a in op_attempts if ts(a.created_at) > t}
            if not before or not after:
                continue
            numbers = {a.id: a.number for a in before}
            promised = [int(e.data["step"]) for e in events
                        if e.kind == "checkpoint_written" and e.attempt_id in numbers
                        and isinstance(e.data.get("step"), int)]
            promised += [s for a in before for s in records.get((op_id, a.number), ())]
            if not promised:
                continue
            later = sorted((e for e in events if e.attempt_id in after), key=lambda e: ts(e.time))
            resumes = tuple(e for e in later if e.kind == "resumed")
            progressed = any(e.kind == "progress" for e in later)
            if not resumes and not progressed:
                continue  # nothing ran after the loss (yet): nothing to judge
            out.append(Interrupted(op_id, t, max(promised), resumes[0] if resumes else None,
                                   not resumes, resumes))
            break
    return out


def _from_step(e: Event | None) -> int:
    value = e.data.get("from_step") if e else 0
    return int(value) if isinstance(value, int | float) else 0


def reported_checkpoints_durable(runs: Sequence[Interrupted], start: float,
                                 end: float) -> InvariantResult:
    name = "reported-checkpoints-durable"
    if not runs:
        return InvariantResult(name, 0, no_data="no operation with a checkpoint promised before "
                               "a power loss ran again in the window")
    violations = []
    for r in runs:
        step = _from_step(r.resume)
        if step < r.promised:
            violations.append(f"operation {r.operation_id}: resumed from step {step} after the "
                              f"power loss, but step {r.promised} had been reported durable "
                              "before it")
    return InvariantResult(name, len(runs), tuple(violations),
                           measured=", ".join(f"promised {r.promised}, resumed "
                                              f"{_from_step(r.resume)}" for r in runs))


def durable_resume(runs: Sequence[Interrupted], attempts: Sequence[Attempt], index: ObjectIndex,
                   start: float, end: float) -> InvariantResult:
    name = "durable-resume"
    resumes = [(r, e) for r in runs for e in r.resumes]
    if not resumes:
        return InvariantResult(name, 0, no_data="no resume after a power loss in the window")
    numbers = {a.id: a.number for a in attempts}
    violations = []
    for r, e in resumes:
        step = _from_step(e)
        mine = numbers.get(str(e.attempt_id), 10**9)
        earlier = sorted({n for a, n in numbers.items() if n < mine
                          and any(x.id == a and x.operation_id == r.operation_id
                                  for x in attempts)})
        if e.data.get("source") == "local":
            keys = [f"local-checkpoints/{r.operation_id}/attempt-{n}/step-{step:08d}.json"
                    for n in earlier]
            if not any(k in index.objects for k in keys):
                violations.append(f"operation {r.operation_id}: resumed from step {step} of "
                                  f"the node's disk ({e.data.get('slot')}), which no attempt "
                                  "recorded as durable")
            elif e.data.get("verified") is not True:
                violations.append(f"operation {r.operation_id}: resumed from the node's copy of "
                                  f"step {step} without checking it against its record")
        elif step > 0:
            prefixes = [f"checkpoints/{r.operation_id}/attempt-{n}/step-{step:08d}"
                        for n in earlier]
            if all(index.verify(p, "MANIFEST.json") is not None for p in prefixes):
                violations.append(f"operation {r.operation_id}: resumed from step {step} of the "
                                  "store, whose manifest does not verify")
    return InvariantResult(name, len(resumes), tuple(violations))


def power_loss_visible(runs: Sequence[Interrupted], faults: Iterable[FaultRecord],
                       events: Sequence[Event], start: float, end: float) -> InvariantResult:
    name = "power-loss-visible"
    losses = _losses(faults, start, end)
    if not losses:
        return InvariantResult(name, 0, no_data="no power loss in the window")
    ends = [f for f in faults if f.fault == FAULT and f.event == "fault_end"]
    violations = []
    for loss in losses:
        t = ts(loss.time)
        closing = next((f for f in sorted(ends, key=lambda f: ts(f.time))
                        if f.target == loss.target and ts(f.time) >= t), None)
        crash = (closing.details.get("crash") if closing else None) or {}
        if not isinstance(crash.get("dropped_files"), list) or "dropped_bytes" not in crash:
            violations.append(f"power loss of {loss.target}: no crash report (what it dropped) "
                              "on the fault timeline")
    for r in runs:
        named = {int(e.data["step"]) for e in events if e.kind == "checkpoint_skipped_local"
                 and e.operation_id == r.operation_id and isinstance(e.data.get("step"), int)}
        resumed = _from_step(r.resume)
        if r.promised > resumed and r.promised not in named:
            violations.append(f"operation {r.operation_id}: the checkpoint of step "
                              f"{r.promised} was lost (resumed from {resumed}) and no event "
                              "names it")
    return InvariantResult(name, len(losses), tuple(violations))
