"""Outcome invariants (pure; registered in slo/invariants.py): three promises judged from what
the evidence shows happened, whichever code path would have broken them. A check tied to the
path a fault is expected to take (the reported writes, the routing reason, the closing probe)
passes a platform broken somewhere else; these read the end state and the records of the
platform and the harness instead.

* ``artifacts-complete``: every attempt that succeeded in the window has its complete
  completion manifest and every file it lists in the object-store listing, with matching
  digests; "complete" = it names every file any record says the attempt wrote (the workload's
  ``artifact_written`` event, the objects under the attempt's prefix), and the attempt's
  result, where it lists files, names the manifest's (what the user is told is there).
* ``routed-to-live-agents``: no work dispatched to an agent while the platform knew it dead:
  an attempt created on it between its last heartbeat + liveness timeout and the moment it
  was heard from again (snapshot/agent_liveness.jsonl). A claim needs no check: claiming is
  itself a sign of life.
* ``retired-credentials-refused``: no request made with a retired credential is accepted
  once the revocation had time to reach every replica (its recorded grace: the replicas'
  token cache), as the harness's requests with that credential record it on the fault
  timeline (``retired_credential_request`` notes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from slo.evidence import AgentHeardAgain, Attempt, Event, FaultRecord
from slo.invariant_result import InvariantResult
from slo.sli import ObjectIndex, manifest_files, ts

ARTIFACT_MANIFEST = "COMPLETE.json"  # docs/CONTRACTS.md section 3
# dispatches and heartbeats are stamped by the database; after a failover by another member
DEAD_CLOCK_TOLERANCE = 0.25
CREDENTIAL_NOTE = "retired_credential_request"
# wall clocks of the harness and of the replicas' caches (monotonic) differ a little
CREDENTIAL_TOLERANCE = 0.5


def _hms(t: datetime) -> str:
    return t.strftime("%H:%M:%S.%f")[:-3]


def _named(files: object) -> dict[str, str] | None:
    """Names (and sha256 where given) of a files field: a list of names, or what
    manifest_files reads ({name: sha256 | {"sha256"}} or [{"name", "sha256"}])."""
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        return {f: "" for f in files}
    return manifest_files({"files": files}) if files is not None else None


def _artifact_problems(a: Attempt, written: Sequence[Event], index: ObjectIndex) -> list[str]:
    prefix = f"artifacts/{a.operation_id}/attempt-{a.number}"
    if (why := index.verify(prefix, ARTIFACT_MANIFEST)) is not None:
        return [why]
    manifest = manifest_files(index.objects[f"{prefix}/{ARTIFACT_MANIFEST}"].content) or {}
    problems = []
    wrote: set[str] = {k[len(prefix) + 1:] for k in index.objects
                       if k.startswith(prefix + "/") and k != f"{prefix}/{ARTIFACT_MANIFEST}"}
    for e in written:
        wrote |= set(_named(e.data.get("files")) or {})
    if unlisted := sorted(wrote - set(manifest)):
        problems.append(f"{prefix}/{ARTIFACT_MANIFEST} lists {len(manifest)} file(s) but the "
                        f"attempt wrote {', '.join(unlisted)} too")
    told = _named((a.result or {}).get("files"))
    if told is not None:
        if missing := sorted(set(manifest) - set(told)):
            problems.append(f"its result names {len(told)} of the manifest's {len(manifest)} "
                            f"file(s): not {', '.join(missing)}")
        differ = sorted(n for n, d in told.items() if d and manifest.get(n) not in (None, d))
        if differ:
            problems.append(f"its result's digest of {', '.join(differ)} differs from the "
                            "manifest's")
    return problems


def artifacts_complete(attempts: Iterable[Attempt], events: Iterable[Event],
                       index: ObjectIndex, start: float, end: float) -> InvariantResult:
    """Every attempt that ended succeeded in [start, end]: see the module docstring."""
    name = "artifacts-complete"
    scope = [a for a in attempts if a.state == "succeeded" and a.finished_at is not None
             and start <= ts(a.finished_at) <= end]
    if not scope:
        return InvariantResult(name, 0, no_data="no attempt succeeded in the window")
    written: dict[str, list[Event]] = {}
    for e in events:
        if e.kind == "artifact_written" and e.attempt_id:
            written.setdefault(str(e.attempt_id), []).append(e)
    violations = [f"attempt {a.id} of {a.operation_id} (succeeded at {_hms(a.finished_at)}): "
                  f"{why}"
                  for a in scope if a.finished_at is not None
                  for why in _artifact_problems(a, written.get(a.id, []), index)]
    return InvariantResult(name, len(scope), tuple(violations),
                           measured=f"{len(scope)} succeeded attempt(s) checked against the "
                                    "object-store listing")


def dead_spans(liveness: Iterable[AgentHeardAgain]) -> dict[str, list[tuple[float, float]]]:
    """Per agent: (known dead from, heard again at) of each silence the records show."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in liveness:
        lo, hi = ts(r.silent_since) + r.timeout_seconds, ts(r.time)
        if hi > lo:
            spans.setdefault(r.agent, []).append((lo, hi))
    return spans


