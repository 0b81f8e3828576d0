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

:func:`plan` is pure (inputs in, decisions out); :func:`reconcile` does the I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

_ARTIFACT_KEY = re.compile(r"^artifacts/(?P<op>[^/]+)/attempt-(?P<n>\d+)/(?P<rest>.+)$")
TERMINAL = ("succeeded", "failed", "canceled")


@dataclass(frozen=True)
class StoredOperation:
    id: str
    project: str
    state: str
    attempt_count: int
    idempotency_key: str | None


@dataclass(frozen=True)
class LedgerLine:
    operation_id: str
    idempotency_key: str
    acked_at: str
    project: str
    request: Mapping[str, Any] | None = None


@dataclass
class Plan:
    quarantine_prefixes: list[str] = field(default_factory=list)   # artifacts/<op>/[attempt-<n>/]
    replay: list[LedgerLine] = field(default_factory=list)          # lost acks that can be re-sent
    unreplayable: list[LedgerLine] = field(default_factory=list)    # lost acks without a request body
    lost_before_restore_point: list[LedgerLine] = field(default_factory=list)
    complete_but_not_terminal: list[str] = field(default_factory=list)   # "<op> <state> <key>"
    succeeded_without_manifest: list[str] = field(default_factory=list)


def plan(operations: Iterable[StoredOperation], object_keys: Iterable[str],
         ledger: Iterable[LedgerLine], restore_point: datetime) -> Plan:
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
    for line in lost_acknowledgements(ops.values(), ledger):
        if _parse(line.acked_at) < restore_point:
            out.lost_before_restore_point.append(line)
        elif line.request is None:
            out.unreplayable.append(line)
        else:
            out.replay.append(line)
    return out


def lost_acknowledgements(operations: Iterable[StoredOperation],
                          ledger: Iterable[LedgerLine]) -> list[LedgerLine]:
    """The first acknowledgement of each (project, key) the store has neither by key nor by
    operation id (as the durability SLI matches, slo/sli.py), oldest first."""
    ops = list(operations)
    ids = {o.id for o in ops}
    keys = {(o.project, o.idempotency_key) for o in ops if o.idempotency_key}
    seen: set[tuple[str, str]] = set()
    out = []
    for line in sorted(ledger, key=lambda entry: entry.acked_at):
        k = (line.project, line.idempotency_key)
        if k in seen or k in keys or line.operation_id in ids:
            continue
        seen.add(k)
        out.append(line)
    return out


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value)


def read_ledgers(paths: Iterable[Path]) -> list[LedgerLine]:
    """Client ledger lines (docs/EVIDENCE.md) from JSONL files; a torn last line (a writer
    mid-append) is skipped, anything else malformed is an error naming file and line."""
    out: list[LedgerLine] = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                d = json.loads(raw)
                out.append(LedgerLine(str(d["operation_id"]), str(d["idempotency_key"]),
                                      str(d["acked_at"]), str(d["project"]), d.get("request")))
            except (ValueError, KeyError) as exc:
                if i == len(lines):
                    continue
                raise ValueError(f"{path}:{i}: not a ledger line ({exc})") from exc
    return out


# -- I/O ------------------------------------------------------------------------------------
def load_operations(dsn: str) -> list[StoredOperation]:
    import psycopg

    with psycopg.connect(dsn, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT o.id::text, p.name, o.state, o.attempt_count, o.idempotency_key "
            "FROM operations o JOIN projects p ON p.id = o.project_id").fetchall()
    return [StoredOperation(*r) for r in rows]


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


RESTORE_ROUTE = "/v1/admin/operations/restore"  # controlplane/api/admin.py


def replay(api_url: str, admin_token: str, line: LedgerLine, restore_id: str,
           timeout: float = 10.0) -> dict[str, Any]:
    """Re-create one lost acknowledgement under its operation id (admin route). The record
    (restore.json): ``old_id`` the client holds, ``new_id`` that answers now, ``identity``
    ``same_id`` (they are equal) or ``redirect`` (the old id answers 308 to the new one)."""
    import httpx

    out: dict[str, Any] = {"key": line.idempotency_key, "status": None,
                           "old_id": line.operation_id, "new_id": None, "identity": None}
    body = {"project": line.project, "idempotency_key": line.idempotency_key,
            "operation_id": line.operation_id, "spec": dict(line.request or {}),
            "acknowledged_at": line.acked_at, "restore_id": restore_id,
            "redirect_if_key_taken": True}
    try:
        r = httpx.post(f"{api_url}{RESTORE_ROUTE}", json=body, timeout=timeout,
                       headers={"Authorization": f"Bearer {admin_token}"})
    except httpx.HTTPError as exc:
        return {**out, "error": f"{type(exc).__name__}: {exc}"}
    out["status"] = r.status_code
    if r.status_code not in (200, 201):
        return {**out, "error": r.text[:300]}
    out["new_id"] = r.json().get("id")
    same = str(out["new_id"]).lower() == line.operation_id.lower()
    out["identity"] = "same_id" if same else "redirect"
    return {**out, "error": None}


def reconcile(*, dsn: str, s3: Any, bucket: str, ledger: list[LedgerLine],
              restore_point: datetime, restore_id: str, apply: bool,
              api_url: str | None = None, admin_token: str | None = None,
              ) -> dict[str, Any]:
    """Plan, then (with ``apply``) quarantine, and replay when ``api_url`` is given. Without
    it (intake still closed, the restore order's step 5) the lines to replay after the reopen
    are returned as ``replay_pending``. ``consistent``: store and object storage agree and
    every lost acknowledgement can be (or was) replayed - nothing left for a human."""
    decided = plan(load_operations(dsn), _list_keys(s3, bucket, "artifacts/"), ledger, restore_point)
    report: dict[str, Any] = {k: v for k, v in asdict(decided).items()
                              if k not in ("replay", "unreplayable", "lost_before_restore_point")}
    report.update(restore_id=restore_id, restore_point=restore_point.isoformat(), applied=apply,
                  lost_acknowledged=len(decided.replay) + len(decided.unreplayable) +
                  len(decided.lost_before_restore_point),
                  unreplayable=[x.idempotency_key for x in decided.unreplayable],
                  lost_before_restore_point=[x.idempotency_key for x in decided.lost_before_restore_point])
    failed: list[dict[str, Any]] = []
    if apply:
        report["quarantined_objects"] = sum(quarantine(s3, bucket, p, restore_id)
                                            for p in decided.quarantine_prefixes)
        if api_url:
            report["replayed"] = [replay(api_url, admin_token or "", x, restore_id)
                                  for x in decided.replay]
            failed = [r for r in report["replayed"] if r["error"]]
        else:
            report["replay_pending"] = [{**asdict(x), "restore_id": restore_id}
                                        for x in decided.replay]
    report["consistent"] = bool(apply and not failed and not decided.unreplayable
                                and not decided.lost_before_restore_point
                                and not decided.succeeded_without_manifest)
    return report
