"""model-store-unavailable's promises (pure): the model store is cut off while serving scales
up (docs/serving.md, "model-store-unavailable"). Judged on the inference ledger and on the
timeline's notes of the scale-up (``serving_scale``) and of what the new replica said of its
model (``serving_replica_state``, environments/local/serving_scale.py), over one experiment's
[fault start, horizon].

Only the class's RecoveryObjective names them: a run without it keeps its verdict.
"""

from __future__ import annotations

from collections.abc import Iterable

from slo.evidence import FaultRecord
from slo.inference_ledger import InferenceRecord
from slo.invariant_result import InvariantResult, fault_spans
from slo.sli import count, serving_correctness, serving_success, ts

STORE_FAULT = "artifact_store_unreachable"
SCALE_NOTE = "serving_scale"
STATE_NOTE = "serving_replica_state"
# The replicas loaded before the outage never read the store again: the outage may cost at
# most 1 % of the predictions sent during it (the same allowance as a replica lost).
AVAILABILITY_TARGET = 0.99
MIN_REQUESTS = 100  # below this a ratio says nothing about a 1 % allowance
HAPROXY_UP = "2"  # srv_op_state of a server taking requests


def outages(faults: Iterable[FaultRecord], start: float, end: float) -> list[tuple[float, float]]:
    """(start, end) of every cut-off of the model store begun in [start, end]."""
    return [(t0, t1) for label, t0, t1 in fault_spans(faults, start, end)
            if label.split(" ")[0] == STORE_FAULT]


def _notes(faults: Iterable[FaultRecord], what: str, start: float,
           end: float) -> list[FaultRecord]:
    return sorted((f for f in faults if f.event == "note" and f.fault == what
                   and start <= ts(f.time) <= end), key=lambda f: ts(f.time))


def scaled_up(faults: Iterable[FaultRecord], start: float, end: float) -> list[str]:
    """The replicas a scale-up started in [start, end], in order."""
    return [r for n in _notes(faults, SCALE_NOTE, start, end)
            for r in n.details.get("started") or ()]


def store_outage_availability(records: Iterable[InferenceRecord], faults: Iterable[FaultRecord],
                              start: float, end: float, target: float = AVAILABILITY_TARGET,
                              min_requests: int = MIN_REQUESTS) -> InvariantResult:
    """While the store is cut off, the replicas already loaded keep answering: at least
    ``target`` of at least ``min_requests`` predictions sent during the outage answered."""
    name = "store-outage-availability"
    spans = outages(faults, start, end)
    if not spans:
        return InvariantResult(name, 0, no_data="the model store was not cut off in the window")
    window = [r for r in records if any(a <= ts(r.time) <= b for a, b in spans)]
    good, total = count(serving_success(window))
    seconds = sum(b - a for a, b in spans)
    if total < min_requests:
        return InvariantResult(name, total, no_data=(
            f"{total} prediction requests in the {seconds:.0f} s the store was cut off, fewer "
            f"than the {min_requests} a {target:g} ratio needs (inference.jsonl: is the "
            "Inferrer user running?)"))
    share = good / total
    measured = (f"{good} of {total} answered during the {seconds:.0f} s outage ({share:.4f}, "
                f"at least {target:g})")
    if share >= target:
        return InvariantResult(name, total, measured=measured)
    failed = [f"{r.time.strftime('%H:%M:%S.%f')[:-3]} {r.status or r.error}"
              for r in window if not r.answered]
    more = " ..." if len(failed) > 5 else ""
    return InvariantResult(name, total, (f"{measured}; failed: {', '.join(failed[:5])}{more}",),
                           measured=measured)


def no_half_loaded_model(records: Iterable[InferenceRecord], start: float,
                         end: float) -> InvariantResult:
    """No answer from a model that was not loaded in full: every answered golden-set
    prediction in [start, end] has the golden answer (a replica serving weights it never read
    answers wrong)."""
    name = "no-half-loaded-model"
    window = [r for r in records if start <= ts(r.time) <= end]
    outcomes = serving_correctness(window)
    right, total = count(outcomes)
    if not total:
        return InvariantResult(name, 0, no_data="no answered golden-set prediction in the window")
    measured = f"{right} of {total} answered golden predictions right"
    if right == total:
        return InvariantResult(name, total, measured=measured)
    wrong = [r for r in window if r.answered and r.correct is False]
    first = ", ".join(f"{r.time.strftime('%H:%M:%S.%f')[:-3]} {r.version}" for r in wrong[:5])
    violation = (f"{total - right} of {total} answered with a wrong answer (a model not "
                 f"loaded in full answered): {first}{' ...' if len(wrong) > 5 else ''}")
    return InvariantResult(name, total, (violation,), measured=measured)


