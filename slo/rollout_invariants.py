"""The promises of bad-model-rollout (pure), judged over one experiment's [fault start, horizon]
on the fault timeline's ``rollout_*`` notes (environments/local/serving_rollout.py) and the
clients' inference ledger (docs/serving.md):

* ``rolled-back-within-rto``: every rollout the experiment declared bad (its ``rollout_start``
  note says ``expect: rollback``) ends ``rollback`` within the RTO of its start;
* ``bad-version-share``: of the prediction requests in the window, the share answered by a
  declared-bad version, or not answered at all, stays within a bound.

Invariants, like the serving-replica-loss ones (slo/serving_invariants.py): only a class that
lists them is judged on them, so every other run keeps the verdict it had.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from slo.evidence import FaultRecord
from slo.inference_ledger import InferenceRecord
from slo.invariant_result import InvariantResult
from slo.sli import count, serving_good_version, ts

# What the fault may cost: a bad version answers its first step's share (10 %) for one
# analysis (4 s) before it is rolled back, 0.4 s of all traffic per version; the experiment's
# three bad versions, 1.2 s, are 1.5 % of a window of 80 s (the rollouts and the 20 s observed
# after them) and less of a longer one. A canary given the weight of a full share whatever its
# step (weights 90:100) answers 53 % during the analysis, about 5x that: 7 %. The bound sits
# between, 2x from each.
BAD_SHARE_BOUND = 0.03
# Below this many requests a 3 % share is a handful of answers: too few to say anything.
MIN_REQUESTS = 100
EXPECT_ROLLBACK = "rollback"


@dataclass(frozen=True)
class Rollout:
    """One rollout as the timeline tells it: its start, and its end if there was one."""

    version: str
    expect: str | None
    start: float
    end: float | None = None
    outcome: str | None = None
    reasons: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.version} at {_clock(self.start)}"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def rollouts(faults: Iterable[FaultRecord], start: float, end: float) -> list[Rollout]:
    """Every rollout started in [start, end], each with the first ``rollout_end`` of its
    version after its start (None: it never ended, e.g. left holding its canary)."""
    notes = sorted((f for f in faults if f.event == "note" and f.fault.startswith("rollout_")),
                   key=lambda f: ts(f.time))
    out = []
    for i, n in enumerate(notes):
        if n.fault != "rollout_start" or not start <= ts(n.time) <= end:
            continue
        version = str(n.details.get("version", ""))
        expect = n.details.get("expect")
        done = next((m for m in notes[i + 1:] if m.fault == "rollout_end"
                     and m.details.get("version") == version), None)
        out.append(Rollout(version, expect if isinstance(expect, str) else None, ts(n.time),
                           ts(done.time) if done else None,
                           str(done.details.get("outcome")) if done else None,
                           tuple(map(str, done.details.get("reasons", ()))) if done else ()))
    return out


def bad_versions(faults: Iterable[FaultRecord], start: float, end: float) -> frozenset[str]:
    """The versions the experiment rolled out in [start, end] declaring them bad."""
    return frozenset(r.version for r in rollouts(faults, start, end)
                     if r.expect == EXPECT_ROLLBACK)


def rolled_back_within_rto(faults: Iterable[FaultRecord], start: float, end: float,
                           rto: float) -> InvariantResult:
    """Every rollout declared bad (``expect: rollback``) started in [start, end] ended
    ``rollback`` (the canary back on the stable version) within ``rto`` seconds of its
    ``rollout_start``."""
    name = "rolled-back-within-rto"
    bad = [r for r in rollouts(faults, start, end) if r.expect == EXPECT_ROLLBACK]
    if not bad:
        return InvariantResult(name, 0, no_data="no rollout declared bad (expect: rollback) "
                               "started in the window")
    violations, took = [], []
    for r in bad:
        if r.end is None or r.end > end:
            violations.append(f"{r.label}: no rollout_end by the end of the window (still on "
                              "the canary)")
            took.append(f"{r.version} not ended")
            continue
        seconds = r.end - r.start
        why = f" ({'; '.join(r.reasons)})" if r.reasons else ""
        if r.outcome != EXPECT_ROLLBACK:
            violations.append(f"{r.label}: ended {r.outcome}, not rollback, after "
                              f"{seconds:.1f} s{why}")
        elif seconds > rto:
            violations.append(f"{r.label}: rolled back {seconds:.1f} s after its start "
                              f"(RTO {rto:g} s){why}")
        took.append(f"{r.version} {r.outcome} in {seconds:.1f} s")
    return InvariantResult(name, len(bad), tuple(violations),
                           measured="; ".join(took) + f" (RTO {rto:g} s)")


def bad_version_share(records: Iterable[InferenceRecord], faults: Iterable[FaultRecord],
                      start: float, end: float, bound: float = BAD_SHARE_BOUND,
                      min_requests: int = MIN_REQUESTS) -> InvariantResult:
    """Of the prediction requests sent in [start, end] (at least ``min_requests``), at most
    ``bound`` were answered by a version rolled out as bad in the window or not answered at
    all: a failed request carries no version, and failing is what a bad version does too."""
    name = "bad-version-share"
    bad = bad_versions(faults, start, end)
    if not bad:
        return InvariantResult(name, 0, no_data="no rollout declared bad (expect: rollback) "
                               "started in the window")
    window = [r for r in records if start <= ts(r.time) <= end]
    if len(window) < min_requests:
        return InvariantResult(name, len(window), no_data=(
            f"{len(window)} prediction requests in the window, fewer than the {min_requests} "
            f"a {bound:g} share needs (inference.jsonl: is the Inferrer user running?)"))
    good, answered = count(serving_good_version(window, bad))
    failed = len(window) - answered
    share = (answered - good + failed) / len(window)
    by = ", ".join(f"{v} {sum(1 for r in window if r.answered and r.version == v)}"
                   for v in sorted(bad))
    measured = (f"{answered - good + failed} of {len(window)} requests ({share:.4f}, at most "
                f"{bound:g}) answered by a bad version ({by}) or failed ({failed})")
    return InvariantResult(name, len(window), () if share <= bound else (measured,),
                           measured=measured)
