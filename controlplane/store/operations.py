"""User-facing operation queries: submit (commit before acknowledge), read, list, cancel,
side effects, operator route override."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from controlplane import defects
from controlplane.states import TERMINAL, ActiveAttemptStates, OpState
from controlplane.store import Conflict, InvalidReference, NotFound, columns
from controlplane.store.submissions import SubmitItem, SubmitResult, payload_hash, submit_many
from controlplane.store.transitions import record_event, transition

NOTIFY_CHANNEL = "controlplane_work"


async def submit(conn: AsyncConnection, *, project_id: str, key: str, spec: dict[str, Any],
                 actor: str, op_id: str | None = None) -> SubmitResult:
    """Commit one operation (one statement = one transaction) before anyone acknowledges it:
    a group of one (store/submissions.py)."""
    [res] = await submit_many(conn, [SubmitItem(project_id, key, spec, actor, op_id)])
    if isinstance(res, Exception):
        raise res
    return res


async def get(conn: AsyncConnection, op_id: str, project_id: str | None) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT {columns.of('operations')} FROM operations"
            " WHERE id = %s AND (%s::uuid IS NULL OR project_id = %s)",
            (_uuid(op_id), project_id, project_id))
        row = await cur.fetchone()
    if row is None:
        new_id = await redirect_of(conn, op_id, project_id)
        if new_id is not None:
            raise Moved(op_id, new_id)
        raise NotFound(f"operation {op_id} not found")
    return row


def encode_cursor(created_at: datetime, op_id: Any) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{op_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        ts, op_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return datetime.fromisoformat(ts), uuid.UUID(op_id)
    except Exception as exc:
        raise InvalidReference("cursor is malformed; pass next_cursor from a previous page",
                               ("query", "cursor")) from exc


async def list_ops(conn: AsyncConnection, *, project_id: str | None, state: str | None,
                   queue: str | None, limit: int, cursor: str | None,
                   ) -> tuple[list[dict[str, Any]], str | None]:
    after = decode_cursor(cursor) if cursor else None
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"""SELECT {columns.of("operations")} FROM operations
               WHERE (%(project)s::uuid IS NULL OR project_id = %(project)s)
                 AND (%(state)s::text IS NULL OR state = %(state)s)
                 AND (%(queue)s::text IS NULL OR queue = %(queue)s)
                 AND (%(after_ts)s::timestamptz IS NULL OR (created_at, id) > (%(after_ts)s, %(after_id)s))
               ORDER BY created_at, id LIMIT %(limit)s""",
            {"project": project_id, "state": state, "queue": queue, "limit": limit + 1,
             "after_ts": after[0] if after else None, "after_id": after[1] if after else None})
        rows = await cur.fetchall()
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1]["created_at"], rows[-1]["id"])
    return rows, next_cursor


async def events(conn: AsyncConnection, op_id: str) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT {columns.of('events')} FROM events WHERE operation_id = %s"
                          " ORDER BY id", (op_id,))
        return await cur.fetchall()


async def attempts(conn: AsyncConnection, op_id: str) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT {columns.of('attempts', 't')}, a.name AS agent_name"
            " FROM attempts t JOIN agents a ON a.id = t.agent_id"
            " WHERE t.operation_id = %s ORDER BY t.number", (op_id,))
        return await cur.fetchall()


async def cancel(conn: AsyncConnection, op_id: str, project_id: str | None, *, actor: str,
                 reason: str) -> dict[str, Any]:
    async with conn.transaction():
        op = await get(conn, op_id, project_id)
        if OpState(op["state"]) in TERMINAL:
            raise Conflict(f"operation {op_id} is already {op['state']}")
        row = await transition(conn, op["id"], OpState.CANCELED, actor=actor, reason=reason)
        if row is None:
            raise Conflict(f"operation {op_id} changed state concurrently; retry")
        await conn.execute(
            "UPDATE attempts SET state = 'canceled', finished_at = now()"
            " WHERE operation_id = %s AND state = ANY(%s)", (op["id"], ActiveAttemptStates))
        await conn.execute("SELECT pg_notify(%s, 'canceled')", (NOTIFY_CHANNEL,))
    return row


async def side_effect(conn: AsyncConnection, op_id: str, project_id: str | None, *,
                      action_id: str, kind: str, payload: dict[str, Any], actor: str,
                      ) -> tuple[dict[str, Any], bool]:
    """Record an external action once. A retry with the same action id gets the same receipt."""
    op = await get(conn, op_id, project_id)
    receipt = {"receipt_id": str(uuid.uuid4()), "action_id": action_id, "kind": kind,
               "operation_id": str(op["id"])}
    if defects.enabled("registration-without-receipt"):  # seeded defect: no stable identity
        action_id = f"{action_id}:{receipt['receipt_id']}"
        receipt["action_id"] = action_id
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "INSERT INTO side_effects (operation_id, action_id, kind, payload, receipt)"
            f" VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING {columns.of('side_effects')}",
            (op["id"], action_id, kind, Jsonb(payload), Jsonb(receipt)))
        row = await cur.fetchone()
        if row is not None:
            await record_event(conn, op["id"], actor=actor, kind="side_effect",
                               reason=f"{kind} recorded", data=receipt)
            return row, True
        await cur.execute(
            f"SELECT {columns.of('side_effects')} FROM side_effects"
            " WHERE operation_id = %s AND action_id = %s",
            (op["id"], action_id))
        existing = await cur.fetchone()
    assert existing is not None
    if existing["kind"] != kind or existing["payload"] != payload:
        raise Conflict(f"action_id {action_id!r} was already recorded with a different "
                       "kind or payload")
    return existing, False


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise NotFound(f"operation {value} not found") from exc


# -- restore from a client ledger (admin) ------------------------------------------------------
class Moved(NotFound):
    """The id was acknowledged, but a database restore could only re-create it under another
    id (see :func:`restore`). A NotFound, so a caller that does not know redirects still fails
    closed with 404."""

    def __init__(self, old_id: str, new_id: str) -> None:
        super().__init__(f"operation {old_id} was restored as {new_id}")
        self.old_id, self.new_id = old_id, new_id


@dataclass(frozen=True)
class RestoreResult:
    operation: dict[str, Any]
    created: bool
    identity: str  # same_id | redirect


async def redirect_of(conn: AsyncConnection, op_id: str, project_id: str | None) -> str | None:
    """The id that replaced ``op_id``, visible to ``project_id`` (None: admin, any project)."""
    try:
        old = uuid.UUID(str(op_id))
    except ValueError:
        return None
    cur = await conn.execute(
        "SELECT new_id::text FROM operation_redirects"
        " WHERE old_id = %s AND (%s::uuid IS NULL OR project_id = %s)",
        (old, project_id, project_id))
    row = await cur.fetchone()
    return row[0] if row else None


_RESTORE = """
WITH ins AS (
    INSERT INTO operations (id, project_id, idempotency_key, payload_hash, name, queue, priority,
                            spec, state, state_reason, max_retries, timeout_seconds)
    VALUES (%(op_id)s, %(project_id)s, %(key)s, %(hash)s, %(name)s, %(queue)s, %(priority)s,
            %(spec)s, 'accepted', 'restored from a client ledger', %(max_retries)s, %(timeout)s)
    ON CONFLICT DO NOTHING
    RETURNING {ops}
), ev AS (
    INSERT INTO events (operation_id, actor, kind, to_state, reason, data)
    SELECT id, %(actor)s, 'restored_from_ledger', 'accepted',
           'acknowledged submission restored from a client ledger', %(data)s
    FROM ins
), n AS (
    SELECT pg_notify('controlplane_work', 'submitted') FROM ins
)
SELECT {ops}, (SELECT count(*) FROM n) AS notified FROM ins
"""


async def restore(conn: AsyncConnection, *, project_id: str, key: str, spec: dict[str, Any],
                  op_id: str, acked_at: datetime, restore_id: str, actor: str,
                  redirect_if_key_taken: bool = False) -> RestoreResult:
    """Re-create an acknowledged submission a database restore lost, under the id the client
    was given, in one transaction. Idempotent: the same id, key and payload again -> the same
    operation (``created`` False). Conflicts name what holds the id or the key. Only when the
    key now belongs to another operation with the same payload (the client re-submitted after
    the restore) and ``redirect_if_key_taken``: record ``op_id`` -> that operation instead."""
    h = payload_hash(spec)
    data = {"idempotency_key": key, "acked_at": acked_at.isoformat(), "restore_id": restore_id}
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        # one restore of an id at a time: the checks below read, then write a redirect
        await cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                          (f"restore:{op_id}",))
        await cur.execute(f"SELECT {columns.of('operation_redirects')} FROM operation_redirects"
                          " WHERE old_id = %s", (op_id,))
        moved = await cur.fetchone()
        if moved is not None:
            return await _existing_redirect(cur, moved, project_id, key, h, op_id)
        try:
            await cur.execute(_RESTORE.replace("{ops}", columns.of("operations")), {
                "op_id": op_id, "project_id": project_id, "key": key, "hash": h,
                "name": spec["name"], "queue": spec["queue"], "priority": spec["priority"],
                "spec": Jsonb(spec), "max_retries": spec["max_retries"],
                "timeout": spec["timeout_seconds"], "actor": actor, "data": Jsonb(data)})
        except psycopg.errors.ForeignKeyViolation as exc:
            raise InvalidReference(f"queue {spec['queue']!r} does not exist",
                                   ("body", "spec", "queue")) from exc
        row = await cur.fetchone()
        if row is not None:
            return RestoreResult(row, True, "same_id")
        await cur.execute(f"SELECT {columns.of('operations')} FROM operations WHERE id = %s",
                          (op_id,))
        by_id = await cur.fetchone()
        if by_id is not None and (str(by_id["project_id"]) != str(project_id)
                                  or by_id["idempotency_key"] != key):
            raise Conflict(f"operation id {op_id} is taken by another submission (key "
                           f"{by_id['idempotency_key']!r}); it cannot be restored under it")
        await cur.execute(f"SELECT {columns.of('operations')} FROM operations"
                          " WHERE project_id = %s AND idempotency_key = %s", (project_id, key))
        by_key = await cur.fetchone()
        if by_key is None:  # cannot happen: operations are never deleted
            raise Conflict(f"operation {op_id} conflicts but is not visible; retry")
        if by_key["payload_hash"] != h:
            raise Conflict(f"idempotency key {key!r} belongs to operation {by_key['id']} with a "
                           "different payload; not the acknowledged submission")
        if str(by_key["id"]) == str(op_id):
            return RestoreResult(by_key, False, "same_id")
        if not redirect_if_key_taken:
            raise Conflict(f"idempotency key {key!r} now belongs to operation {by_key['id']}, "
                           f"not {op_id}; pass redirect_if_key_taken to redirect {op_id} to it")
        await cur.execute(
            "INSERT INTO operation_redirects (old_id, new_id, project_id, idempotency_key,"
            " restore_id, acknowledged_at) VALUES (%s, %s, %s, %s, %s, %s)",
            (op_id, by_key["id"], project_id, key, restore_id, acked_at))
        await record_event(conn, by_key["id"], actor=actor, kind="restored_from_ledger",
                           reason=f"acknowledged as {op_id}: that id now redirects here",
                           data={**data, "redirected_from": str(op_id)})
    return RestoreResult(by_key, False, "redirect")


async def _existing_redirect(cur: Any, moved: dict[str, Any], project_id: str, key: str,
                             h: str, op_id: str) -> RestoreResult:
    """A repeated restore of an id that was already redirected: the same answer, or a 409."""
    if str(moved["project_id"]) != str(project_id) or moved["idempotency_key"] != key:
        raise Conflict(f"operation id {op_id} already redirects to {moved['new_id']} for key "
                       f"{moved['idempotency_key']!r}")
    await cur.execute(f"SELECT {columns.of('operations')} FROM operations WHERE id = %s",
                      (moved["new_id"],))
    target = await cur.fetchone()
    if target["payload_hash"] != h:
        raise Conflict(f"operation id {op_id} redirects to {target['id']}, whose payload differs")
    return RestoreResult(target, False, "redirect")