def _scale_up_under_outage(faults: list[FaultRecord], start: float, end: float
                           ) -> tuple[list[str], list[tuple[float, float]], str | None]:
    """(replicas a scale-up started, the store's outages, why there is nothing to judge) in
    [start, end]: both invariants of the scaled-up replica need a scale-up and an outage."""
    started, spans = scaled_up(faults, start, end), outages(faults, start, end)
    why_not = ("no scale-up in the window" if not started else
               None if spans else "the model store was not cut off in the window")
    return started, spans, why_not


def unready_with_reason(faults: Iterable[FaultRecord], start: float,
                        end: float) -> InvariantResult:
    """While the store is cut off, every replica a scale-up started stays out: each time it
    was looked at during the outage its model was ``unready`` with a reason, and HAProxy did
    not have it up."""
    name = "unready-with-reason"
    faults = list(faults)
    started, spans, why_not = _scale_up_under_outage(faults, start, end)
    if why_not:
        return InvariantResult(name, 0, no_data=why_not)
    seen = [n for n in _notes(faults, STATE_NOTE, start, end)
            if n.details.get("replica") in started
            and any(a <= ts(n.time) <= b for a, b in spans)]
    missing = [r for r in started if r not in {n.details.get("replica") for n in seen}]
    if missing:
        return InvariantResult(name, 0, no_data=(
            f"{', '.join(missing)} never looked at while the store was cut off (no "
            f"{STATE_NOTE} note in the outage)"))
    violations, said = [], []
    for n in seen:
        d = n.details
        at = n.time.strftime("%H:%M:%S")
        lb = d.get("haproxy") or {}
        if d.get("state") != "unready" or not d.get("reason"):
            violations.append(f"{d['replica']} at {at}: model {d.get('state')!r}, not unready "
                              f"with a reason ({d.get('reason') or 'none given'})")
        if lb.get("op_state") == HAPROXY_UP:
            violations.append(f"{d['replica']} at {at}: HAProxy had it up (taking predictions) "
                              f"while its model was {d.get('state')!r}")
        said.append(f"{d['replica']} {d.get('state')}: {d.get('reason')}")
    return InvariantResult(name, len(seen), tuple(violations), measured="; ".join(said))


def scaled_up_ready_within_rto(faults: Iterable[FaultRecord], start: float, end: float,
                               rto: float) -> InvariantResult:
    """Every replica a scale-up started had its model ready within ``rto`` seconds of the store
    coming back (its own word: the time its status file says it went ready)."""
    name = "scaled-up-ready-within-rto"
    faults = list(faults)
    started, spans, why_not = _scale_up_under_outage(faults, start, end)
    if why_not:
        return InvariantResult(name, 0, no_data=why_not)
    back = max(b for _, b in spans)
    if not any(f.event == "fault_end" and f.fault == STORE_FAULT and ts(f.time) == back
               for f in faults):
        return InvariantResult(name, 0, no_data="the model store was not back by the end of "
                               "the window")
    violations, took = [], []
    for replica in started:
        ready = [n for n in _notes(faults, STATE_NOTE, back, end)
                 if n.details.get("replica") == replica and n.details.get("state") == "ready"]
        if not ready:
            violations.append(f"{replica}: not ready by the end of the window")
            took.append(f"{replica} not ready")
            continue
        since = ready[0].details.get("since")
        at = float(since) if isinstance(since, int | float) else ts(ready[0].time)
        seconds = max(at - back, 0.0)
        if seconds > rto:
            violations.append(f"{replica}: ready {seconds:.1f} s after the store was back "
                              f"(RTO {rto:g} s)")
        took.append(f"{replica} ready {seconds:.1f} s after the store was back")
    return InvariantResult(name, len(started), tuple(violations),
                           measured="; ".join(took) + f" (RTO {rto:g} s)")
