"""The reconciliation step after a database restore (environments/local/restore_reconcile.py): the
pure plan, and the ledger reader's errors. The real restore is exercised end to end in
tests/gameday/test_db_restore.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from environments.local.restore_reconcile import plan
from platforms.base import StoredOperation
from slo import ledger
from slo.ledger import LedgerEntry, LedgerError

RESTORE_POINT = datetime(2026, 1, 6, 10, 0, tzinfo=UTC)
BODY = {"name": "x", "workload": {"kind": "train"}}


def op(i: str, state: str = "succeeded", attempts: int = 1, key: str | None = None) -> StoredOperation:
    return StoredOperation(i, "team-a", state, attempts, key or f"k-{i}")


def ack(i: str, at: str, key: str | None = None, body: dict | None = BODY,
        project: str = "team-a") -> LedgerEntry:
    return LedgerEntry(operation_id=i, idempotency_key=key or f"k-{i}", acked_at=at,
                       project=project, request=body)


def test_artifacts_of_unknown_operations_and_attempts_are_quarantined_known_ones_kept() -> None:
    keys = ["artifacts/a/attempt-1/COMPLETE.json", "artifacts/a/attempt-1/model.npy",
            "artifacts/a/attempt-2/model.npy",          # attempt the store never granted
            "artifacts/gone/attempt-1/COMPLETE.json",   # operation created after the restore point
            "checkpoints/gone/attempt-1/step-00000010/MANIFEST.json"]  # left: read via manifests
    p = plan([op("a", attempts=1)], keys, [], RESTORE_POINT)
    assert p.quarantine_prefixes == ["artifacts/gone/", "artifacts/a/attempt-2/"]
    assert p.succeeded_without_manifest == [] and p.complete_but_not_terminal == []


def test_terminal_state_mismatches_are_reported_not_repaired() -> None:
    keys = ["artifacts/run/attempt-1/COMPLETE.json"]
    p = plan([op("run", state="running"), op("done", state="succeeded")], keys, [], RESTORE_POINT)
    assert p.complete_but_not_terminal == ["run running artifacts/run/attempt-1/COMPLETE.json"]
    assert p.succeeded_without_manifest == ["done"]
    assert p.quarantine_prefixes == []


def test_lost_acknowledgements_after_the_restore_point_are_replayed_once_per_key() -> None:
    ledger = [ack("kept", "2026-01-06T09:59:00Z"),
              ack("lost", "2026-01-06T10:00:05Z"),
              ack("lost", "2026-01-06T10:00:06Z"),                  # client retry, same key: one
              ack("nobody", "2026-01-06T10:00:07Z", body=None),      # no body kept: cannot replay
              ack("early", "2026-01-06T09:58:00Z")]                 # before the point: backup bad
    p = plan([op("kept")], [], ledger, RESTORE_POINT)
    assert [x.idempotency_key for x in p.replay] == ["k-lost"]
    assert p.replay[0].acked_at == datetime(2026, 1, 6, 10, 0, 5, tzinfo=UTC)
    assert [x.idempotency_key for x in p.unreplayable] == ["k-nobody"]
    assert [x.idempotency_key for x in p.lost_before_restore_point] == ["k-early"]


def test_an_acknowledgement_present_by_key_or_by_id_is_not_replayed() -> None:
    ledger = [ack("x", "2026-01-06T10:01:00Z", key="same-key"),
              ack("y", "2026-01-06T10:01:00Z", key="other")]
    ops = [StoredOperation("new-id", "team-a", "queued", 0, "same-key"),  # replayed earlier
           StoredOperation("y", "team-a", "queued", 0, None)]             # store lost the key
    assert plan(ops, [], ledger, RESTORE_POINT).replay == []


def test_same_key_in_another_project_is_another_submission() -> None:
    entries = [ack("x", "2026-01-06T10:01:00Z", key="k", project="team-b")]
    ops = [StoredOperation("a", "team-a", "queued", 0, "k")]
    assert [x.project for x in plan(ops, [], entries, RESTORE_POINT).replay] == ["team-b"]


def test_the_ledger_reader_skips_a_torn_last_line_and_names_a_bad_one(tmp_path: Path) -> None:
    good = json.dumps({"operation_id": "a", "idempotency_key": "k", "acked_at": "2026-01-06T10:00:00Z",
                       "project": "team-a", "status": 201, "request": BODY})
    path = tmp_path / "ledger.jsonl"
    path.write_text(good + "\n" + good[:20])
    (line,) = ledger.read([path], torn_tail_ok=True)
    assert line.request == BODY
    with pytest.raises(LedgerError, match=r"ledger.jsonl: line 2: not valid JSON"):
        ledger.read([path])  # the evidence loader: a torn line is not tolerated
    path.write_text('{"operation_id": "a"}\n' + good + "\n")
    with pytest.raises(LedgerError, match=r"ledger.jsonl: line 1: field idempotency_key"):
        ledger.read([path], torn_tail_ok=True)
