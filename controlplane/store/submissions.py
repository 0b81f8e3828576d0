"""Submissions in groups: many operations committed by one statement (one transaction).

A group is what concurrent requests to one API replica gathered while the previous group was
committing (controlplane/api/group_commit.py). Each request keeps its own answer: created,
duplicate of an earlier submission with the same key and payload, or a conflict. Nothing is
answered before the statement that holds it has committed, so a 201 still means "committed".
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from controlplane import defects
from controlplane.store import Conflict, InvalidReference, columns


@dataclass(frozen=True)
class SubmitResult:
    operation: dict[str, Any]
    created: bool


@dataclass(frozen=True)
class SubmitItem:
    project_id: str
    key: str
    spec: dict[str, Any]
    actor: str
    op_id: str | None = None  # restore/replay keeps an operation's id; None = a new one

    @property
    def ident(self) -> tuple[str, str]:
        return (str(self.project_id), self.key)


def payload_hash(spec: dict[str, Any]) -> str:
    return _encoded(spec)[1]


def _encoded(spec: dict[str, Any]) -> tuple[str, str]:
    """The document as JSON text and its payload hash, from one encoding (the text is also
    what the statement stores: jsonb normalizes key order and spacing)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return text, hashlib.sha256(text.encode()).hexdigest()


# unnest keeps the group one statement with a fixed text (one plan shape) whatever
# its size. The ORDER BY makes every group take its unique-index locks in the same order, so two
# groups holding the same keys (a client retrying on two replicas) cannot deadlock.
_SUBMIT_MANY = """
WITH v AS (
    -- binary parameters: psycopg dumps a text array in text form by escaping every
    -- element with a regular expression, a tenth of the API's CPU per submission under load
    SELECT * FROM unnest(%(op_id)b::uuid[], %(project_id)b::uuid[], %(key)b::text[],
                         %(hash)b::text[], %(spec)b::text[]::jsonb[], %(actor)b::text[])
        AS v(op_id, project_id, key, hash, spec, actor)
), ins AS (
    -- the columns copied from the document are read from it here: five fewer arrays to
    -- build and encode per group in the API (docs/performance.md)
    INSERT INTO operations (id, project_id, idempotency_key, payload_hash, name, queue, priority,
                            spec, state, state_reason, max_retries, timeout_seconds)
    SELECT coalesce(op_id, gen_random_uuid()), project_id, key, hash, spec->>'name',
           spec->>'queue', (spec->>'priority')::int, spec, 'accepted', 'submission committed',
           (spec->>'max_retries')::int, (spec->>'timeout_seconds')::int
    FROM v ORDER BY project_id, key
    ON CONFLICT (project_id, idempotency_key) DO NOTHING
    RETURNING {ops}
), ev AS (
    INSERT INTO events (operation_id, actor, kind, to_state, reason, data)
    SELECT ins.id, v.actor, 'transition', 'accepted', 'submission committed',
           jsonb_build_object('idempotency_key', ins.idempotency_key)
    FROM ins JOIN v ON v.project_id = ins.project_id AND v.key = ins.idempotency_key
), n AS (
    -- one wake-up for the reconciler per group, not per operation
    SELECT pg_notify('controlplane_work', 'submitted') WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT {ops}, (SELECT count(*) FROM n) AS notified FROM ins
"""

_EXISTING = """
SELECT {o_ops} FROM operations o
JOIN unnest(%s::uuid[], %s::text[]) AS k(project_id, key)
  ON o.project_id = k.project_id AND o.idempotency_key = k.key
"""


def _sql(template: str) -> str:
    # named columns, never `*`: expand-safe prepared statements (controlplane/store/columns.py)
    return (template.replace("{o_ops}", columns.of("operations", "o"))
            .replace("{ops}", columns.of("operations")))


def effective_key(key: str) -> str:
    if defects.enabled("idempotency-ignored"):  # seeded defect: every request is "new"
        return f"{key}#{uuid.uuid4()}"
    return key


async def submit_many(conn: AsyncConnection, items: list[SubmitItem],
                      ) -> list[SubmitResult | Exception]:
    """Commit the group (one statement = one transaction on an autocommit connection) and
    answer each item in order: a result, or the Conflict/InvalidReference it earned.

    An item whose key was already used (earlier, or by an earlier item of the same group) is
    a duplicate when its payload hash matches and a Conflict otherwise, exactly as one by one.
    A queue that does not exist fails the whole statement (foreign key): the group is then
    submitted item by item so only the offending items fail."""
    items = [SubmitItem(i.project_id, effective_key(i.key), i.spec, i.actor, i.op_id)
             for i in items]
    encoded = [_encoded(i.spec) for i in items]
    hashes = [h for _, h in encoded]
    first: dict[tuple[str, str], int] = {}
    for n, item in enumerate(items):
        first.setdefault(item.ident, n)
    leaders = sorted(set(first.values()))
    try:
        created = await _insert(conn, [items[n] for n in leaders],
                                [encoded[n] for n in leaders])
    except psycopg.errors.ForeignKeyViolation as exc:
        if len(leaders) == 1:
            raise InvalidReference(f"queue {items[leaders[0]].spec['queue']!r} does not exist",
                                   ("body", "queue")) from exc
        out: list[SubmitResult | Exception] = []
        for item in items:  # rare: an unknown queue in a group; isolate it
            try:
                out.extend(await submit_many(conn, [item]))
            except InvalidReference as one:
                out.append(one)
        return out
    missing = [items[n] for n in leaders if items[n].ident not in created]
    existing = await _existing(conn, missing) if missing else {}
    rows = {**existing, **created}
    out = []
    for n, item in enumerate(items):
        row = rows.get(item.ident)
        if row is None:  # cannot happen: ON CONFLICT means the row exists and is committed
            out.append(Conflict("idempotency key in use but operation not visible; retry"))
        elif row["payload_hash"] != hashes[n]:
            out.append(Conflict(
                f"Idempotency-Key {item.key!r} was already used for a different payload "
                f"(operation {row['id']}); use a new key for a new operation"))
        else:
            out.append(SubmitResult(row, first[item.ident] == n and item.ident in created))
    return out


async def _insert(conn: AsyncConnection, items: list[SubmitItem],
                  encoded: list[tuple[str, str]],
                  ) -> dict[tuple[str, str], dict[str, Any]]:
    params = {
        "op_id": [i.op_id for i in items], "project_id": [i.project_id for i in items],
        "key": [i.key for i in items], "hash": [h for _, h in encoded],
        "spec": [text for text, _ in encoded],  # JSON text, cast to jsonb by the statement
        "actor": [i.actor for i in items],
    }
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_sql(_SUBMIT_MANY), params)
        return {(str(r["project_id"]), r["idempotency_key"]): r for r in await cur.fetchall()}


async def _existing(conn: AsyncConnection, items: list[SubmitItem],
                    ) -> dict[tuple[str, str], dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_sql(_EXISTING), ([i.project_id for i in items], [i.key for i in items]))
        return {(str(r["project_id"]), r["idempotency_key"]): r for r in await cur.fetchall()}
