"""Invariants of the overload class (pure; registered in slo/invariants.py).

A metastable failure (Bronson et al., HotOS 2021) outlives its trigger: load near capacity, a
trigger that slows the platform down for a while, and then work that keeps the platform down
after the trigger is gone (a queue of requests whose clients already gave up, their retries).
What the platform promises, judged on the client's request records around the trigger (the
first fault of the experiment's window):

* ``goodput-recovered``: acknowledged submissions per second (the goodput of
  slo/load_timeline.py) are back to ``RECOVERED_SHARE`` of their mean over the ``window``
  seconds before the trigger within the RTO after the trigger ended;
* ``bounded-request-amplification``: submission requests sent (retries included) per
  acknowledged submission, from the trigger's start to ``AFTER_SECONDS`` after its end, at most
  ``MAX_REQUEST_AMPLIFICATION`` times the same ratio before the trigger. A platform that
  refuses fast (503 + Retry-After) costs its clients a few retries; one that queues without
  bound answers late or never, and each timeout becomes one more request for no submission.

Neither is judged over a span in which the load generator itself fell behind (its event
loop's lag, recorded with the load's counts in the "overload stopped" note, at least
``GENERATOR_LAG_LIMIT_S``): its timeouts then measure the client, not the platform, and the
check says so (no data: the check fails, never passes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from slo.evidence import FaultRecord, RequestRecord
from slo.invariant_result import InvariantResult, fault_spans
from slo.load_timeline import (
    RECOVERED_SHARE,
    SUBMIT_ROUTE,
    goodput_recovery,
    is_ack,
    load_points,
)
from slo.sli import ts

# seconds of goodput the mean before the trigger (and each candidate recovery) is taken over
WINDOW_SECONDS = 10.0
STEP_SECONDS = 2.0
# requests per acknowledged submission from the trigger to AFTER_SECONDS after it, as a
# multiple of the ratio before it (measured: docs/EVIDENCE.md, "overload-metastability")
MAX_REQUEST_AMPLIFICATION = 2.0
# A fixed span, not the RTO: during the trigger a healthy API refuses much of its load by
# design (3.5x over the trigger plus 5 s, measured 2026-12-06), so the ratio means "what the
# trigger cost the clients in all", and a shorter RTO must not make the same run fail
AFTER_SECONDS = 60.0
# the load generator's event-loop lag (loadtests/overload.py LagMonitor) from which its
# timeouts are its own: half the interactive client's 2 s timeout (the experiment's)
GENERATOR_LAG_LIMIT_S = 1.0
LOAD_STOPPED_NOTE = "overload stopped"


def generator_behind(faults: Iterable[FaultRecord], lo: float, hi: float,
                     limit: float = GENERATOR_LAG_LIMIT_S) -> str | None:
    """Why the load's records in [lo, hi) measure its generator, not the platform: the
    first lag episode of at least ``limit`` seconds overlapping the span; None if none."""
    for f in faults:
        if f.event != "note" or f.fault != LOAD_STOPPED_NOTE:
            continue
        for ep in f.details.get("generator_lag") or ():
            if float(ep["max_lag_s"]) >= limit and float(ep["start"]) < hi and float(ep["end"]) > lo:
                return (f"the load generator fell {float(ep['max_lag_s']):.1f} s behind its own "
                        f"schedule for {float(ep['end']) - float(ep['start']):.0f} s, "
                        f"{float(ep['start']) - lo:.0f} s into the judged span (event-loop "
                        f"lag >= {limit:g} s): its timeouts measure the client, not the "
                        "platform; not judged (a busier machine than the load needs: "
                        "runbooks/overload-metastability.md)")
    return None


def _trigger(faults: Iterable[FaultRecord], start: float, end: float) -> tuple[
        str, float, float] | None:
    """The first fault started in the window: (name, start, end)."""
    spans = fault_spans(faults, start, end)
    return min(spans, key=lambda s: s[1]) if spans else None


def goodput_recovered(requests: Sequence[RequestRecord], faults: Iterable[FaultRecord],
                      start: float, end: float, rto_seconds: float,
                      window: float = WINDOW_SECONDS,
                      share: float = RECOVERED_SHARE) -> InvariantResult:
    """Goodput back to ``share`` of its mean before the trigger within ``rto_seconds`` of the
    trigger's end (a mean over ``window`` seconds from that moment). The requests before
    ``start`` are read too: the goodput before the trigger is the baseline."""
    faults = tuple(faults)  # read twice: the trigger, then the generator's lag
    name = "goodput-recovered"
    trig = _trigger(faults, start, end)
    if trig is None:
        return InvariantResult(name, 0, no_data="no fault_start in the window (no trigger)")
    label, t0, t1 = trig
    behind = generator_behind(faults, t0 - window, min(end, t1 + AFTER_SECONDS))
    if behind is not None:
        return InvariantResult(name, 0, no_data=behind)
    points = load_points(requests, t0 - window, end, STEP_SECONDS)
    rec = goodput_recovery(points, t0, t1, window, share)
    if not rec.before:
        return InvariantResult(name, 0, no_data=(
            f"no acknowledged submission in the {window:g} s before {label}: no goodput to "
            "come back to"))
    during = "no request" if rec.during is None else f"{rec.during:.1f}/s"
    after = end - t1
    if rec.seconds_after_trigger is None:
        back = f"not back within the {after:.0f} s of evidence after it ended"
    else:
        back = f"back {rec.seconds_after_trigger:.0f} s after it ended"
    measured = (f"goodput {rec.before:.1f}/s before {label}, {during} during it, {back} "
                f"(>= {share:.0%} of before for {window:g} s, within {rto_seconds:g} s)")
    late = rec.seconds_after_trigger is None or rec.seconds_after_trigger > rto_seconds
    why = (f"goodput was {rec.before:.1f}/s before {label} and is {back}, not within its RTO "
           f"of {rto_seconds:g} s (a metastable state: the trigger was gone, the overload stayed)")
    violations = (why,) if late else ()
    return InvariantResult(name, 1, violations, measured=measured)


def _ratio(requests: Sequence[RequestRecord], lo: float, hi: float) -> tuple[int, int]:
    """(submission requests sent, acknowledged) with a send time in [lo, hi)."""
    sent = acked = 0
    for r in requests:
        if r.method != "POST" or r.route != SUBMIT_ROUTE or not lo <= ts(r.time) < hi:
            continue
        sent += 1
        acked += is_ack(r)
    return sent, acked


def request_amplification(requests: Sequence[RequestRecord], faults: Iterable[FaultRecord],
                          start: float, end: float, rto_seconds: float,
                          window: float = WINDOW_SECONDS,
                          limit: float = MAX_REQUEST_AMPLIFICATION) -> InvariantResult:
    """Submission requests per acknowledged submission from the trigger's start to its end
    plus ``AFTER_SECONDS`` (at most ``end``), as a multiple of that ratio over the ``window``
    seconds before the trigger: at most ``limit``. ``rto_seconds`` is not used (the RTO
    judges the recovery, goodput_recovered)."""
    faults = tuple(faults)  # read twice: the trigger, then the generator's lag
    name = "bounded-request-amplification"
    trig = _trigger(faults, start, end)
    if trig is None:
        return InvariantResult(name, 0, no_data="no fault_start in the window (no trigger)")
    label, t0, t1 = trig
    sent0, acked0 = _ratio(requests, t0 - window, t0)
    if not acked0:
        return InvariantResult(name, 0, no_data=(
            f"no acknowledged submission in the {window:g} s before {label}: no ratio to "
            "compare with"))
    hi = min(end, t1 + AFTER_SECONDS)
    behind = generator_behind(faults, t0 - window, hi)
    if behind is not None:
        return InvariantResult(name, 0, no_data=behind)
    sent, acked = _ratio(requests, t0, hi)
    if not sent:
        return InvariantResult(name, 0, no_data=f"no submission request during or after {label}")
    before = sent0 / acked0
    span = f"{hi - t0:.0f} s from the start of {label}"
    if not acked:
        why = (f"{sent} submission requests in the {span} and none acknowledged "
               f"({before:.2f} per acknowledged submission before it)")
        return InvariantResult(name, 1, (why,), measured=f"{sent} requests, 0 acknowledged (at most {limit:g}x)")
    during = sent / acked
    ratio = during / before
    measured = (f"{during:.2f} requests per acknowledged submission in the {span} ({sent} / "
                f"{acked}) against {before:.2f} before it: {ratio:.2f}x (at most {limit:g}x)")
    why = (f"{during:.2f} submission requests per acknowledged submission in the {span} "
           f"({sent} sent, {acked} acknowledged) against {before:.2f} before it: "
           f"{ratio:.1f}x (at most {limit:g}x)")
    violations = (why,) if ratio > limit else ()
    return InvariantResult(name, 1, violations, measured=measured)