def routed_to_live_agents(attempts: Iterable[Attempt],
                          liveness: Sequence[AgentHeardAgain] | None, start: float, end: float,
                          tolerance: float = DEAD_CLOCK_TOLERANCE) -> InvariantResult:
    """No attempt created in [start, end] on an agent inside one of its dead spans (more than
    ``tolerance`` after its death was known, before it was heard again). An agent that never
    spoke again within the evidence has no record and is not judged (said in the docs)."""
    name = "routed-to-live-agents"
    if liveness is None:
        return InvariantResult(name, 0, no_data="snapshot/agent_liveness.jsonl is missing from "
                               "the evidence")
    spans = {agent: [(lo, hi) for lo, hi in s if lo <= end and hi >= start]
             for agent, s in dead_spans(liveness).items()}
    spans = {agent: s for agent, s in spans.items() if s}
    if not spans:
        return InvariantResult(name, 0, no_data="no agent was known dead in the window (none "
                               "heard again after a silence longer than its liveness timeout)")
    scope = [a for a in attempts if start <= ts(a.created_at) <= end]
    if not scope:
        return InvariantResult(name, 0, no_data="no attempt was dispatched in the window")
    violations = []
    for a in scope:
        t = ts(a.created_at)
        for lo, hi in spans.get(a.agent_name or "", ()):
            if lo + tolerance < t < hi - tolerance:
                violations.append(
                    f"attempt {a.id} of {a.operation_id} dispatched to {a.agent_name} at "
                    f"{_hms(a.created_at)}, {t - lo:.1f}s after its death was known and "
                    f"{hi - t:.1f}s before it was heard again")
    dead = ", ".join(f"{agent} ({len(s)}x)" for agent, s in sorted(spans.items()))
    return InvariantResult(name, len(scope), tuple(violations),
                           measured=f"{len(scope)} dispatch(es) judged; known dead: {dead}")


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def retired_credentials_refused(faults: Iterable[FaultRecord], start: float, end: float,
                                tolerance: float = CREDENTIAL_TOLERANCE) -> InvariantResult:
    """Every request with a retired credential recorded in [start, end] (a
    ``retired_credential_request`` note: ``details.credential``, ``revoked_at`` epoch seconds,
    ``grace_seconds``, ``accepted``) sent after its revocation is refused, unless it was sent
    within the recorded grace after it. Judged: those sent after the revocation; none at all is
    no data (a rehearsal that never used a retired credential proved nothing)."""
    name = "retired-credentials-refused"
    notes = [f for f in faults if f.event == "note" and f.fault == CREDENTIAL_NOTE
             and start <= ts(f.time) <= end]
    judged, violations, unreadable = 0, [], 0
    for f in notes:
        d = f.details
        revoked, grace = _float(d.get("revoked_at")), _float(d.get("grace_seconds"))
        accepted = d.get("accepted")
        if revoked is None or grace is None or not isinstance(accepted, bool):
            unreadable += 1
            continue
        t = ts(f.time)
        if t < revoked:
            continue
        judged += 1
        if accepted and t > revoked + grace + tolerance:
            where = f" at {d['replica']}" if d.get("replica") else ""
            violations.append(
                f"{d.get('kind', 'credential')} {d.get('credential', '?')} accepted{where} at "
                f"{_hms(f.time)}, {t - revoked:.1f}s after its revocation (grace "
                f"{grace:g}s): {str(d.get('answer', ''))[:80]}")
    if not judged:
        why = (f"{unreadable} unreadable record(s)" if unreadable else
               "no request with a retired credential after its revocation in the window")
        return InvariantResult(name, 0, no_data=why + " (fault timeline: "
                               f"{CREDENTIAL_NOTE} notes)")
    return InvariantResult(name, judged, tuple(violations),
                           measured=f"{judged} request(s) with a retired credential after its "
                                    "revocation")
