"""The serving classes' promises (pure), judged on the inference ledger (docs/serving.md) over
one experiment's [fault start, horizon]: the fault and the recovery after it, so what the
fault may cost is a share of that whole window, never of the fault's seconds alone.

They are invariants rather than run-wide SLIs on purpose: only a class that declares them
(its RecoveryObjective's ``invariants``) is judged on predictions, so a run whose environment
serves no model gets exactly the verdict it got before serving existed.
"""

from __future__ import annotations

from collections.abc import Iterable

from slo.evidence import FaultRecord
from slo.inference_ledger import InferenceRecord
from slo.invariant_result import InvariantResult, fault_spans
from slo.sli import count, latency_quantile, serving_success, ts

# A replica lost of two may cost at most 1 % of the predictions sent from the fault to the
# horizon: HAProxy retries a refused connection and health checks take the dead replica out
# (measured: 0 of 1,398 failed), so the allowance covers a stray request, not an outage.
AVAILABILITY_TARGET = 0.99
# Below this many requests a ratio says nothing about a 1 % allowance (one failure is > 1 %).
MIN_REQUESTS = 100
# The bound the rollout controller holds a canary to (controlplane/serving/rollout.py
# max_p99_ms default), over the same window: 33-39 ms measured with no fault.
P99_BOUND_MS = 250.0
PROCESS_FAULTS = ("kill", "stop")


def _in(records: Iterable[InferenceRecord], start: float, end: float) -> list[InferenceRecord]:
    return [r for r in records if start <= ts(r.time) <= end]


def _no_requests(name: str, start: float, end: float) -> InvariantResult:
    return InvariantResult(name, 0, no_data=f"no prediction request in the window "
                           f"({end - start:.0f} s; inference.jsonl: is the environment up with "
                           "--serving and the Inferrer user running?)")


def serving_availability(records: Iterable[InferenceRecord], start: float, end: float,
                         target: float = AVAILABILITY_TARGET,
                         min_requests: int = MIN_REQUESTS) -> InvariantResult:
    """At least ``target`` of the prediction requests in [start, end] answered (no transport
    error, no 5xx), over at least ``min_requests`` requests."""
    name = "serving-availability"
    window = _in(records, start, end)
    if not window:
        return _no_requests(name, start, end)
    good, total = count(serving_success(window))
    if total < min_requests:
        return InvariantResult(name, total, no_data=f"{total} prediction requests in the window, "
                               f"fewer than the {min_requests} a {target:g} ratio needs")
    share = good / total
    measured = f"{good} of {total} answered ({share:.4f}, at least {target:g})"
    if share >= target:
        return InvariantResult(name, total, measured=measured)
    failed = [f"{r.time.strftime('%H:%M:%S.%f')[:-3]} {r.status or r.error}"
              for r in window if not r.answered]
    more = " ..." if len(failed) > 5 else ""
    violation = f"{measured[:-1]}; failed: {', '.join(failed[:5])}{more})"
    return InvariantResult(name, total, (violation,), measured=measured)


def serving_latency_p99(records: Iterable[InferenceRecord], start: float, end: float,
                        bound_ms: float = P99_BOUND_MS,
                        min_requests: int = MIN_REQUESTS) -> InvariantResult:
    """The p99 (nearest rank) latency of the answered predictions in [start, end] is within
    ``bound_ms``."""
    name = "serving-latency-p99"
    window = [r for r in _in(records, start, end) if r.answered]
    if not window:
        return _no_requests(name, start, end)
    if len(window) < min_requests:
        return InvariantResult(name, len(window), no_data=f"{len(window)} answered predictions "
                               f"in the window, fewer than the {min_requests} a p99 needs")
    p99 = latency_quantile(window, 0.99)
    assert p99 is not None  # window is not empty
    measured = f"p99 {p99:.1f} ms over {len(window)} answered (at most {bound_ms:g} ms)"
    return InvariantResult(name, len(window), () if p99 <= bound_ms else (measured,),
                           measured=measured)


def restarted_within_rto(faults: Iterable[FaultRecord], start: float, end: float,
                         rto: float) -> InvariantResult:
    """Every process killed or stopped in the window was running and healthy again (its
    ``fault_end``: the environment waited for its health check, for a model server the model's
    readiness) within ``rto`` seconds of the fault's start."""
    name = "restarted-within-rto"
    spans = [s for s in fault_spans(faults, start, end) if s[0].split(" ")[0] in PROCESS_FAULTS]
    if not spans:
        return InvariantResult(name, 0, no_data="no process killed or stopped in the window")
    ended = {(f.fault, f.target, ts(f.time)) for f in faults if f.event == "fault_end"}
    violations, took = [], []
    for label, t0, t1 in spans:
        fault, _, target = label.partition(" ")
        back = any(f == fault and g == target and t == t1 for f, g, t in ended)
        if not back:
            violations.append(f"{label}: not back by the end of the window")
        elif t1 - t0 > rto:
            violations.append(f"{label}: back {t1 - t0:.1f} s after the fault (RTO {rto:g} s)")
        took.append(f"{target} back in {t1 - t0:.1f} s" if back else f"{target} not back")
    return InvariantResult(name, len(spans), tuple(violations),
                           measured="; ".join(took) + f" (RTO {rto:g} s)")
