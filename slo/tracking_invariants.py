"""Tracking invariants (pure; registered in slo/invariants.py): what the training workload's
tracking sink promises its trainer while the tracking server blinks (controlplane/workload/
tracking.py, docs/tracking.md), judged from the trainers' own account (the `log` event carrying
``data.tracking``, the sink's summary, one per tracked attempt) against what MLflow holds after
the game day (snapshot/tracking_runs.jsonl, read back through its REST API).

A tracked attempt is one that sent such a summary, or whose identity (``<operation_id>/attempt-
<n>``) tags a run; both are judged, so a trainer that never reported is not silently skipped.
Judged: the tracked attempts that lived in the window (created before its end, not finished
before its start): the game day's trainers start before the fault and train through it.

* ``metric-points-kept``: every point the trainer was acknowledged (``points_logged``) is held
  by MLflow: held >= logged for the attempt's run.
* ``one-run-per-attempt``: exactly one run carries the attempt's identity.
* ``runs-terminated``: every tracked attempt's run is FINISHED, FAILED or KILLED once the game
  day is over (none left RUNNING for good), and every tracked attempt has a run.
* ``training-unaffected``: tracking never failed or stalled training: every tracked attempt
  succeeded, no tracking call held its trainer longer than 1 s (``longest_log_call_seconds``:
  for our sink its log calls, the only ones the trainer makes), and
  its end waited for tracking no longer than the declared bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slo.evidence import Attempt, Event, TrackingRun
from slo.invariant_result import InvariantResult
from slo.sli import ts

TERMINAL = frozenset({"FINISHED", "FAILED", "KILLED"})
# the sink's declared finish wait (TrackingPolicy.finish_wait_seconds) and a little slack for
# the summary's own clock
FINISH_WAIT_BOUND = 120.0 + 5.0
# a log call is a hand-over to a buffer: one that holds training a second has waited for the
# network (the plain MLflow client's log_metric retries inside the call)
LOG_CALL_BOUND = 1.0


@dataclass(frozen=True)
class Tracked:
    identity: str  # <operation_id>/attempt-<n>
    attempt: Attempt | None
    summary: dict[str, object] | None
    runs: tuple[TrackingRun, ...]


def identity(a: Attempt) -> str:
    return f"{a.operation_id}/attempt-{a.number}"


def tracked(attempts: Iterable[Attempt], events: Iterable[Event],
            runs: Iterable[TrackingRun], start: float, end: float) -> list[Tracked]:
    """The tracked attempts that lived in [start, end], each with its summary and its runs."""
    in_window = {a.id: a for a in attempts if ts(a.created_at) <= end
                 and (a.finished_at is None or ts(a.finished_at) >= start)}
    summaries: dict[str, dict[str, object]] = {}
    for e in events:
        s = e.data.get("tracking") if e.kind == "log" else None
        if isinstance(s, dict) and e.attempt_id in in_window:
            summaries[identity(in_window[e.attempt_id])] = s
    by_tag: dict[str, list[TrackingRun]] = defaultdict(list)
    for r in runs:
        if r.attempt_tag:
            by_tag[r.attempt_tag].append(r)
    by_identity = {identity(a): a for a in in_window.values()}
    names = sorted(set(summaries) | (set(by_tag) & set(by_identity)))
    return [Tracked(n, by_identity.get(n), summaries.get(n), tuple(by_tag.get(n, ())))
            for n in names]


def _no_data(name: str, runs: Sequence[TrackingRun] | None,
             subjects: Sequence[Tracked]) -> InvariantResult | None:
    if runs is None:
        return InvariantResult(name, 0, no_data="snapshot/tracking_runs.jsonl not collected "
                               "(no tracking server in the environment)")
    if not subjects:
        return InvariantResult(name, 0, no_data="no tracked attempt in the window")
    return None


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


def metric_points_kept(subjects: Sequence[Tracked],
                       runs: Sequence[TrackingRun] | None) -> InvariantResult:
    name = "metric-points-kept"
    if (empty := _no_data(name, runs, subjects)) is not None:
        return empty
    bad, logged_total, held_total = [], 0, 0
    for t in subjects:
        if t.summary is None:
            bad.append(f"{t.identity}: the trainer never reported what it logged")
            continue
        logged = _int(t.summary.get("points_logged"))
        held = max((sum(r.metric_points.values()) for r in t.runs), default=0)
        logged_total, held_total = logged_total + logged, held_total + min(held, logged)
        if held < logged:
            bad.append(f"{t.identity}: {logged - held} of {logged} metric points lost (MLflow "
                       f"holds {held}; the sink counted {_int(t.summary.get('points_dropped'))} "
                       "dropped by its bound)")
    return InvariantResult(name, len(subjects), tuple(bad),
                           measured=f"{held_total} of {logged_total} points held")


def one_run_per_attempt(subjects: Sequence[Tracked],
                        runs: Sequence[TrackingRun] | None) -> InvariantResult:
    name = "one-run-per-attempt"
    if (empty := _no_data(name, runs, subjects)) is not None:
        return empty
    bad = [f"{t.identity}: {len(t.runs)} runs ({', '.join(r.run_id for r in t.runs)})"
           for t in subjects if len(t.runs) > 1]
    return InvariantResult(name, len(subjects), tuple(bad))


def runs_terminated(subjects: Sequence[Tracked],
                    runs: Sequence[TrackingRun] | None) -> InvariantResult:
    name = "runs-terminated"
    if (empty := _no_data(name, runs, subjects)) is not None:
        return empty
    bad = []
    for t in subjects:
        if not t.runs:
            bad.append(f"{t.identity}: no run in MLflow")
        bad += [f"{t.identity}: run {r.run_id} left {r.status}" for r in t.runs
                if r.status not in TERMINAL]
    left = sum(1 for t in subjects for r in t.runs if r.status not in TERMINAL)
    return InvariantResult(name, len(subjects), tuple(bad), measured=f"{left} left running")


def training_unaffected(subjects: Sequence[Tracked],
                        runs: Sequence[TrackingRun] | None) -> InvariantResult:
    name = "training-unaffected"
    if (empty := _no_data(name, runs, subjects)) is not None:
        return empty
    bad, waits = [], []
    for t in subjects:
        if t.attempt is None or t.attempt.state != "succeeded":
            state = t.attempt.state if t.attempt else "unknown"
            bad.append(f"{t.identity}: training {state}")
        held = t.summary.get("longest_log_call_seconds") if t.summary else None
        if isinstance(held, (int, float)) and held > LOG_CALL_BOUND:
            bad.append(f"{t.identity}: a tracking call held training {held:.1f} s "
                       f"(bound {LOG_CALL_BOUND:.0f} s)")
        wait = t.summary.get("finish_wait_seconds") if t.summary else None
        if isinstance(wait, (int, float)):
            waits.append(float(wait))
            if wait > FINISH_WAIT_BOUND:
                bad.append(f"{t.identity}: waited {wait:.1f} s for tracking at its end "
                           f"(bound {FINISH_WAIT_BOUND:.0f} s)")
    measured = f"longest end wait {max(waits):.1f} s" if waits else None
    return InvariantResult(name, len(subjects), tuple(bad), measured=measured)
