"""Step 5 of the database restore order (runbooks/db-primary-loss.md): reconcile the restored
store with object storage and the client ledgers.

A restore rewinds the store to the restore point; object storage and the clients do not
rewind. So after a restore there can be:

- artifacts of operations the store no longer knows (created after the restore point), and
  artifacts of attempts it no longer knows (attempt number above ``attempt_count``): moved to
  ``quarantine/restore-<id>/`` so a new attempt with the same number never mixes with them;
- acknowledged submissions the store lost: replayed from the client ledgers through the admin
  restore route with the **same** operation id and idempotency key, so a client holding the id
  it was given still finds it (201 = re-created, 200 = it was there after all). Only when the
  key was re-used for the same payload after the restore (the client re-submitted) does the
  old id become a redirect (308) to the operation holding the key (``identity``);
- non-terminal operations with a completion manifest, and succeeded operations without one:
  reported, never hand-edited (fail closed: only an attempt that verified its artifacts marks
  an operation succeeded; the retry path re-runs and resumes from the newest checkpoint).

:func:`plan` is pure (inputs in, decisions out); :func:`reconcile` does the I/O, reaching the
platform only through its adapter (store index, replay) and object storage directly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from platforms.base import StoredOperation
from slo import ledger
from slo.ledger import LedgerEntry

_ARTIFACT_KEY = re.compile(r"^artifacts/(?P<op>[^/]+)/attempt-(?P<n>\d+)/(?P<rest>.+)$")
TERMINAL = ("succeeded", "failed", "canceled")


@dataclass
class Plan:
    quarantine_prefixes: list[str] = field(default_factory=list)   # artifacts/<op>/[attempt-<n>/]
    replay: list[LedgerEntry] = field(default_factory=list)         # lost acks that can be re-sent
    unreplayable: list[LedgerEntry] = field(default_factory=list)   # lost acks without a request body
    lost_before_restore_point: list[LedgerEntry] = field(default_factory=list)
    complete_but_not_terminal: list[str] = field(default_factory=list)   # "<op> <state> <key>"
    succeeded_without_manifest: list[str] = field(default_factory=list)


def lost_acknowledgements(operations: Iterable[StoredOperation],
                          entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """The acknowledged submissions the store does not have (slo.ledger.lost, the same rule
    as the durability SLI), oldest first."""
    ops = list(operations)
    return ledger.lost(entries, {o.id for o in ops},
                       {(o.project, o.idempotency_key) for o in ops if o.idempotency_key})


def plan(operations: Iterable[StoredOperation], object_keys: Iterable[str],
         entries: Iterable[LedgerEntry], restore_point: datetime) -> Plan:
    """Decide what step 5 does. ``restore_point``: the time the restored data is consistent
    to; a lost acknowledgement from before it means the backup itself was incomplete."""
    ops = {o.id: o for o in operations}
    out = Plan()
    manifests: dict[str, list[str]] = {}
    unknown_ops: set[str] = set()
    unknown_attempts: set[tuple[str, int]] = set()
    for key in object_keys:
        m = _ARTIFACT_KEY.match(key)
        if not m:
            continue
        op_id, n = m["op"], int(m["n"])
        if op_id not in ops:
            unknown_ops.add(op_id)
        elif n > ops[op_id].attempt_count:
            unknown_attempts.add((op_id, n))
        elif m["rest"] == "COMPLETE.json":
            manifests.setdefault(op_id, []).append(key)
    out.quarantine_prefixes = ([f"artifacts/{o}/" for o in sorted(unknown_ops)] +
                               [f"artifacts/{o}/attempt-{n}/" for o, n in sorted(unknown_attempts)])
    for op in sorted(ops.values(), key=lambda o: o.id):
        if op.state not in TERMINAL:
            out.complete_but_not_terminal += [f"{op.id} {op.state} {k}" for k in manifests.get(op.id, [])]
        elif op.state == "succeeded" and op.id not in manifests:
            out.succeeded_without_manifest.append(op.id)
    for entry in lost_acknowledgements(ops.values(), entries):
        if entry.acked_at < restore_point:
            out.lost_before_restore_point.append(entry)
        elif entry.request is None:
            out.unreplayable.append(entry)
        else:
            out.replay.append(entry)
    return out


# -- I/O ------------------------------------------------------------------------------------
def _list_keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def quarantine(s3: Any, bucket: str, prefix: str, restore_id: str) -> int:
    """Copy every object under ``prefix`` to ``quarantine/restore-<id>/<prefix>`` and delete
    the original only after its copy exists (a crash leaves a duplicate, never a loss)."""
    moved = 0
    for key in _list_keys(s3, bucket, prefix):
        s3.copy_object(Bucket=bucket, Key=f"quarantine/restore-{restore_id}/{key}",
                       CopySource={"Bucket": bucket, "Key": key})
        s3.delete_object(Bucket=bucket, Key=key)
        moved += 1
    return moved


def pending_line(entry: LedgerEntry, restore_id: str) -> dict[str, Any]:
    """A lost acknowledgement waiting for the reopen (JSON: it goes into restore.json)."""
    return {**entry.model_dump(mode="json"), "restore_id": restore_id}


def from_pending(line: dict[str, Any]) -> tuple[LedgerEntry, str]:
    fields = dict(line)
    return LedgerEntry.model_validate(fields), str(fields.pop("restore_id"))


def reconcile(*, adapter: Any, s3: Any, bucket: str, entries: list[LedgerEntry],
              restore_point: datetime, restore_id: str, apply: bool,
              replay_now: bool = False) -> dict[str, Any]:
    """Plan, then (with ``apply``) quarantine, and replay through the adapter when
    ``replay_now``. Otherwise (intake still closed, the restore order's step 5) the entries to
    replay after the reopen are returned as ``replay_pending``. ``consistent``: store and object
    storage agree and every lost acknowledgement can be (or was) replayed - nothing left for a
    human. ``adapter``: the platform's (``stored_operations``, ``restore_acknowledged``)."""
    decided = plan(adapter.stored_operations(), _list_keys(s3, bucket, "artifacts/"), entries,
                   restore_point)
    report: dict[str, Any] = {
        "quarantine_prefixes": decided.quarantine_prefixes,
        "complete_but_not_terminal": decided.complete_but_not_terminal,
        "succeeded_without_manifest": decided.succeeded_without_manifest,
        "restore_id": restore_id, "restore_point": restore_point.isoformat(), "applied": apply,
        "lost_acknowledged": len(decided.replay) + len(decided.unreplayable)
                             + len(decided.lost_before_restore_point),
        "unreplayable": [x.idempotency_key for x in decided.unreplayable],
        "lost_before_restore_point": [x.idempotency_key for x in decided.lost_before_restore_point],
    }
    failed: list[dict[str, Any]] = []
    if apply:
        report["quarantined_objects"] = sum(quarantine(s3, bucket, p, restore_id)
                                            for p in decided.quarantine_prefixes)
        if replay_now:
            report["replayed"] = [adapter.restore_acknowledged(x, restore_id)
                                  for x in decided.replay]
            failed = [r for r in report["replayed"] if r["error"]]
        else:
            report["replay_pending"] = [pending_line(x, restore_id) for x in decided.replay]
    report["consistent"] = bool(apply and not failed and not decided.unreplayable
                                and not decided.lost_before_restore_point
                                and not decided.succeeded_without_manifest)
    return report
