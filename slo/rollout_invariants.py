"""The promises of bad-model-rollout (pure), judged over one experiment's [fault start, horizon]
on the fault timeline's ``rollout_*`` notes (environments/local/serving_rollout.py) and the
clients' inference ledger (docs/serving.md):

* ``rolled-back-within-rto``: every rollout the experiment declared bad (its ``rollout_start``
  note says ``expect: rollback``) ends ``rollback``, and its version, from the moment it got a
  share of the predictions, has it taken away again within the RTO;
* ``bad-version-share``: of the prediction requests in the window, the share answered by a
  declared-bad version, or not answered at all, stays within twice what the rollouts' own
  policy lets a bad version cost: its first step's share for one analysis.

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

# What the fault may cost: a bad version answers its first step's share for one analysis
# (10 % for 4 s in the experiment) before it is rolled back, so the rollouts' policy itself
# says how many bad answers the window may hold: the sum over the bad rollouts of first share x
# analysis seconds x the window's request rate. The bound is twice that: the analysis overruns
# its seconds by the probes in flight, and ten-odd answers are a small, noisy count. A canary
# given the weight of a full share (90:100) answers 53 %, about 5x the cost; a canary held at
# its share after failing (rollback off) 4x (four analyses) or more.
COST_FACTOR = 2.0
# Below this many requests in the window a share of a few percent is a handful of answers.
MIN_REQUESTS = 100
EXPECT_ROLLBACK = "rollback"


@dataclass(frozen=True)
class Rollout:
    """One rollout as the timeline tells it: its start, policy, the span its version had a
    share of the predictions, and its end if there was one."""

    version: str
    expect: str | None
    start: float
    first_share: float | None = None  # percent, the policy's first step
    step_seconds: float | None = None
    exposed: float | None = None  # its first rollout_share above 0
    withdrawn: float | None = None  # the next rollout_share at 0 after that
    end: float | None = None
    outcome: str | None = None
    reasons: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.version} at {_clock(self.start)}"

    @property
    def cost_seconds(self) -> float | None:
        """What the policy lets it cost: its first share of the traffic for one analysis, in
        seconds of all traffic; None when the note does not say."""
        if self.first_share is None or self.step_seconds is None:
            return None
        return self.first_share / 100.0 * self.step_seconds


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def rollouts(faults: Iterable[FaultRecord], start: float, end: float) -> list[Rollout]:
    """Every rollout started in [start, end], each with the first ``rollout_end`` of its
    version after its start (None: it never ended, e.g. left holding its canary) and the span
    its version was given a share, from the ``rollout_share`` notes up to that end."""
    notes = sorted((f for f in faults if f.event == "note" and f.fault.startswith("rollout_")),
                   key=lambda f: ts(f.time))
    out = []
    for i, n in enumerate(notes):
        if n.fault != "rollout_start" or not start <= ts(n.time) <= end:
            continue
        version = str(n.details.get("version", ""))
        expect = n.details.get("expect")
        later = notes[i + 1:]
        j = next((k for k, m in enumerate(later) if m.fault == "rollout_start"), len(later))
        done = next((m for m in later[:j] if m.fault == "rollout_end"
                     and m.details.get("version") == version), None)
        shares = [m for m in later[:j] if m.fault == "rollout_share"
                  and (done is None or ts(m.time) <= ts(done.time))]
        exposed = next((ts(m.time) for m in shares if m.details.get("version") == version
                        and (_number(m.details.get("share")) or 0) > 0), None)
        withdrawn = next((ts(m.time) for m in shares if exposed is not None
                          and ts(m.time) > exposed and _number(m.details.get("share")) == 0),
                         None)
        steps = n.details.get("steps")
        first = _number(steps[0]) if isinstance(steps, list) and steps else None
        out.append(Rollout(version, expect if isinstance(expect, str) else None, ts(n.time),
                           first, _number(n.details.get("step_seconds")), exposed, withdrawn,
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
    ``rollback``, and its version's share of the predictions went back to 0 within ``rto``
    seconds of the moment it first had one (the redeploys before and after, at share 0, cost
    no client anything and are not counted; the rollout's whole length is shown)."""
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
        why = f" ({'; '.join(r.reasons)})" if r.reasons else ""
        served = 0.0 if r.exposed is None else (r.withdrawn or r.end) - r.exposed
        whole = f"rollout {r.end - r.start:.1f} s"
        if r.outcome != EXPECT_ROLLBACK:
            violations.append(f"{r.label}: ended {r.outcome}, not rollback, its version still "
                              f"serving after {served:.1f} s ({whole}){why}")
        elif served > rto:
            violations.append(f"{r.label}: its version served {served:.1f} s before it was "
                              f"rolled back (RTO {rto:g} s, {whole}){why}")
        took.append(f"{r.version} {r.outcome} after serving {served:.1f} s ({whole})")
    return InvariantResult(name, len(bad), tuple(violations),
                           measured="; ".join(took) + f" (RTO {rto:g} s)")


def bad_version_share(records: Iterable[InferenceRecord], faults: Iterable[FaultRecord],
                      start: float, end: float, factor: float = COST_FACTOR,
                      min_requests: int = MIN_REQUESTS) -> InvariantResult:
    """Of the prediction requests sent in [start, end] (at least ``min_requests``), the share
    answered by a version rolled out as bad in the window, or not answered at all (a failed
    request carries no version, and failing is what a bad version does too), is at most
    ``factor`` x the cost the rollouts' policy allows: the sum of each bad rollout's first
    share x analysis seconds, over the window's seconds."""
    name = "bad-version-share"
    bad = [r for r in rollouts(faults, start, end) if r.expect == EXPECT_ROLLBACK]
    if not bad:
        return InvariantResult(name, 0, no_data="no rollout declared bad (expect: rollback) "
                               "started in the window")
    unknown = [r.label for r in bad if r.cost_seconds is None]
    if unknown:
        return InvariantResult(name, 0, no_data="rollout_start names no first step or "
                               f"step_seconds: {', '.join(unknown)}")
    window = [r for r in records if start <= ts(r.time) <= end]
    if len(window) < min_requests:
        return InvariantResult(name, len(window), no_data=(
            f"{len(window)} prediction requests in the window, fewer than the {min_requests} "
            "a share of a few percent needs (inference.jsonl: is the Inferrer user running?)"))
    versions = frozenset(r.version for r in bad)
    good, answered = count(serving_good_version(window, versions))
    failed = len(window) - answered
    share = (answered - good + failed) / len(window)
    cost = sum(r.cost_seconds or 0.0 for r in bad)
    bound = factor * cost / max(end - start, 1e-9)
    by = ", ".join(f"{v} {sum(1 for r in window if r.answered and r.version == v)}"
                   for v in sorted(versions))
    measured = (f"{answered - good + failed} of {len(window)} requests ({share:.4f}, at most "
                f"{bound:.4f}: {factor:g}x {cost:g} s of all traffic over {end - start:.0f} s) "
                f"answered by a bad version ({by}) or failed ({failed})")
    return InvariantResult(name, len(window), () if share <= bound else (measured,),
                           measured=measured)
