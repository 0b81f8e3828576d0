"""The outcome invariants (slo/outcome_invariants.py) on hand-made evidence: each holds on a
healthy record, fails on the outcome a broken platform leaves whichever path broke it, and says
"no data" when the window had nothing to judge."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

from slo.evidence import AgentHeardAgain, Attempt, Event, FaultRecord, StoredObject
from slo.invariants import KNOWN_INVARIANTS
from slo.outcome_invariants import (
    artifacts_complete,
    retired_credentials_refused,
    routed_to_live_agents,
)
from slo.sli import ObjectIndex

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
START, END = T0.timestamp(), T0.timestamp() + 300
PREFIX = "artifacts/op-1/attempt-1"
FILES = {"model.npy": b"weights", "metrics.json": b'{"loss": 0.1}'}


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _objects(files: dict[str, bytes] = FILES, listed: tuple[str, ...] | None = None,
             manifest: bool = True) -> ObjectIndex:
    """The bucket after the attempt: ``files`` uploaded, a COMPLETE.json listing ``listed``
    (default: every uploaded file) with their digests."""
    objs = [StoredObject(key=f"{PREFIX}/{n}", size=len(b), sha256=_sha(b))
            for n, b in files.items()]
    if manifest:
        names = listed if listed is not None else tuple(files)
        content = {"files": {n: {"sha256": _sha(FILES[n])} for n in names}}
        objs.append(StoredObject(key=f"{PREFIX}/COMPLETE.json", size=10, content=content))
    return ObjectIndex.of(objs)


def _attempt(state: str = "succeeded", result: dict[str, Any] | None = None,
             agent: str = "cpu-1", created: float = 10, number: int = 1,
             aid: str = "att-1") -> Attempt:
    return Attempt(id=aid, operation_id="op-1", number=number, state=state, agent_name=agent,
                   created_at=_at(created), finished_at=_at(created + 20), result=result)


def _written(files: list[str]) -> Event:
    return Event(id=1, operation_id="op-1", attempt_id="att-1", time=_at(29),
                 kind="artifact_written", data={"prefix": PREFIX, "files": files})


FULL_RESULT = {"files": {n: {"sha256": _sha(b)} for n, b in FILES.items()}}


# ------------------------------------------------------------------- artifacts-complete

def test_artifacts_complete_holds_for_a_verified_complete_result() -> None:
    r = artifacts_complete([_attempt(result=FULL_RESULT)], [_written(sorted(FILES))],
                           _objects(), START, END)
    assert (r.name, r.judged, r.violations, r.no_data) == ("artifacts-complete", 1, (), None)


def test_a_result_naming_fewer_files_than_the_manifest_fails() -> None:
    """The issue's mutation: success without reading the artifacts back, the result names
    only the weights; every write was complete, so the reported-writes audit passes."""
    told = {"files": {"model.npy": {"sha256": _sha(FILES["model.npy"])}}}
    r = artifacts_complete([_attempt(result=told)], [_written(sorted(FILES))], _objects(),
                           START, END)
    assert len(r.violations) == 1
    assert "result names 1 of the manifest's 2 file(s): not metrics.json" in r.violations[0]


def test_a_result_whose_digest_differs_from_the_manifest_fails() -> None:
    told = {"files": {"model.npy": {"sha256": "0" * 64}, "metrics.json": ""}}
    r = artifacts_complete([_attempt(result=told)], [], _objects(), START, END)
    assert ["digest of model.npy differs" in v for v in r.violations] == [True]


def test_a_succeeded_attempt_without_its_manifest_fails_even_with_no_write_reported() -> None:
    """No artifact_written event at all (the write skipped, the exit code trusted): the audit
    of reported writes has nothing to check, this one judges the succeeded attempt."""
    r = artifacts_complete([_attempt(result={"image": "x"})], [], _objects(manifest=False),
                           START, END)
    assert len(r.violations) == 1 and "no COMPLETE.json under " + PREFIX in r.violations[0]


def test_a_manifest_that_omits_a_file_the_attempt_wrote_fails() -> None:
    r = artifacts_complete([_attempt()], [_written(sorted(FILES))],
                           _objects(listed=("model.npy",)), START, END)
    assert len(r.violations) == 1
    assert "lists 1 file(s) but the attempt wrote metrics.json too" in r.violations[0]


def test_a_listed_file_missing_or_with_another_digest_fails() -> None:
    missing = artifacts_complete([_attempt()], [], _objects(
        files={"model.npy": FILES["model.npy"]}, listed=tuple(FILES)), START, END)
    assert ["metrics.json listed in COMPLETE.json but missing" in v
            for v in missing.violations] == [True]
    torn = artifacts_complete([_attempt()], [], _objects(
        files={**FILES, "model.npy": b"torn"}), START, END)
    assert ["model.npy checksum differs" in v for v in torn.violations] == [True]


def test_artifacts_complete_judges_only_attempts_that_succeeded_in_the_window() -> None:
    r = artifacts_complete([_attempt(state="failed"), _attempt(created=400)], [],
                           _objects(manifest=False), START, END)
    assert r.judged == 0 and r.no_data == "no attempt succeeded in the window"


# ------------------------------------------------------------------- routed-to-live-agents

# gpu-1 heartbeated last at 20 s, timeout 5 s: known dead from 25 s until heard again at 90 s
SILENCE = [AgentHeardAgain(agent="gpu-1", time=_at(90), silent_since=_at(20),
                           timeout_seconds=5)]


def test_dispatches_outside_the_dead_span_hold() -> None:
    attempts = [_attempt(agent="gpu-1", created=24), _attempt(agent="gpu-1", created=91,
                                                              aid="att-2"),
                _attempt(agent="gpu-2", created=50, aid="att-3")]
    r = routed_to_live_agents(attempts, SILENCE, START, END)
    assert (r.judged, r.violations, r.no_data) == (3, (), None)
    assert r.measured is not None and "gpu-1 (1x)" in r.measured


def test_a_dispatch_to_an_agent_known_dead_fails() -> None:
    r = routed_to_live_agents([_attempt(agent="gpu-1", created=40)], SILENCE, START, END)
    assert len(r.violations) == 1
    assert "dispatched to gpu-1" in r.violations[0]
    assert "15.0s after its death was known and 50.0s before it was heard again" in (
        r.violations[0])


def test_routing_without_liveness_records_is_no_data_never_a_pass() -> None:
    missing = routed_to_live_agents([_attempt(created=40)], None, START, END)
    assert missing.no_data is not None and "agent_liveness.jsonl" in missing.no_data
    nobody_died = routed_to_live_agents([_attempt(created=40)], [], START, END)
    assert nobody_died.judged == 0 and "no agent was known dead" in (nobody_died.no_data or "")
    # a silence shorter than the timeout is no death (the record would not be written either)
    short = [AgentHeardAgain(agent="gpu-1", time=_at(22), silent_since=_at(20),
                             timeout_seconds=5)]
    assert routed_to_live_agents([_attempt(created=21)], short, START, END).no_data


# ------------------------------------------------------------ retired-credentials-refused

REVOKED = START + 100


def _try(after: float, accepted: bool, kind: str = "agent_token",
         grace: float = 5.0) -> FaultRecord:
    return FaultRecord(time=datetime.fromtimestamp(REVOKED + after, UTC), event="note",
                       fault="retired_credential_request", target="controlplane",
                       details={"kind": kind, "credential": "abc123", "replica": "api-1",
                                "revoked_at": REVOKED, "grace_seconds": grace,
                                "accepted": accepted, "status": 404 if accepted else 401})


def test_retired_credentials_accepted_only_within_the_grace_hold() -> None:
    r = retired_credentials_refused([_try(0.1, True), _try(3.0, True), _try(4.9, False),
                                     _try(6.0, False, kind="db_password", grace=0)],
                                    START, END)
    assert (r.judged, r.violations, r.no_data) == (4, (), None)


def test_a_retired_credential_accepted_after_the_grace_fails() -> None:
    r = retired_credentials_refused([_try(0.1, True), _try(12.0, True)], START, END)
    assert len(r.violations) == 1
    assert r.violations[0].startswith("agent_token abc123 accepted at api-1")
    assert "12.0s after its revocation (grace 5s)" in r.violations[0]
    password = retired_credentials_refused([_try(1.0, True, kind="db_password", grace=0)],
                                           START, END)
    assert len(password.violations) == 1


def test_no_request_with_a_retired_credential_is_no_data() -> None:
    r = retired_credentials_refused([], START, END)
    assert r.judged == 0 and r.no_data is not None
    before = FaultRecord(time=datetime.fromtimestamp(REVOKED - 1, UTC), event="note",
                         fault="retired_credential_request", target="controlplane",
                         details={"revoked_at": REVOKED, "grace_seconds": 5.0,
                                  "accepted": True})
    assert retired_credentials_refused([before], START, END).no_data


def test_the_outcome_invariants_are_known_to_the_specs() -> None:
    assert {"artifacts-complete", "routed-to-live-agents",
            "retired-credentials-refused"} <= set(KNOWN_INVARIANTS)
